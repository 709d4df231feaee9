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

from rich.console import Console

from .aim import aim_section, summary_lines as aim_summary_lines
from .backends import STARTED
from .checkers import Verdict
from .checkers.cuts import cut_metrics, kill_cuts, with_jobs_lost
from .console import AUTO, Column, table
from .history import Event, of
from .plan import FaultPlan
from .progress import progress_latency
from .runfiles import scenario_record, write_json
from . import crashpoints
from .limits import shown
from .scenario import Scenario, engine_set_args

REPORT_SCHEMA = "ninelives.report/1"
VERSION = "0.1.0"


def faults_applied(plan: FaultPlan, events: list[Event], nemesis: Counter) -> dict[str, int]:
    """How often each fault actually happened, from the evidence (ledgers, crash log,
    nemesis log), not from the plan."""
    counts: Counter[str] = Counter()
    for name, n in nemesis.items():
        counts[name] = n
    outages = _windows(events, "outage", "outage_end")
    for e in of(events, "provider", "call"):
        fault, status = e.get("fault"), e.get("status")
        if fault == "status" and status and status >= 500 \
                and plan.unavailable.get(e.get("job")) == e.get("step"):
            # the document's own 503s, outage or not: its fault comes first (chaos.nemesis)
            counts["unavailable"] += 1
        elif fault == "status" and any(a <= e["t"] <= b for a, b in outages):
            counts["outage_503"] += 1  # the outage's doing, not evidence of random 5xx
        elif fault == "status" and status == 429:
            counts["provider_429"] += 1
        elif fault == "status" and status and 400 <= status < 500:
            counts["poison"] += 1  # 429 was counted above
        elif fault == "status" and status and status >= 500:
            counts["provider_5xx"] += 1
        elif fault in ("hang", "reset", "slow"):
            counts[fault] += 1
        elif fault in ("bad_content", "schema", "garbage"):
            counts["poison"] += 1
    for e in of(events, "receiver", "request"):
        fault = e.get("fault")
        if fault == "status" and plan.declined.get(e.get("job")) == e.get("kind"):
            counts["declined"] += 1
        elif fault:
            counts[{"status": "receiver_5xx", "timeout": "receiver_timeout",
                    "drop": "receiver_drop"}.get(fault, f"receiver_{fault}")] += 1
    looping = set(plan.crash_loop)
    for e in of(events, "process", "crashpoint"):
        counts["crash_loop" if e.get("job") in looping else "crash_point"] += 1
    for e in of(events, "nemesis", "skew"):
        counts["skewed_worker"] += 1
    for e in of(events, "nemesis", "heartbeat_off"):
        counts["heartbeat_off_worker"] += 1
    for e in of(events, "nemesis"):  # aimed faults (chaos.aim)
        if "aim" in e and e["type"] in ("hold", "expire"):
            counts[f"aim_{e['type']}"] += 1
    return dict(sorted((k, v) for k, v in counts.items() if v))


def _windows(events: list[Event], start: str, end: str) -> list[tuple[float, float]]:
    """[start, end] time windows of a nemesis fault (an open window ends at infinity)."""
    windows, opened = [], None
    for e in of(events, "nemesis"):
        if e["type"] == start:
            opened = e["t"]
        elif e["type"] == end and opened is not None:
            windows.append((opened, e["t"]))
            opened = None
    if opened is not None:
        windows.append((opened, float("inf")))
    return windows


#: fault setting -> the applied-count key that proves it fired.
EVIDENCE = {
    "kill": "kill", "pause": "pause", "lease_expiry": "lease_expiry",
    "skewed_workers": "skewed_worker", "heartbeat_off_workers": "heartbeat_off_worker",
    "slow": "slow", "provider_429": "provider_429", "provider_5xx": "provider_5xx",
    "hang": "hang", "reset": "reset", "outages": "outage", "poison": "poison",
    "unavailable": "unavailable", "crash_loop": "crash_loop", "latency": "slow",
    "duplicate_same": "duplicate_same", "duplicate_different": "duplicate_different",
    "receiver_5xx": "receiver_5xx", "receiver_timeout": "receiver_timeout",
    "receiver_drop": "receiver_drop", "receiver_lost": "receiver_lost", "declined": "declined",
    "contention": "contention", "operator": "operator", "crash_points": "crash_point",
    "server_restart": "server_restart", "connection_kill": "connection_kill",
    "statement_timeout": "statement_timeout", "row_lock": "row_lock",
}


