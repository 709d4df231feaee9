"""The SQS engine's observer: triggers that copy every change of the job, task and outbox
rows into an audit table in the same transaction, and the reading of those rows as the
history's operations (see `chaos.history`). The engine knows nothing of it.

A job row says who made its last write (`writer`, `actor`), under which receipt (`receipt`,
the fencing token) and what kind of write it was (`write`); a receive is a claim. A task
change that only moves its visibility is a heartbeat (its `beats` count goes up, naming who
beat under which receipt) or the harness's forced expiry (`moved_by`); any other task change
commits with a job write that says it all.
"""
from __future__ import annotations

import json
import sqlite3
from typing import Any

from chaos.history import Event

NOW = "((julianday('now') - 2440587.5) * 86400.0)"
AUDIT = ("CREATE TABLE IF NOT EXISTS sqs_audit (seq INTEGER PRIMARY KEY, t REAL NOT NULL,"
         " tbl TEXT NOT NULL, old TEXT, new TEXT)")
COLUMNS = {
    "job": ("id", "state", "payload_hash", "memo", "step", "attempts", "receives", "error",
            "cause", "write", "actor", "writer", "receipt", "lease_until", "next_run_at"),
    "task": ("id", "job", "step", "visible_at", "receipt", "holder", "receives", "attempts",
             "beats", "beat_by", "beat_receipt", "moved_by"),
    "outbox": ("id", "job", "kind", "key", "visible_at", "receipt", "holder", "receives",
               "sent_at", "dead_at", "error", "writer", "write"),
}


def _row(table: str, ref: str) -> str:
    pairs = ", ".join(f"'{c}', {ref}.{c}" for c in COLUMNS[table])
    extra = (f", 'job_state', (SELECT state FROM job WHERE id={ref}.job)"
             if table == "task" else "")
    return f"json_object({pairs}{extra})"


def install(conn: sqlite3.Connection, now: str = NOW) -> None:
    """Create the audit table and its triggers (idempotent), stamping with the SQL `now`."""
    conn.execute(AUDIT)
    for table in COLUMNS:
        for op in ("insert", "update", "delete"):
            old = _row(table, "OLD") if op != "insert" else "NULL"
            new = _row(table, "NEW") if op != "delete" else "NULL"
            conn.execute(f"CREATE TRIGGER IF NOT EXISTS sqs_audit_{table}_{op} AFTER"
                         f" {op.upper()} ON {table} BEGIN INSERT INTO sqs_audit (t, tbl, old, new)"
                         f" VALUES ({now}, '{table}', {old}, {new}); END")


def read(conn: sqlite3.Connection) -> list[Event]:
    """Every audit row as operations, in commit order."""
    events: list[Event] = []
    for seq, t, table, old, new in conn.execute(
            "SELECT seq, t, tbl, old, new FROM sqs_audit ORDER BY seq"):
        old, new = (json.loads(old) if old else None), (json.loads(new) if new else None)
        row = new or old
        base = {"t": t, "src": "engine", "seq": seq, "completion": "ok", "job": row["job"]
                if table != "job" else row["id"]}
        events += [{**base, **op} for op in READERS[table](old, new)]
    return events


def pid_of(writer: str | None) -> int | None:
    """The process id inside a writer id (sqs-<pid>-<random>), or None."""
    parts = (writer or "").split("-")
    try:
        return int(parts[1]) if len(parts) == 3 and parts[0] == "sqs" else None
    except ValueError:
        return None


def _who(writer: str | None, receipt: str | None) -> dict:
    return {"worker": writer, "pid": pid_of(writer), "token": receipt}


def _job(old: dict | None, new: dict | None) -> list[dict]:
    if old is None:
        return [{"type": "submitted", "state": new["state"], "from": None, "to": new["state"],
                 "payload_hash": new["payload_hash"], "actor": "submitter"}]
    if new is None:
        return [{"type": "removed", "from": old["state"], "to": None, "actor": "operator"}]
    who = _who(new["writer"], new["receipt"])
    before, after = json.loads(old["memo"]), json.loads(new["memo"])
    ops = [{"type": "memo", "op": "insert", "step": step, "cost": memo["cost"],
            "actor": "worker", **_who(memo["by"], new["receipt"])}
           for step, memo in after.items() if step not in before]
    common = {"from": old["state"], "to": new["state"], "attempts": new["attempts"],
              "claims": new["receives"], "lease_until": new["lease_until"],
              "next_run_at": new["next_run_at"], **who}
    if new["write"] == "receive":
        ops.append({"type": "claimed", "step": new["step"], "continued": False,
                    "actor": "worker", **common})
    else:
        # A receive that finds its task past the receive cap dead-letters it (a park under
        # no receipt): it took the job from whoever held it last, as a claim does.
        took = new["write"] == "park" and new["receipt"] is None and new["actor"] == "worker"
        ops.append({"type": "state", "actor": new["actor"], "last_error": new["error"],
                    "cause": new["cause"], "heartbeat": False, "took_lease": took,
                    "payload_hash": new["payload_hash"], **common})
    return ops


