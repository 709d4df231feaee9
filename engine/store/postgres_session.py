"""The PostgreSQL connection under the store: transactions, a dropped connection reopened,
and what a driver error means (busy, dropped, read-only, anything else)."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Callable, Iterator

import psycopg

from . import shown_target
from .base import ConnectionDropped, DatabaseError, StoreBusy

#: SQLSTATEs after which nothing was committed and the same call may simply be made again:
#: lock_timeout expired, deadlock, serialization failure, statement cancelled by a timeout.
BUSY_STATES = frozenset({"55P03", "40P01", "40001", "57014"})


class Cursor:
    """The connection as the shared operator SQL uses it: `execute` with `?` placeholders
    (sqlite3's style) or with named `%(name)s` ones, returning the psycopg cursor."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Any = ()) -> psycopg.Cursor:
        if isinstance(params, dict):
            return self._conn.execute(sql, params)
        return self._conn.execute(sql.replace("?", "%s"), tuple(params))

    def executemany(self, sql: str, rows: Any) -> None:
        with self._conn.cursor() as cur:
            cur.executemany(sql.replace("?", "%s"), list(rows))


class PostgresSession:
    """One connection to one database, with the store's one transaction primitive.

    url: a libpq URL; synchronous: "FULL" or "NORMAL" (synchronous_commit on or off);
    busy_timeout: seconds a statement waits for a row lock (lock_timeout) before StoreBusy;
    read_only: every transaction read-only; connect_timeout: seconds to reach the server.
    Raises DatabaseError naming the server (never its password) when it cannot connect.
    """

    def __init__(self, url: str, *, synchronous: str = "FULL", busy_timeout: float = 5.0,
                 read_only: bool = False, connect_timeout: float = 10.0) -> None:
        if synchronous.upper() not in ("FULL", "NORMAL"):
            raise ValueError(f"synchronous must be FULL or NORMAL, not {synchronous!r}")
        self.url, self.read_only = url, read_only
        self.where = shown_target(url)  # never the password
        self.synchronous, self.busy_timeout = synchronous.upper(), busy_timeout
        self.connect_timeout = connect_timeout
        self.reconnects = 0
        self.conn = self._connect()

    @property
    def target(self) -> str:
        """The URL (what `open_store` opens again for another connection)."""
        return self.url

    # -- connection and transactions --------------------------------------------------------

    def _connect(self) -> psycopg.Connection:
        try:
            conn = psycopg.connect(self.url, autocommit=True,
                                   connect_timeout=max(1, round(self.connect_timeout)),
                                   # a server gone silent is noticed in seconds, not hours
                                   keepalives=1, keepalives_idle=5, keepalives_interval=2,
                                   keepalives_count=3)
        except psycopg.Error as exc:
            raise DatabaseError(f"cannot connect to database {self.where}: "
                                f"{str(exc).strip()}") from exc
        conn.execute(f"SET lock_timeout = {max(1, int(self.busy_timeout * 1000))}")
        conn.execute("SET synchronous_commit = "
                     + ("on" if self.synchronous == "FULL" else "off"))
        if self.read_only:
            conn.execute("SET default_transaction_read_only = on")
        return conn

    def _connection(self) -> psycopg.Connection:
        """The live connection, reopened if the last one broke (a dropped connection, a
        server restart, pg_terminate_backend): its transaction was rolled back by then."""
        if self.conn.closed or self.conn.broken:
            try:
                self.conn.close()
            finally:
                self.conn = self._connect()
                self.reconnects += 1
        return self.conn

    @contextmanager
    def write(self) -> Iterator[Cursor]:
        """One write transaction: BEGIN, COMMIT, or ROLLBACK on any exception.

        Raises StoreBusy (nothing committed) past the lock timeout or on a deadlock, and
        ConnectionDropped when the connection broke (see `_write` for what is retried).
        """
        conn = self._connection()
        try:
            conn.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
            yield Cursor(conn)
        except BaseException as exc:
            # Also a crash handler's exception in a simulation: nothing uncommitted survives.
            if not conn.broken and not conn.closed:
                try:
                    conn.execute("ROLLBACK")
                except psycopg.Error:
                    pass
            if isinstance(exc, psycopg.Error):
                raise self._explain(exc, conn, "write", at_commit=False) from exc
            raise
        try:
            conn.execute("COMMIT")
        except psycopg.Error as exc:
            raise self._explain(exc, conn, "commit", at_commit=True) from exc

    def _write(self, body: Callable[[Cursor], Any], *, idempotent: bool) -> Any:
        """Run `body` in one write transaction, once more on a new connection if it dropped.

        A connection that broke before COMMIT was sent cannot have committed anything (the
        server rolls back a transaction whose session ended), so any write is run again. One
        that broke while COMMIT was in flight may or may not have committed: only a write
        that is idempotent under its fence is run again then (a heartbeat: GREATEST() of the
        same lease under the same token; an outbox row's sent or retry mark under its token;
        a submit: ON CONFLICT DO NOTHING). A claim, a step's completion or failure, and a
        spend record are not: a second run would claim a second job, report a lease lost
        that the first run used, or bill twice. Those raise, and the worker dies as if
        killed at that line; the lease expires and the next owner resumes from the memo.
        """
        try:
            with self.write() as cur:
                return body(cur)
        except ConnectionDropped as exc:
            if exc.at_commit and not idempotent:
                raise
        with self.write() as cur:
            return body(cur)

    def _read(self, sql: str, params: Any = ()) -> psycopg.Cursor:
        """One read on its own (autocommit): run again once on a new connection if it broke."""
        for attempt in (1, 2):
            conn = self._connection()
            try:
                return Cursor(conn).execute(sql, params)
            except psycopg.Error as exc:
                error = self._explain(exc, conn, "read", at_commit=False)
                if attempt == 2 or not isinstance(error, ConnectionDropped):
                    raise error from exc
        raise AssertionError("unreachable")

    def _explain(self, exc: psycopg.Error, conn: psycopg.Connection, doing: str, *,
                 at_commit: bool) -> DatabaseError:
        if conn.broken or conn.closed:
            return ConnectionDropped(
                f"database {self.where}: the connection dropped while trying to {doing}"
                + (" (whether it committed is unknown)" if at_commit else
                   " (nothing was committed)") + f": {str(exc).strip()}", at_commit)
        if exc.sqlstate in BUSY_STATES:
            return StoreBusy(f"database {self.where}: a row stayed locked past the busy "
                             f"timeout, or a deadlock; could not {doing} (nothing was changed)")
        if exc.sqlstate == "25006":
            return DatabaseError(f"database {self.where} was opened read-only; cannot {doing}"
                                 " (nothing was changed)")
        return DatabaseError(f"database {self.where}: {str(exc).strip()} (while trying to "
                             f"{doing})")

    def close(self) -> None:
        self.conn.close()