#: fault setting -> the capability an engine needs for the fault to apply at all.
NEEDS_CAPABILITY = {
    "lease_expiry": "lease_expiry", "contention": "write_lock", "operator": "operator",
    "crash_points": "crash_points", "crash_loop": "crash_points", "skewed_workers": "clock_skew",
    "heartbeat_off_workers": "heartbeat", "statement_timeout": "write_lock",
}
#: fault setting -> the control (an optional adapter method) the fault needs to apply at all.
NEEDS_CONTROL = {"row_lock": "hold_row_lock"}
#: Faults of the receiver: they apply to any engine whose pipeline sends it effects, with an
#: outbox or without (a refusal is a refusal, whoever posted).
RECEIVER_FAULTS = ("receiver_5xx", "receiver_timeout", "receiver_drop", "receiver_lost")


def not_applicable(scenario: Scenario, engine: Any) -> list[str]:
    """The scenario's configured faults the engine cannot undergo (it lacks the capability,
    or, for the receiver's, its pipeline sends no effect)."""
    caps = set(getattr(engine, "capabilities", ()))
    skipped = [setting for setting, cap in NEEDS_CAPABILITY.items()
               if getattr(scenario.faults, setting) and cap not in caps]
    skipped += [setting for setting, control in NEEDS_CONTROL.items()
                if getattr(scenario.faults, setting) and not hasattr(engine, control)]
    if "outbox" not in caps and not getattr(getattr(engine, "pipeline", None), "effects", ()):
        skipped += [setting for setting in RECEIVER_FAULTS if getattr(scenario.faults, setting)]
    if scenario.faults.crash_points and "crash_points" not in skipped \
            and not crashpoints.resolve(scenario.faults.crash_points, engine).armed:
        skipped.append("crash_points")  # every point it names is optional and absent
    return skipped


def unfired(scenario: Scenario, applied: dict[str, int], skip: Iterable[str] = ()) -> list[str]:
    """The scenario's configured faults with no evidence of having happened (those in
    `skip`, not applicable to the engine, aside)."""
    missing = []
    for setting, key in EVIDENCE.items():
        if setting not in skip and getattr(scenario.faults, setting) and not applied.get(key):
            missing.append(setting)
    return missing


def prevented(plan: FaultPlan, events: list[Event], missing: Iterable[str]) -> dict[str, str]:
    """The unfired faults of `missing` whose every planned target the run legitimately took
    away first: a fault forced onto a job's first call (or an unavailable document's step)
    never fires when an operator acted on the job (cancelled it, say) before that call.
    {setting: why}; the others stay unfired."""
    acted: dict[str, float] = {}
    for e in events:
        if e.get("src") == "engine" and e.get("actor") == "operator" and e.get("job"):
            acted.setdefault(e["job"], e["t"])
    first: dict[tuple[str, str], float] = {}
    for e in events:
        if e.get("src") == "provider" and e.get("type") == "call":
            first.setdefault((e.get("job"), e.get("step")), e["t"])
        elif e.get("src") == "receiver" and e.get("type") == "request":
            first.setdefault((e.get("job"), e.get("kind")), e["t"])
    why = {}
    idle = [e for e in events if e.get("src") == "nemesis" and e.get("type") == "row_lock_idle"]
    if "row_lock" in missing and idle:
        why["row_lock"] = (f"nothing was left unfinished to lock when it was due ({len(idle)} "
                           "time(s)): every job and outbox row had settled")
    for setting in missing:
        targets = [(job, what) for job, what, name, *_ in
                   plan.forced_provider + plan.forced_receiver if name == setting]
        if setting == "unavailable":  # the documents whose step answers 503 every time
            targets = sorted(plan.unavailable.items())
        if targets and all(job in acted and acted[job] <= first.get((job, what), float("inf"))
                           for job, what in targets):
            why[setting] = "; ".join(f"its target {job} ({what}) was taken by an operator "
                                     "before that call" for job, what in targets)
    return why


def crashpoint_coverage(points: Iterable[str], events: list[Event]) -> dict[str, int]:
    """Kills that landed at each declared crash point (0 where none did)."""
    coverage = {p: 0 for p in points}
    for e in of(events, "process", "crashpoint"):
        coverage[e["point"]] = coverage.get(e["point"], 0) + 1
    return coverage


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
    database (`database`: chaos.backends.RunDatabase.to_json(), never a password), and how
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
    aimed = aim_section(scenario.aims, engine, events)  # aimed faults (chaos.aim)
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
    from .situations import recognise
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


def situations_lines(report: dict) -> list[str]:
    """One compact block: the situations reached with counts, those not reached."""
    from .situations import Reached, summary_line
    found = report.get("situations")
    if not found:
        return []
    return [summary_line({n: Reached.from_json(r) for n, r in found.items()})]


