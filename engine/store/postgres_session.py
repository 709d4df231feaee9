"""The PostgreSQL connection under the store: transactions, a connection reopened within a
window when the server is out of reach, a COMMIT whose answer was lost resolved by its
transaction id, and what a driver error means (busy, dropped, read-only, anything else)."""
from __future__ import annotations

import logging
import random
import time
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Callable, Iterator

import psycopg

from . import shown_target
from .base import ConnectionDropped, DatabaseError, StoreBusy

#: SQLSTATEs after which nothing was committed and the same call may simply be made again:
#: lock_timeout expired, deadlock, serialization failure, statement cancelled by a timeout.
BUSY_STATES = frozenset({"55P03", "40P01", "40001", "57014"})
#: What a failed connection attempt says when trying again cannot help: a wrong database,
#: user, password or URL. Anything else (refused, "the database system is starting up" or
#: "in recovery" (57P03), shutting down, too many clients, a timeout) is worth another try
#: within the reconnect window. libpq gives no SQLSTATE for a failed connection, only text.
PERMANENT = ("does not exist", "authentication failed", "pg_hba.conf", "permission denied",
             "invalid ")
#: Waits between connection attempts: full jitter up to a bound that doubles to this cap,
#: so processes cut off together by one server restart do not all come back at once.
FIRST_DELAY, DELAY_CAP = 0.05, 1.0
#: How long a transaction the server still reports "in progress" after its client's
#: connection broke is waited for at least (its server process is ending), whatever the
#: reconnect window.
IN_DOUBT_WAIT = 5.0
_UNSET = object()

