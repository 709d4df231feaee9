"""Storage: one small interface, one module per backend. SQLite is the embedded default."""
from __future__ import annotations

import os

from .base import (Claim, DatabaseError, Effect, LeaseLost, OutboxClaim, Spend, StoreBusy,
                   SubmissionConflict, canonical_json)
from .operator import OperatorError
from .sqlite import SQLiteStore

__all__ = ["Claim", "DatabaseError", "Effect", "LeaseLost", "OperatorError", "OutboxClaim", "SQLiteStore",
           "Spend", "StoreBusy", "SubmissionConflict", "canonical_json", "open_store"]


def open_store(target: str | os.PathLike, **options) -> SQLiteStore:
    """Open the store at `target`: a SQLite file path (or `sqlite:///path`)."""
    target = os.fspath(target)
    if target.startswith("sqlite:///"):
        target = target[len("sqlite:///"):]
    elif "://" in target:
        scheme = target.split("://", 1)[0]
        raise DatabaseError(f"unsupported database URL scheme {scheme!r} in {target!r}; "
                            "use a file path or sqlite:///path")
    return SQLiteStore(target, **options)
