"""report.json: the canonical, versioned record of a run, and the verdict table on the terminal.

Exit codes (`exit_code_for`): 0 every invariant with evidence holds, 1 an invariant failed, 2
the harness could not run or judge the scenario as written (a fault that never fired, a
checker that crashed, no invariant with evidence at all; with --require-exercised, an
invariant that passed without reaching any of its dangerous situations, see
chaos.situations). An `unknown` verdict beside others says why it has no evidence and does
not change the exit code.
"""
from __future__ import annotations

import os
import platform
import shlex
import sqlite3
import time
from collections import Counter
from typing import Any, Iterable

from chaos.spec.aim import aim_section
from chaos.run.backends import STARTED
from chaos.checkers import Verdict
from chaos.checkers.cuts import cut_metrics, kill_cuts, with_jobs_lost
from chaos.reports.fired import (crash_point_names, crashpoint_coverage, not_applicable, prevented,
                                 unfired)
from chaos.history import Event, of
from chaos.spec.plan import FaultPlan
from chaos.reports.progress import progress_latency
from chaos.run.runfiles import scenario_record, write_json
from chaos.spec.limits import shown
from chaos.spec.scenario import Scenario, engine_set_args

REPORT_SCHEMA = "ninelives.report/1"
VERSION = "0.1.0"


#: kills listed one by one in report.json (the metrics count them all)
MAX_KILL_ROWS = 500


