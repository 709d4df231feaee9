"""`ninelives mutants`: run every broken engine on the scenario that provokes it, and the
reference engine on the same scenarios and seeds; print and save the detection matrix.

    ninelives mutants [--seeds N|A..B] [--profile P] [--only NAME,...] [--out DIR] [--parallel K]
                      [--backend sqlite|postgres [--pg-url postgresql://...]]

Each mutant runs on the seeds (N: 1..N; A..B: A to B) in turn and stops at its first failing
run; the reference
runs every (scenario, seed) a mutant ran. Runs go `--parallel` at a time (default 2), each
a full campaign with real processes, each on a fresh database of `--backend` (on PostgreSQL,
one server started for the whole command, or --pg-url's; a new database per run; a run that
cuts the power starts a server of its own). Exit 0
when every mutant was caught by one of its expected invariants and the reference failed
nothing; 1 otherwise; 2 when the command could not run (a bad flag, a server that cannot be
had, a mutant named with --only that does not run on the backend; the whole catalog leaves
such a mutant out, saying why).

Written to DIR/<id>/: matrix.json, matrix.md, matrix.html (linking each run's report.html
when chaos.reports.render is there, with a legend), and the run folders, one folder per engine:
runs/<mutant or reference>/<scenario>/, each with its `latest` (for a mutant, the run that
caught it). DIR/latest points at the newest matrix.
"""
from __future__ import annotations

import argparse
import html
import json
import multiprocessing
import os
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterable

from rich.console import Console

from chaos.run.backends import Backend, add_backend_flags, check_backend, command_backend
from chaos.checkers import INVARIANTS
from chaos.reports.console import AUTO, Column, Progress, plural, table
from chaos.commands.flags import SEEDS_HELP, at_least, seeds, seeds_text
from chaos.reference.mutants.catalog import BY_NAME, CATALOG, Mutant
from chaos.run.supervisor import OwnedPool, evidence_in

SCHEMA = "ninelives.mutants/1"
REFERENCE = "reference"

#: Two-letter column heads for the terminal matrix, in INVARIANTS order.
SHORT = {"legal-transitions": "LT", "no-rebill-after-commit": "NR", "outbox-bounded": "OB",
         "effects-complete": "EC", "all-jobs-settle": "AS", "submissions-idempotent": "SI",
         "memo-consistent": "MC", "retry-discipline": "RD", "bounded-work": "BW",
         "lease-exclusive": "LE", "lease-kept": "LK", "deadlines-kept": "DK",
         "operator-moves": "OM",
         "fenced-writes": "FW", "cost-accounted": "CA", "db-intact": "DB",
         "processes-survive": "PS", "claims-prompt": "CP", "durable-commits": "DC"}
#: What a cell of the matrix says.
CELLS = {"X": "an expected invariant failed", "x": "another invariant failed",
         "o": "expected, but it held", ".": "neither expected nor failed"}


@dataclass(frozen=True)
class Task:
    """One campaign: an engine (a mutant's name, or "reference") on a scenario and seed."""

    engine: str
    scenario: str
    profile: str
    seed: int
    out: str
    backend: Backend = Backend()

    @property
    def spec(self) -> str:
        return REFERENCE if self.engine == REFERENCE else BY_NAME[self.engine].spec

    @property
    def folder(self) -> str:
        """Where its run folder goes: one folder per engine (`runs/<engine>/<scenario>/`),
        so that a mutant's failing run and the reference's passing run on the same scenario
        never share one, nor its `latest` link."""
        return os.path.join(self.out, self.engine)


