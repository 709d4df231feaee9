"""The reference adapter on PostgreSQL: the audit as PL/pgSQL triggers, and the observer's
and controls' reads and writes on a server.

The triggers record what the SQLite triggers record (`chaos.reference.audit.triggers`, one
definition in two dialects), AFTER each row change and IN ITS TRANSACTION: the audit row
commits with the change or not at all, so the audit cannot disagree with the database.
`seq` is a sequence, taken inside the writing transaction; a row another transaction
changes next waits for this one's row lock, so the changes of one row are in commit order
(which the observer's mapping relies on), while the changes of two rows committed at once
may be numbered either way, as their times are. Times are the server's clock
(clock_timestamp()), never a worker's: a skewed worker cannot hide a write.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Any, Iterator

import psycopg

from chaos.reference import audit

#: Seconds since the epoch on the server's clock, when the trigger runs.
NOW = "extract(epoch FROM clock_timestamp())::float8"
TABLES = ("job", "step_result", "outbox", "spend")


def connect(url: str, *, autocommit: bool = True) -> psycopg.Connection:
    """A connection of the harness to the engine database at `url` (no password in it:
    libpq reads PGPASSWORD from the environment)."""
    return psycopg.connect(url, autocommit=autocommit, connect_timeout=10)


def install(conn: psycopg.Connection) -> None:
    """Create the audit table, one trigger function per (table, op) and its trigger
    (idempotent), in the caller's transaction."""
    conn.execute("CREATE TABLE IF NOT EXISTS audit (seq BIGSERIAL PRIMARY KEY,"
                 " t DOUBLE PRECISION NOT NULL, kind TEXT NOT NULL, op TEXT NOT NULL,"
                 " data TEXT NOT NULL)")
    for (table, op), body in audit.triggers(audit.POSTGRES).items():
        name = f"audit_{table}_{op}"
        conn.execute(
            f"CREATE OR REPLACE FUNCTION {name}() RETURNS trigger LANGUAGE plpgsql AS $$"
            f" BEGIN INSERT INTO audit (t, kind, op, data)"
            f" VALUES ({NOW}, '{audit.KIND[table]}', '{op}', ({body})::text);"
            f" RETURN NULL; END $$")
        conn.execute(f"DROP TRIGGER IF EXISTS {name} ON {table}")
        conn.execute(f"CREATE TRIGGER {name} AFTER {op.upper()} ON {table}"
                     f" FOR EACH ROW EXECUTE FUNCTION {name}()")


def read_audit(conn: psycopg.Connection, after_seq: int = 0) -> list[dict[str, Any]]:
    """The audit rows after `after_seq`, in `seq` order, as `audit.read_audit` gives them."""
    return audit.audit_rows(conn.execute(
        "SELECT seq, t, kind, op, data FROM audit WHERE seq > %s ORDER BY seq", (after_seq,)))


def triggers_missing(conn: psycopg.Connection) -> list[str]:
    """The audit triggers that are not installed (none, when the observer is whole)."""
    present = {r[0] for r in conn.execute(
        "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal AND tgname LIKE 'audit_%'")}
    return sorted(f"audit_{t}_{op}" for t, op in audit.TRIGGERS
                  if f"audit_{t}_{op}" not in present)


def progress(url: str) -> dict[str, Any]:
    """Jobs per state and unsent outbox rows now (the contract's `progress`)."""
    with connect(url) as conn:
        states = dict(conn.execute("SELECT state, COUNT(*) FROM job GROUP BY state").fetchall())
        unsent = conn.execute("SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL AND"
                              " dead_at IS NULL").fetchone()[0]
    return {"states": states, "unsent": unsent}


def server_now(cur: Any) -> float:
    """The server's clock now, which places every lease on PostgreSQL."""
    return cur.execute(f"SELECT {NOW}").fetchone()[0]


@contextmanager
def hold_write_lock(url: str) -> Iterator[None]:
    """Hold every engine table in EXCLUSIVE mode until the block ends, then roll back.

    EXCLUSIVE blocks every write and every SELECT ... FOR UPDATE (a claim), and lets plain
    reads through, as SQLite's BEGIN IMMEDIATE does: the engine's writes wait on the server
    up to their lock_timeout, then retry as busy."""
    conn = connect(url, autocommit=False)
    try:
        _lock_tables(conn)
        try:
            yield
        finally:
            conn.rollback()
    finally:
        conn.close()