log = logging.getLogger("ninelives.store")


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
    read_only: every transaction read-only; connect_timeout: seconds one connection attempt
    may take; reconnect_window: seconds to keep trying, with jittered backoff, while the
    server cannot be reached (down, restarting, in recovery), at the first connection and
    at every reconnection (0: one attempt); rng: the jitter's random source.
    Raises DatabaseError naming the server (never its password) when it cannot connect
    within the window.
    """

    def __init__(self, url: str, *, synchronous: str = "FULL", busy_timeout: float = 5.0,
                 read_only: bool = False, connect_timeout: float = 10.0,
                 reconnect_window: float = 0.0, rng: random.Random | None = None) -> None:
        if synchronous.upper() not in ("FULL", "NORMAL"):
            raise ValueError(f"synchronous must be FULL or NORMAL, not {synchronous!r}")
        if not reconnect_window >= 0:  # also nan
            raise ValueError(f"reconnect_window must be >= 0, not {reconnect_window!r}")
        self.url, self.read_only = url, read_only
        self.where = shown_target(url)  # never the password
        self.synchronous, self.busy_timeout = synchronous.upper(), busy_timeout
        self.connect_timeout, self.reconnect_window = connect_timeout, reconnect_window
        self.rng = rng or random.Random()
        self.reconnects = 0
        #: The open transaction's id (text of an xid8), and the start time of the server
        #: the connection is to: a new start time means the server restarted.
        self.xid: str | None = None
        self.started_at: datetime | None = None
        self.conn = self._connect()

    @property
    def target(self) -> str:
        """The URL (what `open_store` opens again for another connection)."""
        return self.url

    # -- connection -------------------------------------------------------------------------

    def _connect(self) -> psycopg.Connection:
        """A new connection, tried again within the reconnect window while the server
        cannot be reached. Raises DatabaseError past the window, or at once when trying
        again cannot help (see PERMANENT)."""
        deadline, bound = time.monotonic() + self.reconnect_window, FIRST_DELAY
        while True:
            try:
                return self._open()
            except psycopg.Error as exc:
                left = deadline - time.monotonic()
                text = str(exc).strip()
                if left <= 0 or any(word in text for word in PERMANENT):
                    tried = (f" (tried for {self.reconnect_window:g} s)"
                             if self.reconnect_window else "")
                    raise DatabaseError(f"cannot connect to database {self.where}{tried}: "
                                        f"{text}") from exc
            if bound == FIRST_DELAY:
                log.warning("cannot connect to database %s (%s); trying again for up to %g s",
                            self.where, " ".join(text.split()), self.reconnect_window)
            time.sleep(min(left, self.rng.uniform(0, bound)))
            bound = min(bound * 2, DELAY_CAP)

    def _open(self) -> psycopg.Connection:
        conn = psycopg.connect(self.url, autocommit=True,
                               connect_timeout=max(1, round(self.connect_timeout)),
                               # a server gone silent is noticed in seconds, not hours
                               keepalives=1, keepalives_idle=5, keepalives_interval=2,
                               keepalives_count=3)
        settings = [f"SET lock_timeout = {max(1, int(self.busy_timeout * 1000))}",
                    "SET synchronous_commit = " + ("on" if self.synchronous == "FULL" else "off")]
        if self.read_only:
            settings.append("SET default_transaction_read_only = on")
        try:  # one round trip: every setting, and which start of the server this is
            cur = conn.execute("; ".join(settings + ["SELECT pg_postmaster_start_time()"]))
            while cur.nextset():
                pass
            self.started_at = cur.fetchone()[0]
        except BaseException:
            conn.close()
            raise
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

    # -- transactions -----------------------------------------------------------------------

    @contextmanager
    def write(self) -> Iterator[Cursor]:
        """One write transaction: BEGIN, COMMIT, or ROLLBACK on any exception. Sets `xid`
        to the transaction's id (in BEGIN's own round trip: no extra one).

        Raises StoreBusy (nothing committed) past the lock timeout or on a deadlock, and
        ConnectionDropped when the connection broke (see `_write` for what is retried).
        """
        self.xid = None
        conn = self._connection()
        try:
            self.xid = self._begin(conn)
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

    def _begin(self, conn: psycopg.Connection) -> str | None:
        if self.read_only:  # a read-only transaction cannot be given an id
            conn.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
            return None
        # The id is what tells, after a COMMIT whose answer was lost, whether it committed
        # (`_outcome`). Asked with BEGIN, in one message: it costs no round trip.
        cur = conn.execute("BEGIN ISOLATION LEVEL READ COMMITTED;"
                           " SELECT pg_current_xact_id()::text")
        cur.nextset()
        return cur.fetchone()[0]

    def _write(self, body: Callable[[Cursor], Any], *, idempotent: bool,
               verify: Callable[[Any], bool] | None = None) -> Any:
        """Run `body` in one write transaction, again on a new connection if it dropped,
        until it is known to have committed once.

        A connection that broke before COMMIT was sent cannot have committed anything (the
        server rolls back a transaction whose session ended), so `body` is run again. One
        that broke while COMMIT was in flight may or may not have committed: a write that
        is idempotent under its fence is simply run again (a heartbeat: GREATEST() of the
        same lease under the same token; an outbox row's sent or retry mark under its
        token; a submit: ON CONFLICT DO NOTHING). Any other write (a claim, a step's
        completion or failure, a spend record: run twice, it would claim a second job or
        bill twice) is resolved by its transaction id (`_outcome`): committed, its result
        stands and it is not run again; not committed, it is run again, its fences making
        that safe. `verify(result)` tells from the rows whether it committed when the id
        cannot (the server restarted: see `_outcome`). Drops are ridden out for the
        reconnect window from the first (at least one more try); past it, or when the
        outcome cannot be known, ConnectionDropped is raised.
        """
        deadline = None
        while True:
            result = _UNSET
            try:
                with self.write() as cur:
                    result = body(cur)
                return result
            except ConnectionDropped as exc:
                dropped, xid, started_at = exc, self.xid, self.started_at
            now = time.monotonic()
            if deadline is None:
                deadline = now + self.reconnect_window
            elif now >= deadline:
                raise dropped
            if dropped.at_commit and not idempotent and result is not _UNSET:
                committed = self._outcome(dropped, xid, started_at,
                                          lambda: verify(result) if verify else None)
                log.warning("database %s: a COMMIT's answer was lost; transaction %s %s",
                            self.where, xid, "committed: kept" if committed else
                            "did not commit: run again")
                if committed:
                    return result

    def _outcome(self, dropped: ConnectionDropped, xid: str | None, started_at: Any,
                 verify: Callable[[], bool | None]) -> bool:
        """Whether the transaction `xid`, whose COMMIT's answer was lost, committed: asked
        of the server (pg_xact_status) on a new connection. "in progress" (its server
        process is still ending) is asked again. Raises `dropped` when it cannot be known.

        If the server restarted meanwhile (a new start time), only "committed" is in doubt:
        a transaction whose log records were lost in the crash did not commit, and its id
        may since have been given to another transaction, whose status this would be. So
        there `verify()` decides from the rows; anything else means it did not commit (had
        it committed, its id would be in the recovered log, and its status its own).
        """
        if xid is None:
            raise dropped
        deadline = time.monotonic() + max(self.reconnect_window, IN_DOUBT_WAIT)
        while True:
            status, now_started = self._xact_status(xid)
            restarted = now_started != started_at
            if restarted:
                if status != "committed":
                    return False
                committed = verify()
                if committed is None:
                    raise dropped
                return committed
            if status in ("committed", "aborted"):
                return status == "committed"
            if status != "in progress" or time.monotonic() >= deadline:
                raise dropped  # None: an id too old to know (not seconds after its commit)
            time.sleep(0.02)

    def _xact_status(self, xid: str) -> tuple[str | None, Any]:
        """(pg_xact_status of `xid`, the server's start time), reconnecting as `_read` does.
        An id "in the future" (the server restarted and lost it) is reported as "lost"."""
        try:
            row = self._read("SELECT pg_xact_status(%s::xid8), pg_postmaster_start_time()",
                             (xid,)).fetchone()
        except DatabaseError as exc:
            if not isinstance(exc.__cause__, psycopg.errors.InvalidParameterValue):
                raise
            return "lost", self._read("SELECT pg_postmaster_start_time()").fetchone()[0]
        return row[0], row[1]

    def _read(self, sql: str, params: Any = ()) -> psycopg.Cursor:
        """One read on its own (autocommit): run again on a new connection if it broke, for
        the reconnect window (at least once more)."""
        deadline = None
        while True:
            conn = self._connection()
            try:
                return Cursor(conn).execute(sql, params)
            except psycopg.Error as exc:
                error = self._explain(exc, conn, "read", at_commit=False)
                if deadline is None:
                    deadline = time.monotonic() + self.reconnect_window
                elif time.monotonic() >= deadline:
                    raise error from exc
                if not isinstance(error, ConnectionDropped):
                    raise error from exc

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