def run_task(task: Task) -> dict[str, Any]:
    """Run one campaign (in a pool process); returns what the matrix needs of its report.

    result is "pass", "fail", "error" (the run did not exercise its scenario: exit code 2)
    or "harness-error" (it could not run at all; `error` says why).
    """
    from chaos.contract import load_engine
    from chaos.run.runner import HarnessError, run_campaign
    from chaos.spec.scenario import load_scenario
    started = time.time()
    # what the matrix keeps of the task: its backend by name (a --pg-url may hold a password)
    row: dict[str, Any] = {"engine": task.engine, "scenario": task.scenario,
                           "profile": task.profile, "seed": task.seed, "out": task.out,
                           "backend": task.backend.name, "spec": task.spec}
    try:
        scenario = load_scenario(task.scenario, task.profile)
        result = run_campaign(scenario, task.seed, load_engine(task.spec), task.folder,
                              engine_spec=task.spec, progress=False, backend=task.backend)
    except (HarnessError, ValueError, OSError) as exc:
        return {**row, "result": "harness-error", "error": f"{type(exc).__name__}: {exc}",
                "failed": [], "unknown": [], "seconds": round(time.time() - started, 2),
                "run_dir": None}
    report = result.report
    return {**row, "result": report["result"], "run_dir": result.run_dir,
            "seconds": round(report["finished"] - report["started"], 2),
            "failed": [v["name"] for v in report["verdicts"] if v["verdict"] == "fail"],
            "unknown": [v["name"] for v in report["verdicts"] if v["verdict"] == "unknown"],
            "reasons": {v["name"]: v["reason"] for v in report["verdicts"]
                        if v["verdict"] != "pass"},
            "faults_unfired": report.get("faults_unfired", [])}


@dataclass
class MutantRow:
    """What the matrix says of one mutant."""

    mutant: Mutant
    runs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def detecting(self) -> dict[str, Any] | None:
        """The first run in which an expected invariant failed."""
        return next((r for r in self.runs if caught_by(self.mutant, r)), None)

    @property
    def caught(self) -> bool:
        return self.detecting is not None

    def to_json(self) -> dict[str, Any]:
        hit = self.detecting
        return {"name": self.mutant.name, "removes": self.mutant.removes,
                "expect": list(self.mutant.expect), "scenario": self.mutant.scenario,
                "profile": self.runs[0]["profile"] if self.runs else self.mutant.profile,
                "caught": self.caught, "caught_by": caught_by(self.mutant, hit) if hit else [],
                "also_failed": [n for n in hit["failed"] if n not in self.mutant.expect]
                if hit else [],
                "seed": hit["seed"] if hit else None, "seconds": hit["seconds"] if hit else None,
                "total_seconds": round(sum(r["seconds"] for r in self.runs[
                    :self.runs.index(hit) + 1 if hit else len(self.runs)]), 2),
                "run_dir": hit["run_dir"] if hit else None, "runs": self.runs}


def caught_by(mutant: Mutant, run: dict[str, Any]) -> list[str]:
    """The mutant's expected invariants that failed in `run`."""
    return [name for name in mutant.expect if name in run["failed"]]


def run_matrix(mutants: list[Mutant], seeds: range, profile: str | None, out: str, *,
               parallel: int = 2, progress: bool = False,
               backend: Backend = Backend()) -> dict[str, Any]:
    """Run the matrix (see the module docstring) on `backend` and return matrix.json's
    content. With `progress`, a line per finished run and where the round stands, on stderr.

    Round k runs the k-th of `seeds` for every mutant not caught yet, and that seed of the
    reference on each of their scenarios; a mutant caught in round k runs no more seeds.
    """
    rows = {m.name: MutantRow(m) for m in mutants}
    reference: list[dict[str, Any]] = []
    runs_dir = os.path.join(out, "runs")
    started = time.time()
    context = multiprocessing.get_context("spawn")  # the runner uses threads: never fork it
    with evidence_in(out), OwnedPool(max(1, parallel), context) as pool:
        for seed in seeds:
            open_rows = [r for r in rows.values() if not r.caught]
            if not open_rows:
                break
            tasks = [Task(r.mutant.name, r.mutant.scenario, profile or r.mutant.profile, seed,
                          runs_dir, backend) for r in open_rows]
            scenarios = sorted({(t.scenario, t.profile) for t in tasks})
            tasks += [Task(REFERENCE, s, p, seed, runs_dir, backend) for s, p in scenarios]
            with Progress(f"seed {seed}", len(tasks), unit="runs",
                          enabled=progress) as shown:
                shown.update(0, detail=f"{plural(len(open_rows), 'mutant')} not caught yet "
                                       f"and the reference, {max(1, parallel)} at a time")
                for done, run in enumerate(pool.map(run_task, tasks), 1):
                    if run["engine"] == REFERENCE:
                        reference.append(run)
                    else:
                        rows[run["engine"]].runs.append(run)
                    shown.say(describe_run(run, rows.get(run["engine"])))
                    shown.update(done)
    mutant_rows = [rows[m.name].to_json() for m in mutants]
    clean = all(r["result"] == "pass" for r in reference)
    return {"schema": SCHEMA, "created": started, "seconds": round(time.time() - started, 1),
            "backend": backend.name, "profile": profile, "seeds": list(seeds),
            "invariants": list(INVARIANTS),
            "mutants": mutant_rows, "reference": reference,
            "caught": sum(r["caught"] for r in mutant_rows), "total": len(mutant_rows),
            "reference_clean": clean,
            "ok": clean and all(r["caught"] for r in mutant_rows)}


