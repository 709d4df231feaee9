"""The article engine's observer: audit triggers on its three tables, and their rows read as
the history's operations (see `chaos.history`).

The article's tables do not say who wrote a row, so the observer adds what it needs beside
them, never inside them:

- `audit`: one row per committed change to job, step_result or outbox, written by a trigger in
  the same transaction, stamped with SQLite's clock (the machine's real clock).
- `audit_writer`: empty except inside a transaction of the adapter's own controls, which put
  their actor ("operator", "harness", "submitter") there before writing and remove it before
  committing. A change made while it is empty was made by the engine's processes: a worker
  for job and memo rows, the sender for outbox updates.
- A second trigger on `UPDATE OF lease_owner` marks the statements that set the lease owner.
  Only the article's claim sets it (heartbeat, fail_step and the success path do not), so a
  marked update is a claim and an unmarked one that only moves lease_until forward is a
  heartbeat, whoever the owner is.
"""
from __future__ import annotations

import json
import sqlite3
from contextlib import contextmanager
from typing import Any, Iterator

from chaos.history import Event

from . import engine

NOW = "((julianday('now') - 2440587.5) * 86400.0)"
HASH = "(length({p}) || ':' || substr({p}, 1, 40) || ':' || substr({p}, -40))"
ACTOR = "(SELECT actor FROM audit_writer LIMIT 1)"


def _job(row: str) -> str:
    return (f"'job', {row}.id, 'to', {row}.state, 'attempts', {row}.attempts, 'next_run_at',"
            f" {row}.next_run_at, 'lease_until', {row}.lease_until, 'lease_owner',"
            f" {row}.lease_owner, 'last_error', {row}.last_error, 'payload_hash',"
            f" {HASH.format(p=row + '.payload')}, 'actor', {ACTOR}")


TRIGGERS = {
    "job_insert": ("INSERT ON job", "job", "insert", f"json_object({_job('NEW')})"),
    "job_update": ("UPDATE ON job", "job", "update", (
        f"json_object({_job('NEW')}, 'from', OLD.state, 'old_attempts', OLD.attempts,"
        " 'old_next_run_at', OLD.next_run_at, 'old_lease_until', OLD.lease_until,"
        " 'old_owner', OLD.lease_owner, 'old_last_error', OLD.last_error)")),
    "job_owner": ("UPDATE OF lease_owner ON job", "job", "owner_set", (
        "json_object('job', NEW.id, 'from', OLD.state, 'to', NEW.state, 'lease_until',"
        " NEW.lease_until, 'old_lease_until', OLD.lease_until, 'lease_owner', NEW.lease_owner)")),
    "job_delete": ("DELETE ON job", "job", "delete",
                   f"json_object('job', OLD.id, 'from', OLD.state, 'payload_hash',"
                   f" {HASH.format(p='OLD.payload')}, 'actor', {ACTOR})"),
    "memo_insert": ("INSERT ON step_result", "memo", "insert",
                    f"json_object('job', NEW.job_id, 'step', NEW.step, 'cost', NEW.cost,"
                    f" 'actor', {ACTOR})"),
    "memo_delete": ("DELETE ON step_result", "memo", "delete",
                    f"json_object('job', OLD.job_id, 'step', OLD.step, 'cost', OLD.cost,"
                    f" 'actor', {ACTOR})"),
    "outbox_insert": ("INSERT ON outbox", "outbox", "insert",
                      f"json_object('row', NEW.id, 'job', NEW.job_id, 'kind', NEW.kind,"
                      f" 'attempts', NEW.attempts, 'sent_at', NEW.sent_at, 'actor', {ACTOR})"),
    "outbox_update": ("UPDATE ON outbox", "outbox", "update",
                      f"json_object('row', NEW.id, 'job', NEW.job_id, 'kind', NEW.kind,"
                      f" 'attempts', NEW.attempts, 'sent_at', NEW.sent_at, 'old_sent_at',"
                      f" OLD.sent_at, 'actor', {ACTOR})"),
}


def install(conn: sqlite3.Connection, now: str = NOW) -> None:
    """Create the audit tables and triggers (idempotent), inside the caller's transaction,
    stamping with the SQL `now`."""
    conn.execute("CREATE TABLE IF NOT EXISTS audit (seq INTEGER PRIMARY KEY, t REAL NOT NULL,"
                 " kind TEXT NOT NULL, op TEXT NOT NULL, data TEXT NOT NULL)")
    conn.execute("CREATE TABLE IF NOT EXISTS audit_writer (actor TEXT NOT NULL)")
    for name, (event, kind, op, body) in TRIGGERS.items():
        conn.execute(f"CREATE TRIGGER IF NOT EXISTS audit_{name} AFTER {event} BEGIN"
                     f" INSERT INTO audit (t, kind, op, data) VALUES ({now}, '{kind}', '{op}',"
                     f" {body}); END")


@contextmanager
def written_by(conn: sqlite3.Connection, actor: str) -> Iterator[sqlite3.Connection]:
    """One write transaction (BEGIN IMMEDIATE, rollback on any exception) whose changes the
    audit attributes to `actor`. `conn` must be in autocommit mode (isolation_level None)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("INSERT INTO audit_writer (actor) VALUES (?)", (actor,))
        yield conn
        conn.execute("DELETE FROM audit_writer")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def pid_of(worker: str | None) -> int | None:
    """The process id in the article's worker id, hostname:pid."""
    try:
        return int((worker or "").rsplit(":", 1)[1])
    except (IndexError, ValueError):
        return None