def crash_point_names(scenario: Scenario, engine: Any) -> dict[str, dict]:
    """What the scenario's crash-point names armed on `engine`: `crash_points_armed`, each
    name that armed something -> the engine's points ("*": every one), and
    `crash_points_not_applicable`, each optional name the engine lacks -> why."""
    resolution = crashpoints.resolve(scenario.faults.crash_points, engine)
    return {"crash_points_armed": {k: list(v) for k, v in resolution.named.items()},
            "crash_points_not_applicable": dict(resolution.absent)}


def crash_point_lines(report: dict) -> list[str]:
    """The summary's lines on the scenario's crash-point names (none when it names none)."""
    resolution = crashpoints.Resolution(
        named={k: tuple(v) for k, v in report.get("crash_points_armed", {}).items()},
        absent=report.get("crash_points_not_applicable", {}))
    armed, absent = crashpoints.summary(resolution)
    return ([f"crash points armed: {', '.join(armed)}"] if armed else []) + (
        [f"crash points not applicable to this engine (optional): {'; '.join(absent)}"]
        if absent else [])


def skew_of(verdicts: list[dict]) -> dict | None:
    """What workers on a skewed clock did with leases (lease-exclusive's reading, see
    chaos.checkers.skew), or None when no worker ran on one."""
    return next((v["metrics"]["skew"] for v in verdicts
                 if v["name"] == "lease-exclusive" and (v.get("metrics") or {}).get("skew")),
                None)


def skew_text(report: dict) -> str | None:
    """What the report says of skewed workers (None without them)."""
    skew = report.get("skew") or skew_of(report.get("verdicts") or [])
    return f"leases on the {skew['lease_clock']}'s clock; {skew['note']}" if skew else None


def write_report(run_dir: str, report: dict) -> str:
    """Write report.json into `run_dir` atomically; returns its path."""
    return write_json(os.path.join(run_dir, "report.json"), report)


VERDICT_COLUMNS = (Column("invariant"), Column("verdict"), Column("checked", "right"),
                   Column("errors", "right"), Column("reason", wraps=True))


def verdict_table(report: dict, console: Console | str | None = AUTO) -> str:
    """The verdicts as a table, failures first: on a terminal (see chaos.console.table for
    `console`) drawn by rich with the reason wrapped; plain lines otherwise, the reason
    shortened at a word."""
    rows = sorted(report["verdicts"], key=lambda v: (v["verdict"] == "pass", v["name"]))
    if not rows:
        return "(no verdicts)"
    marks = {"pass": "pass", "fail": "FAIL", "unknown": "UNKNOWN"}
    return table(VERDICT_COLUMNS, ([v["name"], "pass, not exercised"
                                    if v["verdict"] == "pass" and v.get("exercised") is False
                                    else marks[v["verdict"]], v["checked"],
                                    v["error_count"], v["reason"] or ""] for v in rows),
                 console=console)


def _progress_line(progress: dict | None) -> list[str]:
    """The time lost to leases nobody used (see chaos.progress), by whether the holder lived."""
    progress = progress or {}
    lines = []
    for key, what in (("after_holder_alive", "a live holder kept"),
                      ("after_holder_died", "a dead holder left")):
        held = progress.get(key) or {}
        if held.get("count"):
            lines.append(f"claims that waited out a lease {what}: {held['count']} (median "
                         f"{held['median']} s, max {held['max']} s, {held['total']} s in all)")
    return lines


def _cuts_line(cuts: dict | None) -> list[str]:
    """What the worker kills cut: in-flight steps in all, and the most one kill cut; and the
    jobs they lost (never settled, last held by a killed process), with the kill that lost
    the most."""
    if not cuts or not cuts.get("kills"):
        return []
    lines = [f"worker kills {cuts['kills']} cut {cuts['steps_cut']} in-flight steps (at most "
             f"{cuts['most_in_one_kill']} in one kill; kills by steps cut: "
             + ", ".join(f"{n}: {k}" for n, k in cuts["kills_by_steps_cut"].items()) + ")"]
    if cuts.get("jobs_lost"):
        worst = cuts["most_lost_in_one_kill"]
        jobs = ", ".join(worst["jobs"][:5]) + (", ..." if len(worst["jobs"]) > 5 else "")
        lines.append(f"jobs lost to kills: {cuts['jobs_lost']} never settled, last held by a "
                     f"killed process (kills by jobs lost: "
                     + ", ".join(f"{n}: {k}" for n, k in cuts["kills_by_jobs_lost"].items())
                     + f"; the most, {len(worst['jobs'])}, by the kill of "
                     f"{worst['name'] or 'pid ' + str(worst['pid'])} at +{worst['at']:.3f} "
                     f"s: {jobs})")
    return lines