def describe_run(run: dict[str, Any], row: MutantRow | None) -> str:
    """One progress line for a finished run."""
    what = f"{run['engine']} on {run['scenario']} seed {run['seed']}"
    if run["result"] == "harness-error":
        return f"  {what}: could not run: {run['error']}"
    failed = ", ".join(run["failed"]) or "nothing failed"
    if row is None:
        verdict = "clean" if run["result"] == "pass" else f"FALSE ALARM ({run['result']}: {failed})"
    else:
        hit = caught_by(row.mutant, run)
        verdict = f"caught by {', '.join(hit)}" if hit else f"not caught ({failed})"
    return f"  {what}: {verdict} in {run['seconds']:.1f} s"


# -- the matrix as text ------------------------------------------------------------------------

def cell(invariant: str, expect: Iterable[str], failed: Iterable[str]) -> str:
    """X: an expected invariant failed; x: another failed; o: expected but held; .: neither."""
    expected, did = invariant in expect, invariant in failed
    return {(True, True): "X", (False, True): "x", (True, False): "o"}.get((expected, did), ".")


def render_text(matrix: dict[str, Any], console: Console | str | None = AUTO) -> str:
    """The detection matrix for the terminal (see chaos.reports.console.table for `console`), with
    its legend."""
    rows = []
    for m in matrix["mutants"]:
        run = detecting_run(m)
        cells = "  ".join(cell(i, m["expect"], run["failed"]) for i in matrix["invariants"])
        rows.append([m["name"], m["scenario"], cells, "yes" if m["caught"] else "NO",
                     m["seed"] or "-", "-" if m["seconds"] is None else f"{m['seconds']:.1f}"])
    heads = " ".join(SHORT[i] for i in matrix["invariants"])
    columns = [Column("mutant"), Column("scenario"), Column(heads), Column("caught"),
               Column("seed", "right"), Column("seconds", "right")]
    lines = [table(columns, rows, console=console), "", *legend(matrix), ""]
    lines += reference_lines(matrix)
    lines.append(f"{matrix['caught']}/{matrix['total']} mutants caught on "
                 f"{matrix.get('backend', 'sqlite')}; reference "
                 f"{'clean' if matrix['reference_clean'] else 'NOT clean'}: "
                 f"{'OK' if matrix['ok'] else 'FAILED'}")
    return "\n".join(lines)


def legend(matrix: dict[str, Any]) -> list[str]:
    """The legend of the matrix as text lines: the cells, then the column heads."""
    names = [f"{SHORT[i]} {i}" for i in matrix["invariants"]]
    return (["   ".join(f"{c} {what}" for c, what in CELLS.items())]
            + ["  ".join(names[i:i + 5]) for i in range(0, len(names), 5)])


def detecting_run(m: dict[str, Any]) -> dict[str, Any]:
    """The run a mutant's row shows: the one that caught it, else its last."""
    return next((r for r in m["runs"] if r["seed"] == m["seed"]),
                m["runs"][-1] if m["runs"] else {"failed": []})


def reference_lines(matrix: dict[str, Any]) -> list[str]:
    runs = matrix["reference"]
    lines = [f"reference engine: {len(runs)} runs, "
             f"{sum(r['result'] == 'pass' for r in runs)} passed"]
    for r in runs:
        if r["result"] != "pass":
            lines.append(f"  {r['scenario']} seed {r['seed']}: {r['result']} "
                         f"({', '.join(r['failed'] + r['unknown']) or r.get('error', '')}) "
                         f"{r['run_dir'] or ''}")
    return lines