def _task(old: dict | None, new: dict | None) -> list[dict]:
    """A heartbeat or a forced expiry; any other task change is told by its job's write."""
    if old is None or new is None or new["visible_at"] == old["visible_at"]:
        return []
    state = new["job_state"]
    common = {"type": "state", "from": state, "to": state, "lease_until": new["visible_at"],
              "attempts": new["attempts"], "claims": new["receives"], "took_lease": False}
    if new["beats"] > old["beats"]:
        return [{**common, "actor": "worker", "heartbeat": True,
                 **_who(new["beat_by"], new["beat_receipt"])}]
    if new["moved_by"] == "harness" and new["visible_at"] < old["visible_at"]:
        return [{**common, "actor": "harness", "heartbeat": False, "worker": "harness",
                 "pid": None, "token": None}]
    return []


def _outbox(old: dict | None, new: dict | None) -> list[dict]:
    if new is None:
        return []
    row = {"row": new["id"], "kind": new["kind"]}
    if old is None:
        return [{"type": "effect_queued", "key": new["key"], "actor": "worker",
                 "attempts": 0, "lease_until": None, "next_run_at": None, "sent_at": None,
                 "dead_at": None, **row, **_who(new["writer"], None)}]
    if new["write"] == "expire":
        return [{"type": "effect_state", "actor": "harness", "worker": "harness", "pid": None,
                 "token": None, "sent": False, "dead": False, "sent_at": None, "dead_at": None,
                 "last_error": new["error"], "lease_until": new["visible_at"],
                 "attempts": new["receives"], **row}]
    who = {**_who(new["writer"], new["receipt"]), "actor": "sender",
           "attempts": new["receives"]}
    if new["receipt"] != old["receipt"]:
        return [{"type": "effect_claimed", **row, **who, "lease_until": new["visible_at"],
                 "sent_at": None, "dead_at": None, "last_error": new["error"]}]
    if new["sent_at"] is not None and old["sent_at"] is None:
        return [{"type": "effect_sent", **row, **who, "sent_at": new["sent_at"]}]
    return [{"type": "effect_state", **row, **who, "sent": new["sent_at"] is not None,
             "dead": new["dead_at"] is not None, "sent_at": new["sent_at"],
             "dead_at": new["dead_at"], "last_error": new["error"], "lease_until": None,
             "next_run_at": new["visible_at"] if new["dead_at"] is None else None}]


READERS = {"job": _job, "task": _task, "outbox": _outbox}


def snapshot(conn: sqlite3.Connection) -> dict[str, Any]:
    """The final rows in the contract's neutral form."""
    jobs, memos = {}, []
    for job, state, attempts, receives, error, payload_hash, cause, memo in conn.execute(
            "SELECT id, state, attempts, receives, error, payload_hash, cause, memo FROM job"):
        jobs[job] = {"state": state, "attempts": attempts, "claims": receives,
                     "last_error": error, "payload_hash": payload_hash, "cause": cause}
        memos += [{"job": job, "step": step, "cost": m["cost"]}
                  for step, m in json.loads(memo).items()]
    outbox = [{"row": row, "job": job, "kind": kind, "key": key, "sent_at": sent_at,
               "dead_at": dead_at, "attempts": receives, "last_error": error}
              for row, job, kind, key, sent_at, dead_at, receives, error in conn.execute(
                  "SELECT id, job, kind, key, sent_at, dead_at, receives, error FROM outbox")]
    orphans = {f"{table}_without_job": conn.execute(
        f"SELECT COUNT(*) FROM {table} WHERE job NOT IN (SELECT id FROM job)").fetchone()[0]
        for table in ("task", "outbox")}
    return {"jobs": jobs, "memos": memos, "outbox": outbox, "spend": None, "orphans": orphans}


def progress(conn: sqlite3.Connection) -> dict[str, Any]:
    states = dict(conn.execute("SELECT state, COUNT(*) FROM job GROUP BY state"))
    unsent = conn.execute("SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL AND dead_at IS NULL"
                          ).fetchone()[0]
    return {"states": states, "unsent": unsent}

