"""The reference engine's observer: its audit rows read as the history's operations.

This is where the reference engine's own facts live (who `updated_by` names, what a bumped
`lease_token` means, which `last_error` text says crash loop) and nowhere else: the
checkers read only the operations this produces (see `chaos.history`).
"""
from __future__ import annotations

from typing import Any, Iterable

from chaos.history import Event
from chaos.pipeline import Pipeline

#: updated_by prefixes -> the actor of the history's vocabulary.
ACTORS = (("worker:", "worker"), ("sender:", "sender"), ("operator", "operator"),
          ("nemesis", "harness"), ("chaos", "harness"))


def actor_of(writer: str | None) -> str:
    """Who wrote, in the vocabulary's terms, from the engine's `updated_by`."""
    for prefix, actor in ACTORS:
        if (writer or "").startswith(prefix):
            return actor
    return "submitter"


def pid_of(writer: str | None) -> int | None:
    """The process id inside the engine's worker ids (`role:host:pid:nonce`), or None."""
    parts = (writer or "").split(":")
    try:
        return int(parts[-2]) if len(parts) == 4 else None
    except ValueError:
        return None


def cause_of(last_error: str | None) -> str | None:
    """Why the engine parked a job, from the text it wrote."""
    text = last_error or ""
    if text.startswith("crash loop"):
        return "crash_loop"
    if "PoisonError" in text or "unusable" in text or "(poison:" in text:
        return "poison"
    if "parked after" in text:
        return "attempts"
    return None


class Mapper:
    """Turns audit rows (in commit order) into operations; keeps what a row alone cannot
    tell (the lease a worker continues under from the previous step)."""

    def __init__(self, pipeline: Pipeline) -> None:
        steps = pipeline.steps
        self.by_working = {s.working: s for s in steps}
        self.done_before = {steps[i].working: steps[i - 1].done for i in range(1, len(steps))}
        self.parked = pipeline.parked_states

    def map(self, row: dict[str, Any]) -> Event:
        kind, op = row["table"], row["op"]
        base = {"t": row["t"], "src": "engine", "seq": row["seq"], "completion": "ok"}
        if kind == "job":
            return {**base, **self._job(row, op)}
        writer = row.get("writer") or row.get("worker")
        who = {"worker": writer, "pid": pid_of(writer), "actor": actor_of(writer),
               "token": row.get("token")}
        if kind == "memo":
            return {**base, "type": "memo", "op": op, "job": row["job"], "step": row["step"],
                    "cost": row["cost"], **who}
        if kind == "spend":
            return {**base, "type": "billed", "job": row["job"], "step": row["step"],
                    "started": row["started"], "ended": row["ended"],
                    "outcome": row["outcome"], "cost": row["cost"], "error": row.get("error"),
                    **who}
        return {**base, **self._outbox(row, op), **who}

    def _job(self, row: dict, op: str) -> dict:
        writer = row.get("writer")
        common = {"job": row["job"], "worker": writer, "pid": pid_of(writer),
                  "actor": actor_of(writer), "token": row.get("token"),
                  "attempts": row.get("attempts"), "claims": row.get("claims"),
                  "lease_until": row.get("lease_until"), "next_run_at": row.get("next_run_at"),
                  "payload_hash": row.get("payload_hash")}
        if op == "insert":
            return {"type": "submitted", "state": row["to"], "from": None, "to": row["to"],
                    **common}
        if op == "delete":
            return {"type": "removed", "from": row["from"], "to": None, **common}
        frm, to = row["from"], row["to"]
        step = self.by_working.get(to)
        bumped = (row.get("token") or 0) > (row.get("old_token") or 0)
        continued = not bumped and frm == self.done_before.get(to)
        if step is not None and common["actor"] == "worker" and (bumped or continued):
            return {"type": "claimed", "step": step.name, "from": frm, "to": to,
                    "continued": continued, **common}
        heartbeat = (frm == to and frm in self.by_working
                     and row.get("token") == row.get("old_token"))
        # A worker write that bumps the token without entering a working state took the job
        # to park it (the claim that finds a crash loop parks instead of running).
        took = (common["actor"] == "worker"
                and (row.get("token") or 0) > (row.get("old_token") or 0))
        return {"type": "state", "from": frm, "to": to,
                "last_error": row.get("last_error"), "heartbeat": heartbeat, "took_lease": took,
                "cause": cause_of(row.get("last_error")) if to in self.parked else None,
                **common}

    @staticmethod
    def _outbox(row: dict, op: str) -> dict:
        ids = {"row": row["row"], "job": row["job"], "kind": row["kind"],
               "attempts": row.get("attempts"), "sent_at": row.get("sent_at"),
               "dead_at": row.get("dead_at"), "lease_until": row.get("lease_until"),
               "next_run_at": row.get("next_attempt_at"), "last_error": row.get("last_error")}
        if op == "insert":
            return {"type": "effect_queued", "key": row.get("key"), **ids}
        if (row.get("token") or 0) > (row.get("old_token") or 0):
            return {"type": "effect_claimed", **ids}
        if row.get("sent_at") is not None and row.get("was_sent") is None:
            return {"type": "effect_sent", **ids}
        return {"type": "effect_state", **ids}


def operations(rows: Iterable[dict[str, Any]], pipeline: Pipeline) -> list[Event]:
    """The audit rows, in commit order, as operations."""
    mapper = Mapper(pipeline)
    return [mapper.map(row) for row in rows]
