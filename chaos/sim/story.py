"""A failing schedule told as a short numbered story, from its history.

Only what bears on the failure is told: the faults (crashes, kills, pauses, lease expiries,
operator actions) and what happened to the jobs the failure's witness events name (claims,
state changes, memos, provider calls, effects). The witness events are marked.
"""
from __future__ import annotations

from typing import Any

from chaos.checkers import Verdict
from chaos.checkers.ops import pids_by_worker
from chaos.history import Event

FAULTS = ("pause", "resume", "kill", "expire", "outage", "outage_end", "contention",
          "contention_end", "operator", "duplicate_submit")


def who(e: Event, pids: dict[str, int] | None = None) -> str:
    """Who did `e`: 'worker 3', 'sender 5', 'the operator', 'the nemesis', 'the
    submitter', from the operation's `actor` and `pid`; a ledger event (which names only its
    worker id) through `pids` (worker id -> pid, see `chaos.checkers.ops.pids_by_worker`)."""
    actor, worker = e.get("actor"), e.get("worker")
    pid = e.get("pid")
    if pid is None and pids and worker in pids:
        pid, actor = pids[worker], actor or ("sender" if e.get("src") == "receiver"
                                             else "worker")
    if actor in ("worker", "sender") and pid is not None:
        return f"{actor} {pid}"
    named = {"operator": "the operator", "harness": "the nemesis", "submitter": "the submitter"}
    if actor in named:
        return named[actor]
    return worker or actor or "?"


def failure_of(verdicts: list[Verdict], target: str | None = None) -> Verdict | None:
    """The verdict of invariant `target` if it failed, else the first that failed (an
    `unknown` one has no failure to tell)."""
    failed = [v for v in verdicts if v.valid is False]
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
    pids = pids_by_worker(history)
    lines = []
    for event in history:
        text = _line(event, jobs, pids)
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
        return "every invariant with evidence holds"
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


def _line(e: Event, jobs: set[str], pids: dict[str, int]) -> str | None:
    src, type_ = e["src"], e["type"]
    if src == "nemesis" and type_ in FAULTS:
        return _fault(e)
    if src == "process" and type_ == "crashpoint":
        return (f"{e.get('role', 'process')} {e['pid']} crashes at {e['point']} "
                f"(its job: {e.get('job')})")
    if e.get("job") not in jobs:
        return None
    if src == "engine":
        return _engine(e)
    if src == "provider":
        answer = e.get("outcome") if e.get("status") in (200, None) else e.get("status")
        fault = f", fault {e['fault']}" if e.get("fault") else ""
        return (f"{who(e, pids)} calls the provider for {e['job']}/{e['step']} "
                f"(call {e['n']}): {answer}{fault}, billed {e.get('billed')}")
    if src == "receiver":
        return (f"{who(e, pids)} sends {e['kind']} of {e['job']} (request {e['n']}, "
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
        actor = f"{role} {pid}"
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


def _engine(e: Event) -> str | None:
    type_, writer = e["type"], who(e)
    job, token = e.get("job"), e.get("token")
    if type_ == "claimed":
        if e.get("continued"):
            return f"{writer} moves {job} {e.get('from')} -> {e.get('to')}"
        verb = "takes over" if e.get("from") == e.get("to") else "claims"
        return f"{writer} {verb} {job} at {e.get('to')} (lease token {token})"
    if type_ == "state":
        frm, to = e.get("from"), e.get("to")
        if frm != to:
            extra = f" ({e['last_error']})" if e.get("last_error") else ""
            took = " taking its lease" if e.get("took_lease") else ""
            return f"{writer} moves {job} {frm} -> {to}{took}{extra}"
        if e.get("took_lease"):
            return f"{writer} takes {job} at {to} (lease token {token})"
        return None  # a heartbeat or lease write
    if type_ == "memo":
        if e.get("op") == "delete":
            return f"{writer} deletes the memo of {job}/{e.get('step')}"
        return f"{writer} commits the memo of {job}/{e.get('step')} (token {token})"
    if type_ == "billed":
        return (f"{writer} records the call for {job}/{e.get('step')}: {e.get('outcome')}, "
                f"cost {e.get('cost')}")
    if type_ == "effect_queued":
        return f"{writer} queues effect {e['kind']} of {job}"
    if type_ == "effect_claimed":
        return f"{writer} claims effect {e['kind']} of {job} (attempt {e.get('attempts')})"
    if type_ == "effect_sent":
        return f"{writer} marks {e['kind']} of {job} sent"
    if type_ == "effect_state" and e.get("dead_at") is not None:
        return f"{writer} dead-letters {e['kind']} of {job}"
    return None