def incomplete_lines(report: dict) -> list[str]:
    """Why the report judges less than a whole run: a killed run, a torn history."""
    lines = []
    failed = report.get("adapter_error")
    if report.get("partial") and failed:
        lines.append(f"PARTIAL: the run ended before its checks: the adapter's "
                     f"{failed.get('method')} raised {failed.get('type')} (traceback: "
                     f"{failed.get('traceback')}); verdicts come from the evidence its folder "
                     "holds, and no pass stands on part of a run")
    elif report.get("partial"):
        lines.append("PARTIAL: the run ended before its checks (killed?); verdicts come from "
                     "the evidence its folder holds, and no pass stands on part of a run")
    if report.get("torn"):
        lines.append(f"TORN: {report['torn']}")
    return lines


def result_line(report: dict) -> str:
    """The last word on a run: PASS, FAIL or ERROR, and why; for a partial run (killed
    before its checks) also what it gathered."""
    line, found = _result_words(report), report.get("gathered")
    if report.get("partial") and found:
        line += f" (partial run: gathered {gathered_text(found)})"
    elif report.get("partial") and report["result"] != "partial":
        line += " (partial run: killed before its checks)"
    return line


def _result_words(report: dict) -> str:
    verdicts = report.get("verdicts") or []
    if report["result"] == "error" and all(v["verdict"] == "unknown" for v in verdicts):
        if report.get("partial") or report.get("torn"):
            return ("ERROR: no invariant failed in the part of the run there is, and no pass "
                    "stands on part of one")
        return "ERROR: no invariant had evidence either way: nothing was checked"
    if report["result"] == "error" and report.get("require_exercised") and \
            report.get("not_exercised") and not report.get("faults_unfired"):
        return ("ERROR: passed, but not exercised (--require-exercised): "
                + ", ".join(report["not_exercised"]) + " reached none of their situations")
    return {"pass": "PASS: every invariant with evidence holds",
            "fail": "FAIL: an invariant was violated",
            "error": "ERROR: the run did not exercise what the scenario asked",
            "partial": "PARTIAL: the run has not been checked (ninelives check RUN)"
            }[report["result"]]


def summary(report: dict, console: Console | str | None = AUTO) -> str:
    """What the terminal shows at the end of a run (`console`: see verdict_table)."""
    m = report["metrics"]
    applied = ", ".join(f"{k} {v}" for k, v in report["faults_applied"].items()) or "none"
    lines = [
        f"scenario {report['scenario']['name']} (profile {report['profile']}, "
        f"seed {report['seed']}, engine {report['engine']})",
        f"jobs {m['jobs']}: " + ", ".join(f"{s} {n}" for s, n in m["states"].items()),
        f"faults applied: {applied}",
        f"kills {m['kills']} ({m['kills_per_minute']}/min), provider calls "
        f"{m['provider_calls']}, billed {m['billed']}, wasted {m['wasted']}",
        *_cuts_line(m.get("kill_cuts")),
        *_progress_line(m.get("progress_latency")),
        *([f"skewed workers: {skew_text(report)}"] if skew_text(report) else []),
        "", verdict_table(report, console), *situations_lines(report), "",
    ]
    if report["faults_unfired"]:
        lines.append(("ERROR" if report["result"] == "error" else "also")
                     + ": these configured faults never fired: "
                     + ", ".join(report["faults_unfired"]))
    if report.get("faults_prevented"):
        lines.append("faults that did not fire because the run took their targets away first: "
                     + "; ".join(f"{k}: {v}" for k, v in report["faults_prevented"].items()))
    lines += crash_point_lines(report) + aim_summary_lines(report)
    if report.get("faults_not_applicable"):
        lines.append("not applicable to this engine (a capability it lacks, or points it does "
                     "not declare): "
                     + ", ".join(report["faults_not_applicable"]))
    unknown = [v["name"] for v in report["verdicts"] if v["verdict"] == "unknown"]
    if unknown:
        lines.append(f"unknown (no evidence either way): {', '.join(unknown)}")
    lines += [*incomplete_lines(report), result_line(report),
              f"report: {os.path.join(report['run_dir'], 'report.json')}",
              f"rerun this seed: {report['run_command']}",
              f"replay the saved plan: {report['replay_command']}"]
    return "\n".join(lines)
