"""Storage: the `Store` protocol, one module per backend. SQLite is the embedded default;
PostgreSQL serves workers on several hosts."""
from __future__ import annotations

import os
import re
from typing import Any

from .base import (Claim, ConnectionDropped, DatabaseError, Effect, LeaseLost, OutboxClaim,
                   Spend, StoreBusy, SubmissionConflict, canonical_json)
from .operator import OperatorError
from .protocol import Store
from .sqlite import SQLiteStore

__all__ = ["Claim", "ConnectionDropped", "DatabaseError", "Effect", "LeaseLost", "OperatorError",
           "OutboxClaim", "PostgresStore", "SQLiteStore", "Spend", "Store", "StoreBusy",
           "SubmissionConflict", "canonical_json", "is_postgres_url", "open_store",
           "shown_target"]

POSTGRES_SCHEMES = ("postgresql://", "postgres://")


def is_postgres_url(target: str | os.PathLike) -> bool:
    """True when `target` names a PostgreSQL database (a postgresql:// URL)."""
    return os.fspath(target).startswith(POSTGRES_SCHEMES)


def shown_target(target: str | os.PathLike) -> str:
    """`target` as it may be printed or logged: a URL's password replaced by ***."""
    return re.sub(r"://([^:/@]*):[^@]*@", r"://\1:***@", os.fspath(target))


def open_store(target: str | os.PathLike, **options: Any) -> Store:
    """Open the store at `target`: a SQLite file path (or `sqlite:///path`), or a
    `postgresql://user@host:port/dbname` URL.

    options go to the backend (synchronous, busy_timeout, read_only for both; lease_clock
    for PostgreSQL). Raises DatabaseError for another URL scheme, naming it.
    """
    target = os.fspath(target)
    if is_postgres_url(target):
        from .postgres import PostgresStore  # psycopg is imported only by who uses it
        return PostgresStore(target, **options)
    if target.startswith("sqlite:///"):
        target = target[len("sqlite:///"):]
    elif "://" in target:
        scheme = target.split("://", 1)[0]
        raise DatabaseError(f"unsupported database URL scheme {scheme!r} in {target!r}; "
                            "use a file path, sqlite:///path or postgresql://...")
    return SQLiteStore(target, **options)


def __getattr__(name: str) -> Any:
    if name == "PostgresStore":
        from .postgres import PostgresStore
        return PostgresStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