def render_markdown(matrix: dict[str, Any]) -> str:
    """matrix.md: the matrix as a Markdown table, for a CI job summary."""
    heads = " | ".join(SHORT[i] for i in matrix["invariants"])
    lines = [f"## ninelives mutants on {matrix.get('backend', 'sqlite')}: "
             f"{matrix['caught']}/{matrix['total']} caught, reference "
             f"{'clean' if matrix['reference_clean'] else '**not clean**'}", "",
             f"| mutant | removes | scenario | {heads} | caught | seed | seconds |",
             "|---|---|---|" + "---|" * len(matrix["invariants"]) + "---|--:|--:|"]
    for m in matrix["mutants"]:
        run = detecting_run(m)
        cells = " | ".join(cell(i, m["expect"], run["failed"]) for i in matrix["invariants"])
        lines.append(f"| `{m['name']}` | {m['removes']} | `{m['scenario']}` | {cells} | "
                     f"{'yes' if m['caught'] else '**NO**'} | {m['seed'] or '-'} | "
                     f"{m['seconds'] if m['seconds'] is not None else '-'} |")
    lines += ["", " · ".join(f"{c} {what}" for c, what in CELLS.items()), "",
              " · ".join(f"{SHORT[i]} `{i}`" for i in matrix["invariants"]),
              "", "\n".join(f"- {line}" for line in reference_lines(matrix)), ""]
    return "\n".join(lines)


