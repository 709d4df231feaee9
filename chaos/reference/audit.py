"""The reference engine's audit: triggers in the engine database that record every committed change to
job state, memo, outbox and spend rows, in the same transaction as the change.

Because the record commits with the change (or not at all), the audit cannot disagree with
the database. Times come from SQLite's own clock (the machine's real clock, millisecond
precision), never from an engine's injected clock, so a skewed worker cannot hide a write.
"""
from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from typing import Any, Iterable


NOW = "((julianday('now') - 2440587.5) * 86400.0)"


@dataclass(frozen=True)
class Dialect:
    """How one database spells the audit's two expressions: a JSON object of key-value
    pairs, and the payload's hash (length:first 40:last 40 characters of the canonical
    payload; built-ins only, because the triggers run inside engine processes that know
    nothing of the harness)."""

    json_object: str
    payload_hash: str


SQLITE = Dialect("json_object",
                 "(length({p}) || ':' || substr({p}, 1, 40) || ':' || substr({p}, -40))")
#: PostgreSQL (chaos.reference.pg_audit): the same object, the same hash.
POSTGRES = Dialect("json_build_object",
                   "(length({p}) || ':' || substr({p}, 1, 40) || ':' || right({p}, 40))")

Fields = tuple[tuple[str, str], ...]


def _job(row: str, op: str, old: str, d: Dialect) -> Fields:
    return (("job", f"{row}.id"), ("from", old), ("to", f"{row}.state"),
            ("writer", f"{row}.updated_by"), ("token", f"{row}.lease_token"),
            ("old_token", "OLD.lease_token" if op == "update" else f"{row}.lease_token"),
            ("claims", f"{row}.claims"), ("attempts", f"{row}.attempts"),
            ("lease_until", f"{row}.lease_until"), ("lease_owner", f"{row}.lease_owner"),
            ("next_run_at", f"{row}.next_run_at"), ("last_error", f"{row}.last_error"),
            ("payload_hash", d.payload_hash.format(p=f"{row}.payload")))


def _memo(row: str, d: Dialect) -> Fields:
    return (("job", f"{row}.job_id"), ("step", f"{row}.step"), ("writer", f"{row}.worker"),
            ("token", f"{row}.lease_token"), ("cost", f"{row}.cost"))


def _outbox(row: str, op: str, d: Dialect) -> Fields:
    return (("row", f"{row}.id"), ("job", f"{row}.job_id"), ("kind", f"{row}.kind"),
            ("key", f"{row}.idempotency_key"),
            ("was_sent", "OLD.sent_at" if op == "update" else "NULL"),
            ("writer", f"{row}.updated_by"), ("token", f"{row}.lease_token"),
            ("old_token", "OLD.lease_token" if op == "update" else f"{row}.lease_token"),
            ("attempts", f"{row}.attempts"), ("sent_at", f"{row}.sent_at"),
            ("dead_at", f"{row}.dead_at"), ("lease_owner", f"{row}.lease_owner"),
            ("lease_until", f"{row}.lease_until"),
            ("next_attempt_at", f"{row}.next_attempt_at"), ("last_error", f"{row}.last_error"))


def _spend(row: str, d: Dialect) -> Fields:
    return (("job", f"{row}.job_id"), ("step", f"{row}.step"), ("worker", f"{row}.worker"),
            ("token", f"{row}.lease_token"), ("started", f"{row}.started"),
            ("ended", f"{row}.ended"), ("outcome", f"{row}.outcome"), ("cost", f"{row}.cost"),
            ("error", f"{row}.error"))


def triggers(d: Dialect) -> dict[tuple[str, str], str]:
    """(table, op) -> the JSON expression its trigger records, in dialect `d`: one
    definition of what the audit holds, for every backend."""
    fields = {
        ("job", "insert"): _job("NEW", "insert", "NULL", d),
        ("job", "update"): _job("NEW", "update", "OLD.state", d),
        ("job", "delete"): _job("OLD", "delete", "OLD.state", d),
        ("step_result", "insert"): _memo("NEW", d),
        ("step_result", "delete"): _memo("OLD", d),
        ("outbox", "insert"): _outbox("NEW", "insert", d),
        ("outbox", "update"): _outbox("NEW", "update", d),
        ("spend", "insert"): _spend("NEW", d),
    }
    return {key: f"{d.json_object}(" + ", ".join(f"'{k}', {v}" for k, v in pairs) + ")"
            for key, pairs in fields.items()}


TRIGGERS = triggers(SQLITE)
KIND = {"job": "job", "step_result": "memo", "outbox": "outbox", "spend": "spend"}


def install(conn: sqlite3.Connection) -> None:
    """Create the audit table and its triggers (idempotent)."""
    conn.execute("CREATE TABLE IF NOT EXISTS audit (seq INTEGER PRIMARY KEY, t REAL NOT NULL,"
                 " kind TEXT NOT NULL, op TEXT NOT NULL, data TEXT NOT NULL)")
    for (table, op), body in TRIGGERS.items():
        conn.execute(
            f"CREATE TRIGGER IF NOT EXISTS audit_{table}_{op} AFTER {op.upper()} ON {table}"
            f" BEGIN INSERT INTO audit (t, kind, op, data)"
            f" VALUES ({NOW}, '{KIND[table]}', '{op}', {body}); END")


def uninstall(conn: sqlite3.Connection) -> None:
    """Drop the triggers (the audit table and its rows stay)."""
    for table, op in TRIGGERS:
        conn.execute(f"DROP TRIGGER IF EXISTS audit_{table}_{op}")


def read_audit(conn: sqlite3.Connection, after_seq: int = 0) -> list[dict[str, Any]]:
    """The audit rows after `after_seq`, in commit order: {"t", "seq", "table", "op", ...}
    (read as operations by `chaos.reference.observer`)."""
    return audit_rows(conn.execute(
        "SELECT seq, t, kind, op, data FROM audit WHERE seq > ? ORDER BY seq", (after_seq,)))


def audit_rows(rows: Iterable[tuple]) -> list[dict[str, Any]]:
    """Rows of (seq, t, kind, op, data) as the observer reads them, on any backend."""
    read = []
    for seq, t, kind, op, data in rows:
        row: dict[str, Any] = {"t": t, "seq": seq, "table": kind, "op": op}
        row.update(json.loads(data))
        read.append(row)
    return read
