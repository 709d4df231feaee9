"""The mutation score of the harness: how many one-line bugs in the reference engine's safety
code it catches, measured with cosmic-ray, the harness itself as the test suite.

    ninelives score [--modules engine/retry.py,...] [--seeds 2] [--run] [--workdir DIR]

Why cosmic-ray: it applies each mutation to the module's file on disk, so every process the
harness starts (real workers and senders under `--run`, not only the simulation in the
harness's own process) imports the mutated engine. A tool that switches mutants inside one
Python process would leave the real-process campaigns testing the unmutated engine.

How: the repository's engine, harness and scenarios are copied into a work folder (nothing in
the checkout is ever mutated); cosmic-ray mutates the copy one mutant at a time and runs
`python -m chaos.score kill` there, which runs the simulation over every scenario for
`--seeds` seeds (smoke profile) and stops at the first failed invariant (the mutant is
killed, exit 1); with `--run` a mutant the simulation missed then meets real processes
(`ninelives run` of the scenarios in RUN_SCENARIOS). Operators that only make noise on this
code (bitwise and shift operators, powers, floor division and modulo in place of arithmetic)
are filtered out. Mutants listed in `mutation/equivalent.toml`, each with the reason it
cannot change behaviour, are left out of the score; the report lists every survivor with its
diff, so that each is either caught by a stronger check or argued equivalent there.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections import Counter, defaultdict
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: The engine's safety code, the modules the issue names.
MODULES = ("engine/store/sqlite.py", "engine/worker.py", "engine/outbox.py", "engine/retry.py",
           "engine/http.py", "engine/store/operator.py")
#: Every scenario a user runs, in the order that kills most mutants soonest.
SIM_SCENARIOS = ("smoke", "kill-storm", "provider-outage", "lost-lease", "outbox-ambiguous",
                 "operator-actions", "crash-loop", "poison", "duplicate-submit", "db-contention",
                 "everything")
RUN_SCENARIOS = ("smoke", "everything")
EXCLUDED_OPERATORS = (
    r"core/ReplaceBinaryOperator_.*_(BitOr|BitAnd|BitXor|LShift|RShift|Pow|FloorDiv|Mod)$",
    r"core/ReplaceBinaryOperator_(BitOr|BitAnd|BitXor|LShift|RShift|Pow|FloorDiv|Mod)_.*",
)
EQUIVALENT = os.path.join(ROOT, "mutation", "equivalent.toml")
TARGET = 0.90
#: The copy cosmic-ray mutates: what the harness needs to run an engine, nothing else.
COPIED = ("engine", "chaos", "scenarios", "examples", "pyproject.toml")


# -- the test command: is this mutant caught? ------------------------------------------------

def kill(seeds: int, run: bool, out: str) -> int:
    """Exit 1 when any invariant fails for the engine as it is on disk now (the mutant is
    killed), 0 when every scenario passed. Prints which scenario and seed caught it."""
    from .scenario import load_scenario
    from .sim import SeededChoices, SimSpec, simulate
    from .supervisor import die_with_parent
    die_with_parent()  # a mutant's test ends with the campaign that started it
    for name in SIM_SCENARIOS:
        scenario = load_scenario(name, "smoke")
        for seed in range(1, seeds + 1):
            result = simulate(SimSpec(scenario, seed), SeededChoices(seed))
            if result.failed or result.errors:
                why = [v.name for v in result.failed] or ["a thread raised"]
                print(f"killed: sim {name} seed {seed}: {', '.join(why)}")
                return 1
    if run:
        for name in RUN_SCENARIOS:
            done = subprocess.run([sys.executable, "-m", "chaos.cli", "run", name, "--profile",
                                   "smoke", "--seed", "1", "--out", out, "--quiet"],
                                  capture_output=True, text=True)
            if done.returncode == 1:
                print(f"killed: run {name} seed 1")
                return 1
    print("survived")
    return 0


# -- the campaign -----------------------------------------------------------------------------

def prepare(workdir: str, modules: list[str], seeds: int, run: bool, timeout: float) -> str:
    """Copy the checkout into `workdir` and write cosmic-ray's configuration there."""
    for name in COPIED:
        src, dst = os.path.join(ROOT, name), os.path.join(workdir, name)
        if os.path.isdir(src):
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, dst)
    command = f"{sys.executable} -m chaos.score kill --seeds {seeds}" + (" --run" if run else "")
    config = os.path.join(workdir, "cosmic-ray.toml")
    with open(config, "w", encoding="utf-8") as fh:
        fh.write("[cosmic-ray]\n"
                 f"module-path = {json.dumps(modules)}\n"
                 f"timeout = {timeout}\nexcluded-modules = []\n"
                 f"test-command = {json.dumps(command)}\n\n"
                 "[cosmic-ray.distributor]\nname = \"local\"\n\n"
                 "[cosmic-ray.filters.operators-filter]\n"
                 f"exclude-operators = {json.dumps(list(EXCLUDED_OPERATORS))}\n")
    return config


