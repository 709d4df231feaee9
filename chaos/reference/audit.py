"""The reference engine's audit: triggers in the engine database that record every committed change to
job state, memo, outbox and spend rows, in the same transaction as the change.

Because the record commits with the change (or not at all), the audit cannot disagree with
the database. Times come from SQLite's own clock (the machine's real clock, millisecond
precision), never from an engine's injected clock, so a skewed worker cannot hide a write.
"""
from __future__ import annotations

import json
import sqlite3
from typing import Any


NOW = "((julianday('now') - 2440587.5) * 86400.0)"

# length:first 40:last 40 characters of the canonical payload; built-ins only, because the
# triggers run inside engine processes that know nothing of the harness.
PAYLOAD_HASH = "(length({p}) || ':' || substr({p}, 1, 40) || ':' || substr({p}, -40))"


def _job(row: str, op: str, old: str | None) -> str:
    return (f"json_object('job', {row}.id, 'from', {old}, 'to', {row}.state, 'writer',"
            f" {row}.updated_by, 'token', {row}.lease_token, 'old_token',"
            f" {'OLD.lease_token' if op == 'update' else row + '.lease_token'},"
            f" 'claims', {row}.claims, 'attempts', {row}.attempts, 'lease_until',"
            f" {row}.lease_until, 'lease_owner', {row}.lease_owner, 'next_run_at',"
            f" {row}.next_run_at, 'last_error', {row}.last_error, 'payload_hash',"
            f" {PAYLOAD_HASH.format(p=row + '.payload')})")


def _memo(row: str) -> str:
    return (f"json_object('job', {row}.job_id, 'step', {row}.step, 'writer', {row}.worker,"
            f" 'token', {row}.lease_token, 'cost', {row}.cost)")


def _outbox(row: str, op: str) -> str:
    return (f"json_object('row', {row}.id, 'job', {row}.job_id, 'kind', {row}.kind, 'key',"
            f" {row}.idempotency_key, 'was_sent', {'OLD.sent_at' if op == 'update' else 'NULL'},"
            f" 'writer',"
            f" {row}.updated_by, 'token', {row}.lease_token, 'old_token',"
            f" {'OLD.lease_token' if op == 'update' else row + '.lease_token'},"
            f" 'attempts', {row}.attempts, 'sent_at', {row}.sent_at, 'dead_at', {row}.dead_at,"
            f" 'lease_owner', {row}.lease_owner, 'lease_until', {row}.lease_until,"
            f" 'next_attempt_at', {row}.next_attempt_at, 'last_error', {row}.last_error)")


def _spend(row: str) -> str:
    return (f"json_object('job', {row}.job_id, 'step', {row}.step, 'worker', {row}.worker,"
            f" 'token', {row}.lease_token, 'started', {row}.started, 'ended', {row}.ended,"
            f" 'outcome', {row}.outcome, 'cost', {row}.cost, 'error', {row}.error)")


TRIGGERS = {
    ("job", "insert"): _job("NEW", "insert", "NULL"),
    ("job", "update"): _job("NEW", "update", "OLD.state"),
    ("job", "delete"): _job("OLD", "delete", "OLD.state"),
    ("step_result", "insert"): _memo("NEW"),
    ("step_result", "delete"): _memo("OLD"),
    ("outbox", "insert"): _outbox("NEW", "insert"),
    ("outbox", "update"): _outbox("NEW", "update"),
    ("spend", "insert"): _spend("NEW"),
}
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
    rows = []
    for seq, t, kind, op, data in conn.execute(
            "SELECT seq, t, kind, op, data FROM audit WHERE seq > ? ORDER BY seq", (after_seq,)):
        row: dict[str, Any] = {"t": t, "seq": seq, "table": kind, "op": op}
        row.update(json.loads(data))
        rows.append(row)
    return rows