def render_html(matrix: dict[str, Any], out: str) -> str:
    """matrix.html: the matrix with links to each detecting run's report.html."""
    def link(run_dir: str | None, text: str) -> str:
        if not run_dir or not os.path.exists(os.path.join(run_dir, "report.html")):
            return html.escape(text)
        return f'<a href="{html.escape(os.path.relpath(run_dir, out))}/report.html">' \
               f"{html.escape(text)}</a>"

    colours = {"X": "#c7e9c0", "x": "#fdd0a2", "o": "#fcbba1", ".": "#fff"}
    heads = "".join(f'<th title="{i}">{SHORT[i]}</th>' for i in matrix["invariants"])
    body = []
    for m in matrix["mutants"]:
        run = detecting_run(m)
        cells = "".join(f'<td style="background:{colours[c]}">{c}</td>' for c in (
            cell(i, m["expect"], run["failed"]) for i in matrix["invariants"]))
        body.append(f"<tr><td><code>{m['name']}</code></td><td>{html.escape(m['removes'])}</td>"
                    f"<td>{html.escape(m['scenario'])}</td>{cells}"
                    f"<td>{link(m['run_dir'], 'yes' if m['caught'] else 'NO')}</td>"
                    f"<td>{m['seed'] or '-'}</td><td>{m['seconds'] or '-'}</td></tr>")
    refs = "".join(f"<li>{link(r['run_dir'], r['scenario'])} seed {r['seed']}: "
                   f"{html.escape(r['result'])}</li>" for r in matrix["reference"])
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>ninelives mutants</title>
<style>body{{font:14px sans-serif;margin:2em}}td,th{{border:1px solid #ccc;padding:3px 6px}}
table{{border-collapse:collapse}}td{{text-align:center}}td:nth-child(2){{text-align:left}}
.legend{{display:flex;gap:2em;align-items:flex-start}}.legend td{{text-align:left}}</style>
</head><body><h1>ninelives mutants on {html.escape(matrix.get('backend', 'sqlite'))}:
{matrix['caught']}/{matrix['total']} caught, reference
{'clean' if matrix['reference_clean'] else 'NOT clean'}</h1>
<table><tr><th>mutant</th><th>removes</th><th>scenario</th>{heads}<th>caught</th><th>seed</th>
<th>seconds</th></tr>{''.join(body)}</table>
{html_legend(matrix, colours)}
<h2>Reference engine, same scenarios and seeds</h2><ul>{refs}</ul></body></html>
"""


def html_legend(matrix: dict[str, Any], colours: dict[str, str]) -> str:
    """The page's legend: what each cell's mark and colour say, and each column head's
    invariant."""
    cells = "".join(f'<tr><td style="background:{colours[c]}">{c}</td><td>{html.escape(what)}'
                    "</td></tr>" for c, what in CELLS.items())
    heads = "".join(f"<tr><th>{SHORT[i]}</th><td><code>{html.escape(i)}</code></td></tr>"
                    for i in matrix["invariants"])
    return (f'<h2>Legend</h2><div class="legend"><table id="legend-cells">{cells}</table>'
            f'<table id="legend-heads">{heads}</table></div>')


def write_outputs(matrix: dict[str, Any], out: str) -> list[str]:
    """matrix.json, matrix.md and, when chaos.reports.render is there, matrix.html (with each
    detecting or failing run's report.html rendered beside its run)."""
    os.makedirs(out, exist_ok=True)
    paths = [os.path.join(out, "matrix.json"), os.path.join(out, "matrix.md")]
    with open(paths[0], "w", encoding="utf-8") as fh:
        json.dump(matrix, fh, indent=2, sort_keys=True)
    with open(paths[1], "w", encoding="utf-8") as fh:
        fh.write(render_markdown(matrix))
    try:
        from chaos.reports.render import render_run
    except ImportError:
        return paths
    shown = [m["run_dir"] for m in matrix["mutants"]] + [
        r["run_dir"] for r in matrix["reference"] if r["result"] != "pass"]
    for run_dir in filter(None, shown):
        try:
            render_run(run_dir, ("html",))
        except Exception as exc:  # a report that cannot render must not lose the matrix
            print(f"warning: could not render {run_dir}: {exc}", file=sys.stderr)
    paths.append(os.path.join(out, "matrix.html"))
    with open(paths[2], "w", encoding="utf-8") as fh:
        fh.write(render_html(matrix, out))
    return paths


def point_latest(folder: str) -> None:
    """`latest` beside `folder` points at it: the newest matrix. (Each engine's own
    `runs/<engine>/<scenario>/latest` points at its last run there: a mutant's is the run
    that caught it, the matrix stopping at the first.)"""
    latest = os.path.join(os.path.dirname(folder), "latest")
    try:
        if os.path.islink(latest):
            os.unlink(latest)
        os.symlink(os.path.basename(folder), latest)
    except OSError:
        pass  # a concurrent matrix took the link; the folder is what counts


# -- the command ---------------------------------------------------------------------------------

def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("mutants", help="run the broken engines and print the detection matrix")
    p.add_argument("--seeds", type=seeds, default="1",
                   help=f"the seeds each mutant tries in turn: {SEEDS_HELP} (default 1)")
    p.add_argument("--profile", default=None, help="profile for every run (default: each "
                   "mutant's own, smoke)")
    p.add_argument("--only", default=None, help="comma-separated mutant names")
    p.add_argument("--out", default=os.path.join("reports", "mutants"),
                   help="where the matrix folder goes (default reports/mutants)")
    p.add_argument("--parallel", type=at_least(1), default=2,
                   help="campaigns at a time (default 2)")
    add_backend_flags(p, "every run (on postgres, one server for the whole command)")


def select(only: str | None) -> list[Mutant]:
    """The catalog, or the named mutants; ValueError naming an unknown one."""
    if not only:
        return list(CATALOG)
    names = [n.strip() for n in only.split(",") if n.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown or not names:
        raise ValueError(f"--only: unknown mutant {', '.join(unknown) or '(none)'}; known: "
                         f"{', '.join(m.name for m in CATALOG)}")
    return [BY_NAME[n] for n in names]


def on_backend(mutants: list[Mutant], backend: Backend, named: bool) -> list[Mutant]:
    """The mutants to run on `backend`. One that does not run there (its mechanism is another
    backend's) is refused with BackendError where it was `named` (--only), never counted
    missed; from the whole catalog it is left out, saying why on stderr."""
    from chaos.contract import load_engine
    kept = []
    for mutant in mutants:
        engine = load_engine(mutant.spec)
        if not named and backend.name not in engine.backends:
            print(f"ninelives mutants: {mutant.name} left out on {backend.name}: "
                  f"{engine.backend_note}", file=sys.stderr)
            continue
        check_backend(engine, backend)
        kept.append(mutant)
    return kept


def cmd_mutants(args: argparse.Namespace) -> int:
    backend = Backend(args.backend, args.pg_url)  # BackendError (exit 2) names the flag
    mutants = on_backend(select(args.only), backend, named=bool(args.only))
    out = os.path.join(args.out, datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ"))
    with command_backend(backend) as shared:  # a server had before the matrix's folder
        print(f"ninelives mutants: {len(mutants)} mutants on {backend.name}, seeds "
              f"{seeds_text(args.seeds)}, profile {args.profile or 'per mutant'}, "
              f"{args.parallel} at a time -> {out}", file=sys.stderr, flush=True)
        matrix = run_matrix(mutants, args.seeds, args.profile, out, parallel=args.parallel,
                            progress=True,
                            backend=shared)
    matrix["id"] = os.path.basename(out)
    paths = write_outputs(matrix, out)
    point_latest(out)
    print(render_text(matrix))
    print(f"matrix: {', '.join(paths)}")
    return 0 if matrix["ok"] else 1