def campaign(workdir: str, modules: list[str], seeds: int, run: bool, timeout: float,
             fresh: bool) -> str:
    """Initialise (unless resuming), filter and execute the session; returns its path."""
    from .supervisor import die_with_parent
    tools = os.path.dirname(sys.executable)
    session = os.path.join(workdir, "session.sqlite")
    env = {**os.environ, "PYTHONPATH": workdir}  # the copy's engine, in every process
    steps = []
    if fresh:
        config = prepare(workdir, modules, seeds, run, timeout)
        steps += [[os.path.join(tools, "cosmic-ray"), "init", config, session],
                  [os.path.join(tools, "cr-filter-operators"), session, config]]
    config = os.path.join(workdir, "cosmic-ray.toml")
    steps.append([os.path.join(tools, "cosmic-ray"), "exec", config, session])
    for argv in steps:
        # cosmic-ray dies with this command, and each mutant's test with cosmic-ray.
        subprocess.run(argv, cwd=workdir, env=env, check=True, preexec_fn=die_with_parent)
    return session


# -- the report -------------------------------------------------------------------------------

def equivalents(path: str = EQUIVALENT) -> dict[tuple[str, str, int], str]:
    """(module, operator, occurrence) -> why that mutant cannot change behaviour."""
    if not os.path.exists(path):
        return {}
    with open(path, "rb") as fh:
        data = tomllib.load(fh)
    return {(e["module"], e["operator"], int(e["occurrence"])): e["reason"]
            for e in data.get("equivalent", [])}


def results(session: str) -> list[dict[str, Any]]:
    """One dict per mutant of the session: module, operator, occurrence, line, outcome
    ("killed" | "survived" | "timeout" | "incompetent" | "pending" | "filtered"), diff,
    output. Filtered mutants (operators left out) are not returned."""
    dump = subprocess.run([os.path.join(os.path.dirname(sys.executable), "cosmic-ray"), "dump",
                           session], capture_output=True, text=True, check=True)
    rows = []
    for line in dump.stdout.splitlines():
        item, result = json.loads(line)
        mutation = item["mutations"][0]
        rows.append({"module": mutation["module_path"], "operator": mutation["operator_name"],
                     "occurrence": mutation["occurrence"],
                     "line": mutation.get("start_pos", [None])[0],
                     "outcome": _outcome(result), "diff": (result or {}).get("diff") or "",
                     "output": ((result or {}).get("output") or "").strip()[-300:]})
    return [r for r in rows if r["outcome"] != "filtered"]


def _outcome(result: dict | None) -> str:
    if result is None:
        return "pending"
    status, outcome = result.get("worker_outcome"), result.get("test_outcome")
    if status == "skipped":
        return "filtered"  # an operator the configuration leaves out
    if status == "timeout" or outcome == "timeout":
        return "timeout"
    if status != "normal":
        return "incompetent"  # the mutation could not be applied or run
    return "killed" if outcome == "killed" else "survived"


def summarize(rows: list[dict[str, Any]], known: dict[tuple[str, str, int], str]) -> dict:
    """Counts per module and per operator, the score, and the survivors."""
    for row in rows:
        key = (row["module"], row["operator"], row["occurrence"])
        if row["outcome"] == "survived" and key in known:
            row["outcome"], row["reason"] = "equivalent", known[key]
    by_module: dict[str, Counter] = defaultdict(Counter)
    by_operator: dict[str, Counter] = defaultdict(Counter)
    for row in rows:
        by_module[row["module"]][row["outcome"]] += 1
        by_operator[row["operator"].split("/")[-1].split("_")[0]][row["outcome"]] += 1
    total = Counter(row["outcome"] for row in rows)
    judged = total["killed"] + total["survived"] + total["timeout"]
    # A mutant that hangs the engine past the timeout is caught: the run could not finish.
    score = (total["killed"] + total["timeout"]) / judged if judged else None
    return {"total": dict(total), "score": score, "by_module": by_module,
            "by_operator": by_operator,
            "survivors": [r for r in rows if r["outcome"] == "survived"],
            "equivalent": [r for r in rows if r["outcome"] == "equivalent"]}


