"""Opening an engine database file: SQLite's errors said as the engine says them, and a file
refused before anything is written to it when SQLite's quick check finds it corrupt, or
when it holds another program's tables and no engine schema."""
from __future__ import annotations

import json
import os
import sqlite3

from .base import DatabaseError


def connect(path: str, synchronous: str, busy_timeout: float,
            read_only: bool) -> sqlite3.Connection:
    """A connection to the engine database at `path`, in WAL mode with `synchronous`, after
    `refuse_unusable` found the file sound and the engine's. Raises DatabaseError naming
    the file (StoreBusy when it stays locked)."""
    if read_only and not os.path.exists(path):
        raise DatabaseError(f"database {path} does not exist")
    target = f"file:{path}?mode=ro" if read_only else path
    try:
        conn = sqlite3.connect(target, uri=read_only, isolation_level=None,
                               timeout=busy_timeout, check_same_thread=False)
    except sqlite3.Error as exc:
        raise explain(exc, path, "open") from exc
    try:
        conn.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
        refuse_unusable(conn, path)  # before WAL mode, which rewrites the file's header
        if not read_only:
            conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={synchronous}")
        conn.execute("PRAGMA foreign_keys=ON")
    except sqlite3.Error as exc:
        conn.close()
        raise explain(exc, path, "open") from exc
    except DatabaseError:
        conn.close()
        raise
    return conn


def refuse_unusable(conn: sqlite3.Connection, path: str) -> None:
    """Raise DatabaseError, before anything is written, when SQLite's quick check finds
    the file corrupt, or when it holds tables of its own and no engine schema (another
    program's database, which a migration would fill with the engine's tables).

    One statement, so one snapshot: a process migrating the file at the same moment is
    seen either before its commit (no tables) or after (the engine's schema version).
    The quick check reads every page once: about 25 ms for 10,000 finished jobs (an
    18 MB file), paid once per connection.
    """
    check, version, tables = conn.execute(
        "SELECT (SELECT quick_check FROM pragma_quick_check(1)),"
        " (SELECT user_version FROM pragma_user_version),"
        " (SELECT json_group_array(name) FROM (SELECT name FROM sqlite_master"
        "  WHERE type='table' AND name NOT LIKE 'sqlite!_%' ESCAPE '!' ORDER BY name))"
    ).fetchone()
    if check != "ok":
        raise _corrupt(path, check)
    names = json.loads(tables)
    if version == 0 and names:
        raise DatabaseError(
            f"database {path} is not an engine database: it holds tables of its own "
            f"({_some(names)}) and no engine schema; refusing to add the engine's tables "
            "to it (nothing was changed). Give the engine a new file or its own database")


def _corrupt(path: str, found: str) -> DatabaseError:
    """The error for a database file SQLite finds damaged (`found`: what it said)."""
    said = " ".join(found.split())[:120]  # one line, however many SQLite's report has
    return DatabaseError(
        f"database {path} is corrupt ({said}); the engine will not read or write it (nothing "
        "was changed). Restore it from a backup, or try the sqlite3 shell's .recover")


def malformed(exc: BaseException) -> bool:
    """True for SQLite's word for a damaged file, met by a statement after the open."""
    return isinstance(exc, sqlite3.DatabaseError) and "malformed" in str(exc)


def _some(names: list[str], shown: int = 5) -> str:
    """The first `shown` names, each cut to 40 characters, and how many more there are."""
    text = ", ".join(repr(name[:40]) for name in names[:shown])
    return text + (f" and {len(names) - shown} more" if len(names) > shown else "")


def explain(exc: sqlite3.Error, path: str, doing: str) -> DatabaseError:
    """SQLite's error while `doing` something to `path`, as the engine says it: corrupt,
    read-only, locked (StoreBusy), full, not a database."""
    text = str(exc)
    if malformed(exc):
        return _corrupt(path, text)
    if "readonly" in text or "read-only" in text:
        return DatabaseError(f"database {path} is read-only; cannot {doing} (nothing was changed)")
    if "locked" in text or "busy" in text:
        from .base import StoreBusy
        return StoreBusy(f"database {path} is locked by another process; could not {doing} "
                         "within the busy timeout (nothing was changed)")
    if "unable to open" in text:
        return DatabaseError(f"cannot open database {path}: {text}")
    if "disk is full" in text or "database or disk is full" in text:
        return DatabaseError(f"database {path}: disk is full; could not {doing} "
                             "(the last transaction was rolled back, nothing committed is lost)")
    if "not a database" in text:
        return DatabaseError(f"{path} is not a SQLite database")
    return DatabaseError(f"database {path}: {text} (while trying to {doing})")
