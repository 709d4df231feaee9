"""`ninelives sweep`: the lease trade-off measured for a given provider latency.

A lease shorter than a call (with no heartbeat) lets a second worker pay for the same step;
a lease longer than needed makes a crashed worker's job wait. The sweep runs the same
scenario, seeds and plan in every cell of a grid (lease length x heartbeat on/off), so cells
differ only by the swept setting, and recommends the shortest lease with no duplicate spend.
"""
from __future__ import annotations

import dataclasses
import json
import math
import multiprocessing as mp
import os
from datetime import datetime, timezone
from typing import Any

from rich.console import Console

from chaos.run.backends import Backend
from chaos.reports.console import AUTO, Column, Progress
from chaos.reports.console import table as table_of
from chaos.contract import load_engine
from chaos.commands.flags import seeds_text
from chaos.checkers.ops import is_job, takes_lease
from chaos.history import Event, of, read_history
from chaos.spec.latency import parse_latency
from chaos.run.runner import run_campaign
from chaos.spec.scenario import Scenario
from chaos.run.supervisor import OwnedPool, evidence_in
from chaos.reports.sweep_plot import line_chart

LOST_LEASE = "lost-lease"  # the waste cause (cost-accounted) that is duplicate spend


@dataclasses.dataclass(frozen=True)
class Cell:
    lease: float
    heartbeat: bool

    @property
    def label(self) -> str:
        return f"lease {self.lease:g} s, heartbeat {'on' if self.heartbeat else 'off'}"


def cell_scenario(base: Scenario, cell: Cell, latency: str | None) -> Scenario:
    """The scenario of one cell: the swept settings, a call timeout the latency fits in, and
    duplicate spend measured rather than judged."""
    faults = dataclasses.replace(base.faults, latency=latency or base.faults.latency
                                 or "fixed:1.0")
    p99 = parse_latency(faults.latency).p99
    engine = {**base.engine, "lease": cell.lease, "heartbeat": cell.heartbeat,
              "call_timeout": max(float(base.engine.get("call_timeout", 1.0)), p99 * 1.5 + 0.2),
              "heartbeat_interval": 0.0}
    engine["unsafe_long_calls"] = not cell.heartbeat and engine["call_timeout"] >= cell.lease
    return dataclasses.replace(base, engine=engine, faults=faults, expect=dataclasses.replace(
        base.expect, duplicate_spend_allowance=math.inf))


def recovery_times(events: list[Event]) -> list[float]:
    """Seconds from each kill of a worker to the next progress of a job it held: a job is
    held from a worker's claim until it leaves the step (or someone else takes its lease)."""
    owner: dict[str, tuple[str, int | None] | None] = {}
    waiting: dict[str, tuple[float, str]] = {}
    pid_of_name = {e["name"]: e["pid"] for e in of(events, "process", "spawn")}
    times = []
    for e in events:
        if e["src"] == "nemesis" and e["type"] == "kill":
            pid = e.get("pid") or pid_of_name.get(e.get("target"))
            for job, held in owner.items():
                if held and held[1] is not None and held[1] == pid:
                    waiting[job] = (e["t"], held[0])
        elif is_job(e):
            job = e["job"]
            if job in waiting and e.get("worker") != waiting[job][1]:
                times.append(e["t"] - waiting.pop(job)[0])
            if e["type"] == "claimed":
                owner[job] = (e.get("worker"), e.get("pid"))
            elif takes_lease(e) or e["type"] != "state" or e.get("from") != e.get("to"):
                owner[job] = None  # it left the step, or is no worker's to wait for
    return times


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def measure(result_dir: str, report: dict) -> dict[str, Any]:
    """One campaign's figures for the sweep table."""
    events = read_history(os.path.join(result_dir, "history.jsonl"))
    verdicts = {v["name"]: v for v in report["verdicts"]}
    cost = verdicts["cost-accounted"]["metrics"]
    m = report["metrics"]
    settled = set(report_states_done(report))
    return {
        "run_dir": result_dir,
        "duplicate_calls": cost.get("calls_by_cause", {}).get(LOST_LEASE, 0),
        "duplicate_spend": cost.get("waste_by_cause", {}).get(LOST_LEASE, 0.0),
        "crash_waste": cost.get("waste_by_cause", {}).get("crash-before-commit", 0.0),
        "recovery": recovery_times(events),
        "delivered": m["states"].get("delivered", 0),
        "seconds": m["run_seconds"],
        "stuck": sum(n for s, n in m["states"].items() if s not in settled),
        "verdicts": {name: v["verdict"] for name, v in verdicts.items()},
    }


