"""Evidence as people read it: a stable key per history event, a one-line description of it,
and which events witness which failed invariant. Shared by every report format."""
from __future__ import annotations

import re
from typing import Any, Iterable

from ..history import Event, pid_of

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def event_key(event: Event) -> str:
    """A key naming one history event (source, type, sequence number, time), safe to use in
    an HTML attribute and a CSS selector; equal events give equal keys."""
    seq = event.get("seq")
    raw = f"{event.get('src')}.{event.get('type')}.{'-' if seq is None else seq}." \
          f"{float(event.get('t', 0.0)):.6f}"
    return _UNSAFE.sub("_", raw)


def short_worker(worker: str | None) -> str:
    """`worker:host:pid:nonce` as `worker 1234` (the pid ties it to a timeline lane)."""
    if not worker:
        return "?"
    pid = pid_of(worker)
    return f"{worker.split(':', 1)[0]} {pid}" if pid is not None else worker


def at(t: float, t0: float) -> str:
    """A time as seconds since the run started: `+12.345 s`."""
    return f"+{t - t0:.3f} s"


def describe(event: Event, t0: float) -> str:
    """One line saying what the event is, for tables, tooltips and CI messages."""
    src, type_ = event.get("src"), event.get("type")
    text = _DESCRIBE.get((src, type_), _generic)(event)
    return f"{at(event.get('t', t0), t0)} {src}/{type_}: {text}"


def _job(e: Event) -> str:
    tokens = f"token {e.get('old_token')}→{e.get('token')}" \
        if e.get("old_token") != e.get("token") else f"token {e.get('token')}"
    error = f", last_error {e['last_error']!r}" if e.get("last_error") else ""
    return (f"job {e.get('job')} {e.get('from') or '(new)'} → {e.get('to')} by "
            f"{short_worker(e.get('writer'))}, {tokens}{error}")


def _memo(e: Event) -> str:
    return (f"memo {e.get('op')} job {e.get('job')} step {e.get('step')} by "
            f"{short_worker(e.get('writer'))} (token {e.get('token')}, cost {e.get('cost')})")


def _outbox(e: Event) -> str:
    sent = "sent" if e.get("sent_at") else ("dead-lettered" if e.get("dead_at") else "unsent")
    return (f"outbox row {e.get('row')} {e.get('op')} job {e.get('job')} {e.get('kind')} by "
            f"{short_worker(e.get('writer'))}, attempts {e.get('attempts')}, {sent}")


def _spend(e: Event) -> str:
    return (f"spend job {e.get('job')} step {e.get('step')} by {short_worker(e.get('worker'))}:"
            f" {e.get('outcome')}, cost {e.get('cost')}")


def _call(e: Event) -> str:
    took = (e.get("t_end") or e["t_start"]) - e["t_start"]
    fault = f", fault {e['fault']}" if e.get("fault") else ""
    return (f"provider call #{e.get('n')} job {e.get('job')} step {e.get('step')} by "
            f"{short_worker(e.get('worker'))}: {e.get('status')} {e.get('outcome')}, billed "
            f"{e.get('billed')}, {took:.3f} s{fault}")


def _request(e: Event) -> str:
    return (f"receiver request #{e.get('n')} job {e.get('job')} {e.get('kind')} by "
            f"{short_worker(e.get('worker'))}: {e.get('status')} {e.get('outcome')}"
            f"{' (applied)' if e.get('applied') else ''}")


def _generic(e: Event) -> str:
    skip = {"t", "src", "type", "seq"}
    return ", ".join(f"{k} {v}" for k, v in sorted(e.items()) if k not in skip) or "-"


_DESCRIBE = {("audit", "job"): _job, ("audit", "memo"): _memo, ("audit", "outbox"): _outbox,
             ("audit", "spend"): _spend, ("provider", "call"): _call,
             ("receiver", "request"): _request}


def failing(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The verdicts that did not pass, failures before unknowns, in report order."""
    return sorted((v for v in report["verdicts"] if v["verdict"] != "pass"),
                  key=lambda v: v["verdict"] != "fail")


def ordered(verdicts: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Verdicts for display: failures, then unknowns, then passes; by name within each."""
    rank = {"fail": 0, "unknown": 1, "pass": 2}
    return sorted(verdicts, key=lambda v: (rank.get(v["verdict"], 3), v["name"]))


def witnesses(report: dict[str, Any]) -> dict[str, tuple[Event, list[str]]]:
    """event key -> (the event, the invariants it witnesses a violation of)."""
    found: dict[str, tuple[Event, list[str]]] = {}
    for verdict in failing(report):
        for error in verdict.get("errors") or []:
            for event in error.get("events") or []:
                key = event_key(event)
                names = found.setdefault(key, (event, []))[1]
                if verdict["name"] not in names:
                    names.append(verdict["name"])
    return found


def first_events(verdict: dict[str, Any], limit: int) -> list[Event]:
    """The first `limit` witnessing events of a verdict, in the order its errors cite them."""
    events: list[Event] = []
    for error in verdict.get("errors") or []:
        events += error.get("events") or []
    return events[:limit]