#: How long hold_write_lock tries for the tables before it gives the fault up (as long as
#: chaos.sqlite.hold_write_lock waits for its lock), and the wait between two tries.
LOCK_PATIENCE, LOCK_RETRY = 10.0, 0.005


def _lock_tables(conn: psycopg.Connection, patience: float = LOCK_PATIENCE) -> None:
    """Take every engine table at once or none, as SQLite's BEGIN IMMEDIATE takes its lock:
    LOCK TABLE ... NOWAIT, tried again until `patience` runs out (then LockNotAvailable).

    A LOCK TABLE that waits takes the tables one by one and holds those it has while it
    waits for the next, and its place in the lock queue stops every later write: the store
    is locked before the harness knows it holds the lock (and records the fault's window),
    and a transaction holding a later table that wants an earlier one deadlocks with it,
    the store held for the server's deadlock_timeout (a second) with no window recorded.
    A try that fails holds nothing."""
    deadline = time.monotonic() + patience
    while True:
        try:
            conn.execute(f"LOCK TABLE {', '.join(TABLES)} IN EXCLUSIVE MODE NOWAIT")
            return
        except psycopg.errors.LockNotAvailable:
            conn.rollback()  # releases the tables this try took
            if time.monotonic() >= deadline:
                raise
            time.sleep(LOCK_RETRY)


#: Where the row_lock fault looks for a row to lock, in this order: (table, its rows an
#: engine process is about to write): a job under a live lease, a job still to run, an
#: outbox row not yet sent nor dead-lettered.
ROW_TARGETS = (("job", f"SELECT id, id FROM job WHERE lease_until > {NOW}"),
               ("job", "SELECT id, id FROM job WHERE next_run_at IS NOT NULL"),
               ("outbox", "SELECT id, job_id FROM outbox WHERE sent_at IS NULL"
                          " AND dead_at IS NULL"))


@contextmanager
def hold_row_lock(url: str, pick: int) -> Iterator[dict | None]:
    """Hold one row's lock (SELECT ... FOR UPDATE, as an operator's session or a report that
    means to write it would) until the block ends, then roll back. The row is the
    `pick`-th (mod their number) of the first of ROW_TARGETS that has any, or the next free
    one (`_lock_one`). Yields {"table", "row", "job"}, or None when nothing is left
    unfinished. A claim passes the row over (SKIP LOCKED); a write of it waits, up to the
    writer's lock_timeout."""
    conn = connect(url, autocommit=False)
    try:
        target = next((t for table, sql in ROW_TARGETS
                       if (t := _lock_one(conn, table, sql, pick)) is not None), None)
        try:
            yield target
        finally:
            conn.rollback()
    finally:
        conn.close()


def _lock_one(conn: psycopg.Connection, table: str, sql: str, pick: int) -> dict | None:
    """Lock the `pick`-th row `sql` finds, or the next after it that no writer holds at this
    moment (a row being written is passed over, never waited for); {"table", "row", "job"},
    or None when none could be had."""
    rows = conn.execute(sql + " ORDER BY id").fetchall()
    start = pick % len(rows) if rows else 0
    for row, job in rows[start:] + rows[:start]:
        if conn.execute(f"SELECT id FROM {table} WHERE id = %s FOR UPDATE SKIP LOCKED",
                        (row,)).fetchone():
            return {"table": table, "row": row, "job": job}
    return None


def integrity(url: str, store_check: str) -> str:
    """What can go wrong with a PostgreSQL engine database when an engine process is killed,
    and is checked: the server answers, the schema is current (`store_check`, the store's own
    `integrity_check`), and the audit's triggers are all in place. Pages are the server's
    business (WAL; a killed client cannot tear them). "ok", or the problems."""
    with connect(url) as conn:
        missing = triggers_missing(conn)
    problems = [p for p in (store_check if store_check != "ok" else "",
                            f"audit triggers missing: {', '.join(missing)}" if missing else "")
                if p]
    return "; ".join(problems) or "ok"