def report_states_done(report: dict) -> list[str]:
    from chaos.reference import REFERENCE
    return sorted(REFERENCE.pipeline.terminal | REFERENCE.pipeline.parked_states)


def _run_cell(args: tuple) -> tuple[Cell, int, dict]:
    scenario, cell, seed, engine_spec, out, backend = args
    result = run_campaign(scenario, seed, load_engine(engine_spec), out,
                          engine_spec=engine_spec, progress=False, backend=backend)
    return cell, seed, measure(result.run_dir, result.report)


def summarize(cell: Cell, runs: list[dict]) -> dict[str, Any]:
    recovery = [t for r in runs for t in r["recovery"]]
    seconds = sum(r["seconds"] for r in runs)
    failing = sorted({n for r in runs for n, v in r["verdicts"].items() if v == "fail"})
    return {
        "lease": cell.lease, "heartbeat": cell.heartbeat,
        "duplicate_calls": sum(r["duplicate_calls"] for r in runs),
        "duplicate_spend": round(sum(r["duplicate_spend"] for r in runs), 9),
        "crash_waste": round(sum(r["crash_waste"] for r in runs), 9),
        "recovery_p50": percentile(recovery, 0.5), "recovery_p99": percentile(recovery, 0.99),
        "recoveries": len(recovery),
        "throughput": round(sum(r["delivered"] for r in runs) / seconds, 2) if seconds else 0,
        "stuck": sum(r["stuck"] for r in runs), "failing_invariants": failing,
        "runs": [r["run_dir"] for r in runs],
    }


def recommend(rows: list[dict[str, Any]], latency: str) -> dict[str, Any]:
    """Per heartbeat setting, the shortest lease with no duplicate spend and every invariant
    holding, and the recovery time it costs. Without heartbeat, a lease below the latency's
    p99 is flagged: no duplicate was seen, but the tail makes one possible."""
    out = {}
    for heartbeat in (True, False):
        safe = sorted((r for r in rows if r["heartbeat"] == heartbeat
                       and r["duplicate_spend"] == 0 and not r["failing_invariants"]),
                      key=lambda r: r["lease"])
        key = "heartbeat_on" if heartbeat else "heartbeat_off"
        if not any(r["heartbeat"] == heartbeat for r in rows):
            continue
        if safe:
            best = safe[0]
            text = (f"heartbeat {'on' if heartbeat else 'off'}: lease {best['lease']:g} s is the "
                    f"shortest with no duplicate spend at latency {latency}; a crashed worker's "
                    f"job then waits {_secs(best['recovery_p50'])} (p50), "
                    f"{_secs(best['recovery_p99'])} (p99)")
            p99 = _p99(latency)
            if not heartbeat and p99 is not None and best["lease"] <= p99:
                text += (f". Caution: it is below the latency's p99 ({p99:.2f} s); a call in the "
                         "tail can outlive it, so more seeds may show duplicates")
            out[key] = {"lease": best["lease"], "recovery_p50": best["recovery_p50"],
                        "recovery_p99": best["recovery_p99"], "text": text}
        else:
            out[key] = {"lease": None, "text": f"heartbeat {'on' if heartbeat else 'off'}: no "
                        f"lease tried avoids duplicate spend at latency {latency}; try longer"}
    return out


def _p99(latency: str) -> float | None:
    try:
        return parse_latency(latency).p99
    except ValueError:
        return None


def _secs(value: float | None) -> str:
    return "n/a (no kill hit a held job)" if value is None else f"{value:.2f} s"


