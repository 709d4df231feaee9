"""The toy engine's store: all of its SQL. One table, `work(key, doc)`, one JSON document per
job; every write is a compare-and-swap on the whole document inside `BEGIN IMMEDIATE`."""
from __future__ import annotations

import json
import sqlite3
from contextlib import contextmanager
from typing import Iterator

from . import jobs

SCHEMA = ("CREATE TABLE IF NOT EXISTS work (key TEXT PRIMARY KEY, doc TEXT NOT NULL)",
          "CREATE INDEX IF NOT EXISTS work_status ON work (json_extract(doc, '$.status'))")


def connect(path: str, busy_timeout: float = 10.0) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit), WAL, synchronous FULL."""
    conn = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None)
    conn.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    return conn


def init(conn: sqlite3.Connection) -> None:
    with write(conn):
        for statement in SCHEMA:
            conn.execute(statement)


@contextmanager
def write(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """The one write transaction: BEGIN IMMEDIATE, rolled back on any exception."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def encode(doc: dict) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False)


def get(conn: sqlite3.Connection, key: str) -> str | None:
    row = conn.execute("SELECT doc FROM work WHERE key=?", (key,)).fetchone()
    return row[0] if row else None


def insert(conn: sqlite3.Connection, key: str, doc: dict) -> None:
    conn.execute("INSERT INTO work (key, doc) VALUES (?, ?)", (key, encode(doc)))


def swap(conn: sqlite3.Connection, key: str, old: str, new: dict) -> str | None:
    """Replace the document `old` of `key` by `new`; the new text, or None when the stored
    document is no longer `old` (someone else wrote first)."""
    text = encode(new)
    n = conn.execute("UPDATE work SET doc=? WHERE key=? AND doc=?", (text, key, old)).rowcount
    return text if n == 1 else None


def in_states(conn: sqlite3.Connection, states: tuple[str, ...]) -> list[tuple[str, str]]:
    """(key, doc) of the jobs in `states`, oldest due first (an index seek on the status)."""
    marks = ",".join("?" * len(states))
    return conn.execute(
        f"SELECT key, doc FROM work WHERE json_extract(doc, '$.status') IN ({marks})"
        " ORDER BY json_extract(doc, '$.not_before')", states).fetchall()


def with_unsent(conn: sqlite3.Connection) -> list[tuple[str, str]]:
    """(key, doc) of the jobs with an effect neither sent nor dead."""
    return conn.execute(
        "SELECT key, doc FROM work WHERE EXISTS (SELECT 1 FROM json_each(doc, '$.effects')"
        " WHERE json_extract(value, '$.sent') = 0 AND json_extract(value, '$.dead') = 0)"
    ).fetchall()


def everything(conn: sqlite3.Connection) -> list[tuple[str, str]]:
    return conn.execute("SELECT key, doc FROM work ORDER BY key").fetchall()


def submit(conn: sqlite3.Connection, key: str, payload, now: float) -> str:
    """Submit idempotently on `key`: "created", "exists" (same payload) or "rejected"
    (another payload; the stored job is untouched). Raises ValueError for a non-JSON payload."""
    doc = jobs.new_doc(payload, now)
    with write(conn):
        old = get(conn, key)
        if old is None:
            insert(conn, key, doc)
            return "created"
    same = jobs.canonical(json.loads(old)["payload"]) == jobs.canonical(doc["payload"])
    return "exists" if same else "rejected"


def update(conn: sqlite3.Connection, key: str, change) -> str:
    """Apply `change(doc) -> doc` to one job in one transaction; the document text now.
    Raises KeyError for an unknown job, and whatever `change` raises."""
    with write(conn):
        old = get(conn, key)
        if old is None:
            raise KeyError(f"no job {key!r}")
        new = change(json.loads(old))
        if encode(new) == old:
            return old  # nothing changed: no write, no audit row
        return swap(conn, key, old, new)


def integrity(conn: sqlite3.Connection) -> list[str]:
    """SQLite's integrity check plus the documents' own: each parses and names a known status."""
    problems = [r[0] for r in conn.execute("PRAGMA integrity_check") if r[0] != "ok"]
    for key, text in everything(conn):
        try:
            status = json.loads(text)["status"]
        except (ValueError, KeyError, TypeError):
            problems.append(f"job {key}: unreadable document")
            continue
        if status not in jobs.STATES:
            problems.append(f"job {key}: unknown status {status!r}")
    return problems
