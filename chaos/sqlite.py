"""Controls any adapter of an engine that keeps its state in one SQLite file can share: the
write lock the contention fault holds, and the integrity check db-intact reads."""
from __future__ import annotations

import sqlite3
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def hold_write_lock(db: str, timeout: float = 10.0) -> Iterator[None]:
    """Hold `db`'s write lock (BEGIN IMMEDIATE) until the block ends, then roll back."""
    conn = sqlite3.connect(db, timeout=timeout, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            conn.execute("ROLLBACK")
    finally:
        conn.close()


def integrity(db: str, timeout: float = 10.0) -> str:
    """PRAGMA integrity_check of `db` on its own connection: "ok", or the problems found."""
    conn = sqlite3.connect(db, timeout=timeout)
    try:
        return "; ".join(r[0] for r in conn.execute("PRAGMA integrity_check"))
    finally:
        conn.close()