def kill_rows(events: list[Event], snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    """Each kill of a worker process, the steps it cut and the jobs it lost (never settled,
    their last holder the process it killed) (chaos.checkers.cuts): a process that runs
    several jobs at once loses them all in one death. The first MAX_KILL_ROWS."""
    pipeline = snapshot.get("pipeline")
    if not events or not pipeline:
        return []
    t0 = events[0]["t"]
    cuts = kill_cuts(events, pipeline)
    if snapshot.get("jobs") is not None:
        cuts = with_jobs_lost(cuts, events, snapshot)
    return [{**cut, "at": round(cut["t"] - t0, 3)} for cut in cuts][:MAX_KILL_ROWS]


def metrics(scenario: Scenario, events: list[Event], snapshot: dict[str, Any],
            applied: dict[str, int]) -> dict[str, Any]:
    phases = snapshot["phases"]
    chaos = max(phases["heal_start"] - phases["chaos_start"], 1e-9)
    states = Counter(j["state"] for j in snapshot["jobs"].values())
    done = set(snapshot["pipeline"]["terminal"])  # a job that reached a terminal state
    kills = applied.get("kill", 0) + applied.get("crash_point", 0) + applied.get("crash_loop", 0)
    billed = sum(e.get("billed") or 0.0 for e in of(events, "provider", "call"))
    committed = sum(m.get("cost") or 0.0 for m in snapshot["memos"])
    total = phases["drain_end"] - phases["chaos_start"]
    return {
        "jobs": len(snapshot["jobs"]), "states": dict(sorted(states.items())),
        "kills": kills, "kills_per_minute": round(kills / chaos * 60, 1),
        "chaos_seconds": round(chaos, 2), "run_seconds": round(total, 2),
        "settle_seconds": round(phases["drain_end"] - phases["drain_start"], 2),
        "drained": phases.get("drained", False),
        "finished_per_second": round(sum(n for s, n in states.items() if s in done)
                                     / max(total, 1e-9), 1),
        "provider_calls": sum(1 for _ in of(events, "provider", "call")),
        "receiver_requests": sum(1 for _ in of(events, "receiver", "request")),
        "billed": round(billed, 6), "committed": round(committed, 6),
        "wasted": round(billed - committed, 6),
        "processes_spawned": sum(1 for _ in of(events, "process", "spawn")),
        "history_events": len(events),
        "progress_latency": progress_latency(events),
        # steps cut and jobs lost per kill: with job slots one death cuts every job its
        # process held; an engine that recovers nothing loses each for good
        "kill_cuts": cut_metrics(with_jobs_lost(kill_cuts(events, snapshot["pipeline"]),
                                                events, snapshot),
                                 events[0]["t"] if events else 0.0),
    }


def gathered(events: list[Event], snapshot: dict[str, Any]) -> dict[str, Any]:
    """What a run killed before its checks gathered (it has no `metrics`: those need its
    phases' ends): events, provider calls and what they billed, receiver requests, jobs
    submitted and their states, processes spawned and killed, so far."""
    states = Counter(str(j.get("state")) for j in (snapshot.get("jobs") or {}).values())
    return {
        "history_events": len(events),
        "provider_calls": sum(1 for _ in of(events, "provider", "call")),
        "billed": round(sum(e.get("billed") or 0.0 for e in of(events, "provider", "call")), 6),
        "receiver_requests": sum(1 for _ in of(events, "receiver", "request")),
        "jobs": len(snapshot.get("submitted") or snapshot.get("jobs") or ()),
        "states": dict(sorted(states.items())),
        "processes_spawned": sum(1 for _ in of(events, "process", "spawn")),
        "kills": sum(1 for _ in of(events, "nemesis", "kill")),
    }


def gathered_text(found: dict[str, Any]) -> str:
    """`gathered` in words: "1,234 events, 56 provider calls (billed 0.41), ... so far"."""
    return (f"{found['history_events']:,} events, {found['provider_calls']:,} provider calls "
            f"(billed {found['billed']}), {found['receiver_requests']:,} receiver requests, "
            f"{found['jobs']:,} jobs, {found['kills']:,} kills so far")


def replay_command(run_dir: str) -> str:
    return f"ninelives replay {shlex.quote(run_dir)}"


def run_command(scenario: Scenario, seed: int, engine_spec: str | None,
                database: dict | None = None) -> str:
    """The command that reruns this scenario and seed (on the same backend; a --pg-url
    shown without its password)."""
    parts = ["ninelives", "run", shown(scenario.path), "--seed", str(seed),
             "--profile", scenario.profile]
    if engine_spec and engine_spec != "reference":
        parts += ["--engine", engine_spec]
    parts += engine_set_args(scenario.engine_set)
    if database and database.get("backend", "sqlite") != "sqlite":
        parts += ["--backend", database["backend"]]
        if database.get("server") not in (None, *STARTED):  # not one started for it
            parts += ["--pg-url", database["server"]]
    return " ".join(shlex.quote(p) for p in parts)


def exit_code_for(verdicts: Iterable[dict], unfired: Iterable[str] = ()) -> int:
    """The exit code of a run's verdicts (as in report.json): 1 when any invariant failed;
    else 2 when a configured fault never fired (`unfired`), a checker crashed, or no
    invariant had evidence (every verdict unknown: a check that examined nothing is no
    pass); else 0. Some unknown verdicts beside passes do not change it."""
    verdicts = list(verdicts)
    if any(v["verdict"] == "fail" for v in verdicts):
        return 1
    crashed = any("traceback" in (v.get("metrics") or {}) for v in verdicts)
    if list(unfired) or crashed or all(v["verdict"] == "unknown" for v in verdicts):
        return 2
    return 0


RESULTS = {0: "pass", 1: "fail", 2: "error"}


def start_record(scenario: Scenario, plan: FaultPlan, engine, engine_spec: str | None,
                 run_dir: str, started: float, database: dict | None = None) -> dict:
    """What report.json says from a run's start: what runs, with which plan, on which
    database (`database`: chaos.run.backends.RunDatabase.to_json(), never a password), and how
    to rerun and replay it; `partial` until the run's end replaces it with the whole report,
    so that a run killed halfway can still be checked, replayed and rendered."""
    database = database or {"backend": "sqlite", "name": "engine.db", "server": None,
                            "target": ""}
    return {
        "schema": REPORT_SCHEMA, "partial": True, "result": "partial", "exit_code": None,
        "run_id": os.path.basename(run_dir), "run_dir": run_dir, "started": started,
        "scenario": scenario_record(scenario, engine), "seed": plan.seed,
        "profile": scenario.profile,
        "engine": engine_spec or "reference", "engine_name": getattr(engine, "name", "?"),
        "plan": plan.to_json(),
        "versions": {"ninelives": VERSION, "python": platform.python_version(),
                     "sqlite": sqlite3.sqlite_version, "platform": platform.platform()},
        "capabilities": sorted(getattr(engine, "capabilities", ())),
        "backend": database["backend"], "database": database,
        "run_command": run_command(scenario, plan.seed, engine_spec, database),
        "replay_command": replay_command(run_dir),
    }


def build_report(scenario: Scenario, plan: FaultPlan, engine, engine_spec: str | None,
                 run_dir: str, verdicts: list[Verdict], applied: dict[str, int],
                 events: list[Event], snapshot: dict[str, Any], started: float,
                 database: dict | None = None) -> dict:
    """The report dict; `exit_code` and `result` follow from verdicts and fault evidence
    (see `exit_code_for`). An `unknown` verdict is reported with its reason."""
    skip = not_applicable(scenario, engine)
    missing = unfired(scenario, applied, skip)
    taken = prevented(plan, events, missing)
    missing = [m for m in missing if m not in taken]
    aimed = aim_section(scenario.aims, engine, events)  # aimed faults (chaos.spec.aim)
    missing += aimed["aims_unfired"]
    verdicts_json = [v.to_json() for v in verdicts]
    exit_code = exit_code_for(verdicts_json, missing)
    return {
        **start_record(scenario, plan, engine, engine_spec, run_dir, started, database),
        "partial": False, "finished": time.time(),
        "faults_applied": applied, "faults_unfired": missing, "faults_not_applicable": skip,
        "faults_prevented": taken, "aims": aimed["aims"],
        **crash_point_names(scenario, engine),
        "crashpoint_coverage": crashpoint_coverage(getattr(engine, "crashpoints", ()), events),
        "kills": kill_rows(events, snapshot),
        "verdicts": verdicts_json,
        **situations_record(events, snapshot, verdicts_json),
        "skew": skew_of(verdicts_json),
        "metrics": metrics(scenario, events, snapshot, applied),
        "result": RESULTS[exit_code], "exit_code": exit_code,
    }


def situations_record(events: list[Event], snapshot: dict[str, Any],
                      verdicts: list[dict]) -> dict[str, Any]:
    """report.json's `situations` ({name: chaos.situations.Reached.to_json()}) and
    `not_exercised` (the invariants that passed without reaching any of their situations;
    each keeps `verdict: "pass"`, so older readers still read a pass, and says
    `exercised: false`)."""
    from chaos.situations import recognise
    reached = recognise(events, snapshot) if events else {}
    return {"situations": {name: r.to_json() for name, r in reached.items()},
            "not_exercised": [v["name"] for v in verdicts
                              if v["verdict"] == "pass" and v.get("exercised") is False]}


def require_exercised(report: dict) -> dict:
    """--require-exercised: a run that would pass while an invariant passed without reaching
    any of its situations is an error (exit 2), as an unfired fault is; a failure stays a
    failure. Changes the report in place and returns it."""
    report["require_exercised"] = True
    if report.get("not_exercised") and report["result"] == "pass":
        report["exit_code"], report["result"] = 2, RESULTS[2]
    return report


def skew_of(verdicts: list[dict]) -> dict | None:
    """What workers on a skewed clock did with leases (lease-exclusive's reading, see
    chaos.checkers.skew), or None when no worker ran on one."""
    return next((v["metrics"]["skew"] for v in verdicts
                 if v["name"] == "lease-exclusive" and (v.get("metrics") or {}).get("skew")),
                None)


def write_report(run_dir: str, report: dict) -> str:
    """Write report.json into `run_dir` atomically; returns its path."""
    return write_json(os.path.join(run_dir, "report.json"), report)


