"""SQLite on the simulation's virtual clock, for an engine whose code the harness did not write.

While a simulation of such an engine runs, `sqlite3.connect` (as every module that calls it
through the `sqlite3` module sees it) opens a `SimConnection` instead:

- Its timestamps are virtual. Each connection has the SQL function `ninelives_now()`: the
  virtual time, plus a tenth of a microsecond each time the thread asking differs from the
  one that asked before at the same instant. Stamps so follow the order writes commit in (a
  write transaction is never preempted), a stamp names the one thread that made the write
  (the observer's triggers stamp with it: `NOW_SQL`), and one thread's statements in a row
  share a stamp as they would share a real clock's millisecond. `writer(t)` says which
  process that was.
- Its lock waits are virtual. The real busy timeout is zero; a statement that finds the
  database locked sleeps on the virtual clock and tries again, up to the busy timeout the
  engine asked for (`sqlite3.connect(timeout=...)` or `PRAGMA busy_timeout`), then raises
  "database is locked" as SQLite would. Statements run through the connection's `execute`,
  `executemany`, `executescript` and `commit` wait this way (not those of a cursor of its own).
- Every statement is a scheduling point. Before a statement outside a transaction the thread
  gives the turn back at no cost in time, so that other threads may run between any two of
  its statements, as concurrent processes do (SQLite runs one statement at a time; between
  statements anything may happen). Inside a write transaction it is never preempted.
- It belongs to the thread that opened it. Its open transaction keeps that thread from being
  preempted (except to crash it), and it is closed when the thread ends, as a killed
  process's files are, which rolls back what it had not committed.
"""
from __future__ import annotations

import re
import sqlite3
import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from chaos.sim.scheduler import Actor, Process, Scheduler

NOW_FUNCTION = "ninelives_now"
NOW_SQL = f"{NOW_FUNCTION}()"
STEP = 1e-7    # virtual seconds between two stamps of the same instant
RETRY = 0.002  # virtual seconds between tries of a statement that found the database locked
_BUSY_PRAGMA = re.compile(r"^\s*PRAGMA\s+busy_timeout\s*=\s*(\d+)\s*;?\s*$", re.IGNORECASE)


class VirtualSQLite:
    """The simulation's SQLite (see the module docstring); `patched()` puts it in force."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        self.writers: dict[float, Process | None] = {}
        self._instant, self._step, self._last = -1, 0, None  # the last stamp's instant, step, thread

    def actor(self) -> Actor | None:
        """The actor whose thread is running, or None (the harness's own thread)."""
        actor = self.sched.current
        if actor is None or actor._thread is not threading.current_thread():
            return None
        return actor

    def now(self) -> float:
        """`ninelives_now()`: the virtual timestamp of the calling thread, noting whose."""
        sched, actor = self.sched, self.actor()
        if sched.now_us != self._instant:
            self._instant, self._step = sched.now_us, 0
        elif actor is not self._last:
            self._step += 1
        self._last = actor
        t = sched.now() + self._step * STEP
        self.writers[t] = actor.process if actor is not None else None
        return t

    def writer(self, t: float) -> Process | None:
        """The process whose write was stamped `t`, or None (the harness, or unknown)."""
        return self.writers.get(t)

    @contextmanager
    def patched(self) -> Iterator[None]:
        """`sqlite3.connect` opens SimConnections for the duration of the block."""
        real = sqlite3.connect

        def connect(database: Any, timeout: float = 5.0, *args: Any, **kwargs: Any):
            kwargs["factory"] = SimConnection
            conn = real(database, 0.0, *args, **kwargs)
            conn.attach(self, timeout)
            return conn

        sqlite3.connect = connect
        try:
            yield
        finally:
            sqlite3.connect = real


class SimConnection(sqlite3.Connection):
    """A connection whose clock and lock waits are the simulation's (see the module
    docstring)."""

    virtual: VirtualSQLite | None = None
    busy = 0.0

    def attach(self, virtual: VirtualSQLite, busy: float) -> None:
        self.virtual, self.busy = virtual, busy
        self.create_function(NOW_FUNCTION, 0, virtual.now)
        actor = virtual.actor()
        if actor is not None:
            mine = actor.data.setdefault("connections", [])
            mine.append(self)
            actor.cleanup.append(self.close)
            actor.in_transaction = lambda: any(c.in_transaction for c in mine if c.open)

    @property
    def open(self) -> bool:
        try:
            self.total_changes  # raises on a closed connection
            return True
        except sqlite3.ProgrammingError:
            return False

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        match = _BUSY_PRAGMA.match(sql) if isinstance(sql, str) else None
        if match:  # the engine's busy timeout, kept for the virtual waits
            self.busy = int(match.group(1)) / 1000
            return super().execute("PRAGMA busy_timeout=0")
        self._boundary()
        return self._waiting(super().execute, sql, *args)

    def executemany(self, sql: str, *args: Any) -> sqlite3.Cursor:
        self._boundary()
        return self._waiting(super().executemany, sql, *args)

    def executescript(self, script: str) -> sqlite3.Cursor:
        self._boundary()
        return self._waiting(super().executescript, script)

    def _boundary(self) -> None:
        """A statement boundary: outside a transaction, another thread may go first."""
        actor = self.virtual.actor() if self.virtual is not None else None
        if actor is not None and not actor.in_transaction():
            self.virtual.sched.pass_turn()

    def commit(self) -> None:
        self._waiting(super().commit)

    def _waiting(self, call: Callable[..., Any], *args: Any) -> Any:
        """`call(*args)`, tried again on the virtual clock while the database is locked."""
        virtual, deadline = self.virtual, None
        while True:
            try:
                return call(*args)
            except sqlite3.OperationalError as exc:
                actor = virtual.actor() if virtual is not None else None
                if actor is None or "locked" not in str(exc):
                    raise
                sched = virtual.sched
                if deadline is None:
                    deadline = sched.now_us + sched.us(self.busy)
                if sched.now_us >= deadline:
                    raise
                sched.sleep(RETRY)