def print_report(summary: dict, session: str) -> None:
    columns = ("killed", "survived", "equivalent", "timeout", "incompetent", "pending")

    def table(title: str, groups: dict[str, Counter]) -> None:
        width = max([len(title)] + [len(k) for k in groups])
        print(f"{title:<{width}}  " + "  ".join(f"{c:>11}" for c in columns) + "  score")
        for name, counts in sorted(groups.items()):
            judged = counts["killed"] + counts["survived"] + counts["timeout"]
            score = f"{(counts['killed'] + counts['timeout']) / judged:.1%}" if judged else "-"
            print(f"{name:<{width}}  " + "  ".join(f"{counts[c]:>11}" for c in columns)
                  + f"  {score}")

    table("module", summary["by_module"])
    print()
    table("operator", summary["by_operator"])
    print()
    for row in summary["survivors"]:
        print(f"survived: {row['module']}:{row['line']} {row['operator']} "
              f"(occurrence {row['occurrence']})")
        print("  " + "\n  ".join(row["diff"].splitlines()[2:]))
    score = summary["score"]
    verdict = "-" if score is None else f"{score:.1%}"
    met = score is not None and score >= TARGET
    print(f"\nmutation score: {verdict} of {summary['total']} non-equivalent mutants judged "
          f"({'meets' if met else 'misses'} the {TARGET:.0%} target); session {session}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ninelives score", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    k = sub.add_parser("kill", help="(the test command cosmic-ray runs in its work folder)")
    k.add_argument("--seeds", type=int, default=2)
    k.add_argument("--run", action="store_true")
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.command == "kill":
        with tempfile.TemporaryDirectory(prefix="ninelives-kill-") as out:
            return kill(args.seeds, args.run, out)
    return score(args)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--modules", default=",".join(MODULES),
                        help="comma-separated engine files to mutate (default: the safety code)")
    parser.add_argument("--seeds", type=int, default=2, help="sim seeds per scenario")
    parser.add_argument("--run", action="store_true",
                        help="also run real processes for mutants the simulation missed")
    parser.add_argument("--timeout", type=float, default=300.0,
                        help="seconds per mutant before it counts as caught by a timeout")
    parser.add_argument("--workdir", help="a work folder to use, or to resume if it has a session")


def score(args: argparse.Namespace) -> int:
    """Run (or resume) a campaign and print its report; exit 0 when the score meets TARGET."""
    if args.seeds < 1 or args.timeout <= 0:
        print("error: --seeds must be at least 1 and --timeout positive", file=sys.stderr)
        return 2
    modules = [m.strip() for m in args.modules.split(",") if m.strip()]
    missing = [m for m in modules if not os.path.isfile(os.path.join(ROOT, m))]
    if missing:
        print(f"error: --modules names files that do not exist: {', '.join(missing)}",
              file=sys.stderr)
        return 2
    if shutil.which("cosmic-ray", path=os.path.dirname(sys.executable)) is None:
        print("error: cosmic-ray is not installed in this environment (make test installs it)",
              file=sys.stderr)
        return 2
    workdir = args.workdir or tempfile.mkdtemp(prefix="ninelives-score-")
    os.makedirs(workdir, exist_ok=True)
    fresh = not os.path.exists(os.path.join(workdir, "session.sqlite"))
    started = time.perf_counter()
    print(f"mutation campaign in {workdir} ({'new' if fresh else 'resumed'}): "
          f"{', '.join(modules)}; sim seeds {args.seeds}{', then real runs' if args.run else ''}",
          flush=True)
    session = campaign(workdir, modules, args.seeds, args.run, args.timeout, fresh)
    summary = summarize(results(session), equivalents())
    print_report(summary, session)
    print(f"took {time.perf_counter() - started:.0f} s")
    return 0 if summary["score"] is not None and summary["score"] >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())
