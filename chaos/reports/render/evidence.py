"""Evidence as people read it: a stable key per history event, a one-line description of it,
and which events witness which failed invariant. Shared by every report format."""
from __future__ import annotations

import re
from typing import Any, Iterable

from chaos.history import Event

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


def event_key(event: Event) -> str:
    """A key naming one history event (source, type, sequence number, time), safe to use in
    an HTML attribute and a CSS selector; equal events give equal keys."""
    seq = event.get("seq")
    raw = f"{event.get('src')}.{event.get('type')}.{'-' if seq is None else seq}." \
          f"{float(event.get('t', 0.0)):.6f}"
    return _UNSAFE.sub("_", raw)


def writer_names(history: Iterable[Event]) -> dict[str, str]:
    """worker id -> `worker 1234` (its actor and process id), from every engine operation
    that names both: how a provider call or a receiver request, which carry only the worker
    id, is tied to its timeline lane."""
    names = {}
    for e in history:
        if e.get("src") == "engine" and e.get("worker") and e.get("pid") is not None:
            names[e["worker"]] = f"{e.get('actor') or 'worker'} {e['pid']}"
    return names


def short_worker(e: Event, names: dict[str, str] | None = None) -> str:
    """Who did `e`, as `worker 1234` (the pid ties it to a timeline lane): the operation's
    own actor and pid, else the name `names` gives its worker id, else the id as written."""
    worker = e.get("worker")
    if e.get("pid") is not None:
        return f"{e.get('actor') or 'worker'} {e['pid']}"
    if worker and names and worker in names:
        return names[worker]
    return str(worker) if worker else "?"


def at(t: float, t0: float) -> str:
    """A time as seconds since the run started: `+12.345 s`."""
    return f"+{t - t0:.3f} s"


def describe(event: Event, t0: float, names: dict[str, str] | None = None) -> str:
    """One line saying what the event is, for tables, tooltips and CI messages. `names`
    (from `writer_names`) names the workers of ledger events, which carry no pid."""
    src, type_ = event.get("src"), event.get("type")
    if src == "engine" and type_ in _ENGINE:
        text = _ENGINE[type_](event, short_worker(event, names))
    elif (src, type_) in _LEDGER:
        text = _LEDGER[(src, type_)](event, short_worker(event, names))
    else:
        text = _generic(event)
    return f"{at(event.get('t', t0), t0)} {src}/{type_}: {text}"


def _token(e: Event) -> str:
    return f"token {e.get('token')}"


def _error(e: Event) -> str:
    return f", last_error {e['last_error']!r}" if e.get("last_error") else ""


def _submitted(e: Event, by: str) -> str:
    return f"job {e.get('job')} (new) → {e.get('state', e.get('to'))} by {by}, {_token(e)}"


def _claimed(e: Event, by: str) -> str:
    how = "moves on to" if e.get("continued") else "claims"
    return (f"job {e.get('job')} {e.get('from') or '(new)'} → {e.get('to')}: {by} {how} "
            f"step {e.get('step')}, {_token(e)}")


def _state(e: Event, by: str) -> str:
    what = " (heartbeat)" if e.get("heartbeat") else (" (took the lease)"
                                                      if e.get("took_lease") else "")
    cause = f", cause {e['cause']}" if e.get("cause") else ""
    return (f"job {e.get('job')} {e.get('from') or '(new)'} → {e.get('to')} by {by}{what}, "
            f"{_token(e)}{_error(e)}{cause}")


def _removed(e: Event, by: str) -> str:
    return f"job {e.get('job')} removed (was {e.get('from')}) by {by}"


def _memo(e: Event, by: str) -> str:
    return (f"memo {e.get('op')} job {e.get('job')} step {e.get('step')} by {by} "
            f"({_token(e)}, cost {e.get('cost')})")


def _effect(e: Event, by: str) -> str:
    verb = {"effect_queued": "queued", "effect_claimed": "claimed", "effect_sent": "marked sent",
            "effect_state": "updated"}[e["type"]]
    sent = "sent" if e.get("sent_at") else ("dead-lettered" if e.get("dead_at") else "unsent")
    return (f"outbox row {e.get('row')} {verb} job {e.get('job')} {e.get('kind')} by {by}, "
            f"attempts {e.get('attempts')}, {sent}{_error(e)}")


def _billed(e: Event, by: str) -> str:
    return (f"billed job {e.get('job')} step {e.get('step')} by {by}: {e.get('outcome')}, "
            f"cost {e.get('cost')}")


def _call(e: Event, by: str) -> str:
    took = (e.get("t_end") or e["t_start"]) - e["t_start"]
    fault = f", fault {e['fault']}" if e.get("fault") else ""
    return (f"provider call #{e.get('n')} job {e.get('job')} step {e.get('step')} by "
            f"{by}: {e.get('status')} {e.get('outcome')}, billed {e.get('billed')}, "
            f"{took:.3f} s{fault}")


def _request(e: Event, by: str) -> str:
    return (f"receiver request #{e.get('n')} job {e.get('job')} {e.get('kind')} by "
            f"{by}: {e.get('status')} {e.get('outcome')}"
            f"{' (applied)' if e.get('applied') else ''}")


def _generic(e: Event) -> str:
    skip = {"t", "src", "type", "seq"}
    return ", ".join(f"{k} {v}" for k, v in sorted(e.items()) if k not in skip) or "-"


_ENGINE = {"submitted": _submitted, "claimed": _claimed, "state": _state, "removed": _removed,
           "memo": _memo, "effect_queued": _effect, "effect_claimed": _effect,
           "effect_sent": _effect, "effect_state": _effect, "billed": _billed}
_LEDGER = {("provider", "call"): _call, ("receiver", "request"): _request}


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
