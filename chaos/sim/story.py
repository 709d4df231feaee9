"""A failing schedule told as a short numbered story, from its history.

Only what bears on the failure is told: the faults (crashes, kills, pauses, lease expiries,
operator actions) and what happened to the jobs the failure's witness events name (claims,
state changes, memos, provider calls, effects). The witness events are marked.
"""
from __future__ import annotations

from typing import Any

from ..checkers import Verdict
from ..history import Event

FAULTS = ("pause", "resume", "kill", "expire", "outage", "outage_end", "contention",
          "contention_end", "operator", "duplicate_submit")


def who(writer: str | None) -> str:
    """'worker 3' for worker:sim:3:1, 'sender 5', 'operator', 'the nemesis', ..."""
    if not writer:
        return "?"
    parts = writer.split(":")
    if len(parts) == 4 and parts[1] == "sim":
        return f"{parts[0]} {parts[2]}"
    if writer.startswith("operator:"):
        return "the operator"
    return {"nemesis": "the nemesis", "submit": "the submitter"}.get(writer, writer)


def failure_of(verdicts: list[Verdict], target: str | None = None) -> Verdict | None:
    """The verdict of invariant `target` if it did not pass, else the first that did not."""
    failed = [v for v in verdicts if v.valid is not True]
    return next((v for v in failed if v.name == target), failed[0] if failed else None)


def jobs_named(verdict: Verdict | None) -> set[str]:
    """The jobs the verdict's first failure's witness events name."""
    if verdict is None or not verdict.failures:
        return set()
    return {e["job"] for e in verdict.failures[0].events if e.get("job")}


def tell(history: list[Event], verdicts: list[Verdict], target: str | None = None, *,
         limit: int = 80) -> list[str]:
    """The story's lines, numbered: what happened to the jobs of the failure of invariant
    `target` (or of the first failure), and every fault."""
    failure = failure_of(verdicts, target)
    jobs = jobs_named(failure) or {e["job"] for e in history if e.get("job")}
    witnesses = {_key(e) for e in failure.failures[0].events} if failure and \
        failure.failures else set()
    t0 = history[0]["t"] if history else 0.0
    lines = []
    for event in history:
        text = _line(event, jobs)
        if text is None:
            continue
        mark = f"   <- {failure.name}" if _key(event) in witnesses else ""
        lines.append(f"{len(lines) + 1}. +{event['t'] - t0:.2f} s  {text}{mark}")
    if len(lines) > limit:
        keep = limit // 2
        lines = lines[:keep] + [f"   ... {len(lines) - limit} more ..."] + lines[-keep:]
    return lines


def headline(verdicts: list[Verdict], target: str | None = None) -> str:
    """One line: the failure of `target` (or the first failure), or that all held."""
    failure = failure_of(verdicts, target)
    if failure is None:
        return "every invariant holds"
    kind = next(iter(failure.by_type), failure.status)
    return f"{failure.name} ({kind}): {failure.reason}"


def shape(history: list[Event]) -> str:
    """How big a schedule is: jobs, worker slots, faults (crashes and the nemesis's), and
    the history's events."""
    jobs = {e["job"] for e in history if e["src"] == "runner" and e["type"] == "submit"}
    slots = {e["slot"] for e in history if e["type"] == "spawn" and e.get("role") == "worker"}
    faults = sum(1 for e in history if (e["src"] == "nemesis" and e["type"] in FAULTS
                                         and not e["type"].endswith("_end")
                                         and e["type"] != "resume")
                 or e["type"] == "crashpoint")
    return (f"{len(jobs)} job(s), {len(slots)} worker slot(s), {faults} fault(s), "
            f"{len(history)} events")


def _key(event: dict[str, Any]) -> tuple:
    return (event.get("src"), event.get("type"), event.get("seq"), event.get("t"))


def _line(e: Event, jobs: set[str]) -> str | None:
    src, type_ = e["src"], e["type"]
    if src == "nemesis" and type_ in FAULTS:
        return _fault(e)
    if src == "process" and type_ == "crashpoint":
        role = "sender" if e.get("role") == "send" else e.get("role", "process")
        return f"{role} {e['pid']} crashes at {e['point']} (its job: {e.get('job')})"
    if e.get("job") not in jobs:
        return None
    if src == "audit":
        return _audit(e)
    if src == "provider":
        answer = e.get("outcome") if e.get("status") in (200, None) else e.get("status")
        fault = f", fault {e['fault']}" if e.get("fault") else ""
        return (f"{who(e.get('worker'))} calls the provider for {e['job']}/{e['step']} "
                f"(call {e['n']}): {answer}{fault}, billed {e.get('billed')}")
    if src == "receiver":
        return (f"{who(e.get('worker'))} sends {e['kind']} of {e['job']} (request {e['n']}, "
                f"key {e.get('key')}): {e.get('outcome')}")
    if src == "runner" and type_ == "submit" and e.get("duplicate"):
        return f"{e['job']} is submitted again: {e['result']}"
    return None


def _fault(e: Event) -> str:
    type_ = e["type"]
    if type_ in ("pause", "resume", "kill"):
        name = e.get("target", "?")
        role, _, rest = name.partition("-")
        pid = e.get("pid")
        actor = f"{'sender' if role == 'send' else role} {pid}"
        return {"pause": f"{actor} is paused for {e.get('seconds')} s",
                "resume": f"{actor} resumes", "kill": f"{actor} is killed"}[type_]
    if type_ == "expire":
        return f"the nemesis expires every lease ({e.get('leases')} jobs)"
    if type_ == "operator":
        return f"the operator tries to {e.get('action')} {e.get('job')}: {e.get('result')}"
    if type_ == "duplicate_submit":
        return f"{e.get('job')} is submitted again ({e.get('kind')} payload): {e.get('result')}"
    return {"outage": "the provider goes down", "outage_end": "the provider is back",
            "contention": f"another process holds the write lock for {e.get('seconds')} s",
            "contention_end": "the write lock is free again"}[type_]


def _audit(e: Event) -> str | None:
    type_, writer = e["type"], who(e.get("writer") or e.get("worker"))
    if type_ == "job":
        if e["op"] == "insert":
            return None
        frm, to = e.get("from"), e.get("to")
        if e["token"] > e["old_token"]:
            verb = "takes over" if frm == to else "claims"
            return f"{writer} {verb} {e['job']} at {to} (lease token {e['token']})"
        if frm != to:
            extra = f" ({e['last_error']})" if e.get("last_error") and to != frm else ""
            return f"{writer} moves {e['job']} {frm} -> {to}{extra}"
        return None  # a heartbeat or lease write
    if type_ == "memo":
        return f"{writer} commits the memo of {e['job']}/{e['step']} (token {e.get('token')})"
    if type_ == "outbox":
        if e["op"] == "insert":
            return f"{writer} queues effect {e['kind']} of {e['job']}"
        if e.get("sent_at") is not None:
            return f"{writer} marks {e['kind']} of {e['job']} sent"
        if e.get("dead_at") is not None:
            return f"{writer} dead-letters {e['kind']} of {e['job']}"
        return None
    return None