def run_sweep(base: Scenario, leases: list[float], heartbeats: list[bool], latency: str | None,
              seeds: range, engine_spec: str, out: str, jobs: int | None = None, *,
              backend: Backend = Backend()) -> dict:
    """Run the grid, every cell on each of `seeds` (in parallel up to the cores), each run on
    a fresh database of `backend`, and write sweep.json, the plot, the page. Raises
    ValueError when there is no cell or seed."""
    if not (leases and heartbeats and len(seeds)):
        raise ValueError("a sweep needs a lease, a heartbeat setting and a seed")
    sweep_id = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    folder = os.path.join(out, "sweeps", sweep_id)
    os.makedirs(folder)
    cells = [Cell(lease, hb) for hb in heartbeats for lease in leases]
    tasks = [(cell_scenario(base, cell, latency), cell, seed, engine_spec,
              os.path.join(folder, "runs", f"lease{cell.lease:g}-hb{int(cell.heartbeat)}"),
              backend) for cell in cells for seed in seeds]
    workers = jobs or max(1, min(os.cpu_count() or 1, len(tasks)))
    results: dict[Cell, list[dict]] = {cell: [] for cell in cells}
    with evidence_in(folder), OwnedPool(workers, mp.get_context("fork")) as pool:
        finished = pool.map(_run_cell, tasks)  # forks every worker: before the line's thread
        with Progress("sweep", len(tasks), unit="runs") as shown:
            shown.update(0, detail=f"{min(workers, len(tasks))} at a time")
            for done, (cell, seed, figures) in enumerate(finished, 1):
                results[cell].append(figures)
                shown.say(f"  [{done}/{len(tasks)}] {cell.label}, seed {seed}: duplicate "
                          f"spend {figures['duplicate_spend']:.6f}")
                shown.update(done)
    rows = [summarize(cell, results[cell]) for cell in cells]
    used = tasks[0][0].faults.latency
    sweep = {"schema": "ninelives.sweep/1", "id": sweep_id, "scenario": base.name,
             "profile": base.profile, "latency": used, "seeds": list(seeds), "engine": engine_spec,
             "backend": backend.name,
             "cells": rows, "recommendation": recommend(rows, used)}
    with open(os.path.join(folder, "sweep.json"), "w", encoding="utf-8") as fh:
        json.dump(sweep, fh, indent=2, sort_keys=True)
    svg = plot(sweep)
    with open(os.path.join(folder, "sweep.svg"), "w", encoding="utf-8") as fh:
        fh.write(svg)
    with open(os.path.join(folder, "sweep.html"), "w", encoding="utf-8") as fh:
        fh.write(page(sweep, svg))
    sweep["folder"] = folder
    return sweep


def plot(sweep: dict) -> str:
    """Duplicate spend and recovery time against lease length, a line per heartbeat setting."""
    series_spend, series_recovery = {}, {}
    for row in sweep["cells"]:
        name = f"heartbeat {'on' if row['heartbeat'] else 'off'}"
        series_spend.setdefault(name, []).append((row["lease"], row["duplicate_spend"]))
        if row["recovery_p50"] is not None:
            series_recovery.setdefault(name, []).append((row["lease"], row["recovery_p50"]))
    left = line_chart(series_spend, "duplicate spend (billed twice)", "lease (s)", x0=0)
    right = line_chart(series_recovery, "recovery after a kill, p50 (s)", "lease (s)", x0=420)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="840" height="300" '
            f'font-family="sans-serif" font-size="12">{left}{right}</svg>')


SWEEP_COLUMNS = tuple(Column(head, "right") for head in (
    "lease", "heartbeat", "dup calls", "dup spend", "recovery p50", "p99", "jobs/s",
    "stuck")) + (Column("invariants", wraps=True),)


def table(sweep: dict, console: Console | str | None = AUTO) -> str:
    """The grid as a table (see chaos.reports.console.table for `console`)."""
    rows = []
    for r in sweep["cells"]:
        p50 = "-" if r["recovery_p50"] is None else f"{r['recovery_p50']:.2f}"
        p99 = "-" if r["recovery_p99"] is None else f"{r['recovery_p99']:.2f}"
        verdict = "all pass" if not r["failing_invariants"] else "FAIL " + ", ".join(
            r["failing_invariants"])
        rows.append([f"{r['lease']:g}", "on" if r["heartbeat"] else "off",
                     r["duplicate_calls"], f"{r['duplicate_spend']:.6f}", p50, p99,
                     r["throughput"], r["stuck"], verdict])
    return table_of(SWEEP_COLUMNS, rows, console=console)


def page(sweep: dict, svg: str) -> str:
    """A self-contained HTML page: the plot, the table and the recommendation."""
    from html import escape
    recs = "".join(f"<li>{escape(r['text'])}</li>" for r in sweep["recommendation"].values())
    return (f"<!doctype html><meta charset='utf-8'><title>lease sweep {escape(sweep['id'])}"
            f"</title><style>body{{font-family:sans-serif;margin:2em;max-width:60em}}"
            f"pre{{background:#f4f4f4;padding:1em}}</style>"
            f"<h1>Lease sweep: {escape(sweep['scenario'])}</h1>"
            f"<p>latency {escape(sweep['latency'])}, seeds {seeds_text(sweep['seeds'])} in every "
            f"cell, "
            f"profile {escape(sweep['profile'])}, engine {escape(sweep['engine'])}, backend "
            f"{escape(sweep.get('backend', 'sqlite'))}</p>"
            f"<h2>Recommendation</h2><ul>{recs}</ul>{svg}"
            f"<h2>Grid</h2><pre>{escape(table(sweep, console=None))}</pre>")