RETRYABLE_NAMES = frozenset(cls.__name__ for cls in engine.RETRYABLE)


def cause_of(last_error: str | None) -> str | None:
    """Why fail_step parked a job, from the repr(exc) it wrote: a retryable error that ran out
    of attempts, or poison (anything else; the article retries nothing else). The review flag
    of the verify step is neither. The article has no crash-loop cap, so never "crash_loop"."""
    if not last_error:
        return None
    name = last_error.split("(", 1)[0]
    if name == engine.NeedsReview.__name__:
        return None
    return "attempts" if name in RETRYABLE_NAMES else "poison"


def read_rows(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """The audit rows in commit order, their data decoded."""
    return [{"seq": seq, "t": t, "kind": kind, "op": op, **json.loads(data)}
            for seq, t, kind, op, data in conn.execute(
                "SELECT seq, t, kind, op, data FROM audit ORDER BY seq")]


#: What an owner_set row and the update row of the same statement both record.
SAME_WRITE = ("job", "t", "from", "to", "lease_until", "old_lease_until", "lease_owner")


def claims(rows: list[dict[str, Any]]) -> set[int]:
    """The seq of every job update made by a statement that set lease_owner. Its owner_set
    row was written by the same statement, for the same row, just after or just before (the
    order two triggers fire in is SQLite's to choose), with the same values; the statement
    before it may share the millisecond, never the old and new lease together."""
    marked = set()
    for i, row in enumerate(rows):
        if row["op"] != "owner_set":
            continue
        for j in (i + 1, i - 1):
            other = rows[j] if 0 <= j < len(rows) else None
            if other and other["kind"] == "job" and other["op"] == "update" \
                    and other["seq"] not in marked \
                    and all(other.get(k) == row.get(k) for k in SAME_WRITE):
                marked.add(other["seq"])
                break
    return marked


def operations(rows: list[dict[str, Any]], parked: frozenset[str]) -> list[Event]:
    """The audit rows as the history's engine operations."""
    marked = claims(rows)
    events = []
    for row in rows:
        if row["op"] == "owner_set":
            continue
        base = {"t": row["t"], "src": "engine", "seq": row["seq"], "completion": "ok",
                "token": None}
        if row["kind"] == "job":
            events.append({**base, **_job_op(row, row["seq"] in marked, parked)})
        elif row["kind"] == "memo":
            events.append({**base, "type": "memo", "op": row["op"], "job": row["job"],
                           "step": row["step"], "cost": row["cost"],
                           "actor": row.get("actor") or "worker", "worker": None, "pid": None})
        else:
            events.append({**base, **_outbox_op(row)})
    return events


def _job_op(row: dict[str, Any], claim: bool, parked: frozenset[str]) -> dict[str, Any]:
    actor = row.get("actor") or "worker"
    common = {"job": row["job"], "actor": actor, "attempts": row.get("attempts"),
              "claims": None, "lease_until": row.get("lease_until"), "worker": None,
              "pid": None, "payload_hash": row.get("payload_hash")}
    if row["op"] == "insert":
        return {**common, "type": "submitted", "state": row["to"], "from": None,
                "to": row["to"]}
    if row["op"] == "delete":
        return {**common, "type": "removed", "from": row["from"], "to": None}
    frm, to, owner = row["from"], row["to"], row["lease_owner"]
    if claim and actor == "worker":
        step = engine.STEP_FOR_STATE.get(frm)
        return {**common, "type": "claimed", "step": step.name if step else None, "from": frm,
                "to": to, "worker": owner, "pid": pid_of(owner)}
    heartbeat = (actor == "worker" and frm == to and owner == row["old_owner"]
                 and row["lease_until"] > row["old_lease_until"]
                 and row["attempts"] == row["old_attempts"]
                 and row["next_run_at"] == row["old_next_run_at"]
                 and row["last_error"] == row["old_last_error"])
    if heartbeat:  # heartbeat() writes only where lease_owner is the writer
        common.update(worker=owner, pid=pid_of(owner))
    return {**common, "type": "state", "from": frm, "to": to, "lease_owner": owner,
            "next_run_at": row["next_run_at"], "last_error": row["last_error"],
            "cause": cause_of(row["last_error"]) if to in parked else None,
            "heartbeat": heartbeat}


def _outbox_op(row: dict[str, Any]) -> dict[str, Any]:
    ids = {"row": row["row"], "job": row["job"], "kind": row["kind"],
           "attempts": row["attempts"], "worker": None, "pid": None}
    if row["op"] == "insert":
        return {**ids, "type": "effect_queued", "key": str(row["row"]),
                "actor": row.get("actor") or "worker"}
    actor = row.get("actor") or "sender"
    if row["sent_at"] is not None and row["old_sent_at"] is None:
        return {**ids, "type": "effect_sent", "actor": actor}
    # the article's outbox has no sender lease and no dead letters: None is the true reading
    return {**ids, "type": "effect_state", "actor": actor, "sent": row["sent_at"] is not None,
            "sent_at": row["sent_at"], "dead": None, "dead_at": None, "lease_until": None,
            "last_error": None}
