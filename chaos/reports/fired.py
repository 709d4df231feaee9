"""What a run's faults did: which the nemesis and the fakes applied (counted from the history),
which the engine cannot undergo (not applicable, with the capability or control it lacks),
which the scenario asked for and never fired, and what prevented those; which crash points
were reached."""
from __future__ import annotations

from collections import Counter
from typing import Any, Iterable

from chaos.engines import crashpoints
from chaos.history import Event, of
from chaos.spec.plan import FaultPlan
from chaos.spec.scenario import Scenario


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
            # the document's own 503s, outage or not: its fault comes first (chaos.run.nemesis)
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
    for e in of(events, "nemesis"):  # aimed faults (chaos.spec.aim)
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


def crash_point_names(scenario: Scenario, engine: Any) -> dict[str, dict]:
    """What the scenario's crash-point names armed on `engine`: `crash_points_armed`, each
    name that armed something -> the engine's points ("*": every one), and
    `crash_points_not_applicable`, each optional name the engine lacks -> why."""
    resolution = crashpoints.resolve(scenario.faults.crash_points, engine)
    return {"crash_points_armed": {k: list(v) for k, v in resolution.named.items()},
            "crash_points_not_applicable": dict(resolution.absent)}
