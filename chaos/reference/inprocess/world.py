"""The reference engine's side of a simulation: its stores on the virtual clock (audit
triggers stamped by it, the lock wait sleeping on it), its HTTP function routed to the
in-process fakes and the errors that function raises, its crash points as scheduling
points, and its heartbeat as an actor."""
from __future__ import annotations

import json
import random
import threading
from contextlib import contextmanager
from typing import Any, Iterator

from engine import CallTimeout, PoisonError, RetryableError, hooks
from engine.http import parse_retry_after
from engine.retry import classify_status
from engine.store import SQLiteStore, StoreBusy, open_store

from ...sim.scheduler import INF, Scheduler, VirtualClock
from ...sim.world import PROVIDER_URL, RECEIVER_URL, SimProvider, SimReceiver
from .. import audit

NOW_FUNCTION = "ninelives_sim_now"


class EngineHooks:
    """The reference engine's crash points as the scheduler's scheduling points."""

    @staticmethod
    def install(handler):
        return hooks.set_crash_handler(handler)

    @staticmethod
    def restore(saved) -> None:
        hooks.set_crash_handler(saved)


class EngineErrors:
    """What `engine.http.post_json` raises, for the in-process fakes to raise."""

    @staticmethod
    def status(url: str, status: int, body: Any, retry_after: str | None) -> Exception:
        text = body if isinstance(body, str) else json.dumps(body)
        message = f"POST {url} answered {status}: {text[:200]}"
        if classify_status(status):
            return RetryableError(message, retry_after=parse_retry_after(retry_after))
        return PoisonError(message)

    @staticmethod
    def reset(url: str) -> Exception:
        return RetryableError(f"POST {url} failed: RemoteDisconnected: Remote end closed "
                              "connection without response")

    @staticmethod
    def timeout(url: str, seconds: float) -> Exception:
        return CallTimeout(f"POST {url} timed out after {seconds} s")


# -- stores ----------------------------------------------------------------------------------

def install_audit(conn, now_sql: str = f"{NOW_FUNCTION}()") -> None:
    """The audit triggers of `chaos.audit`, stamping `t` from the simulation's virtual clock
    (a function registered on every simulated connection) instead of SQLite's real one."""
    conn.execute("CREATE TABLE IF NOT EXISTS audit (seq INTEGER PRIMARY KEY, t REAL NOT NULL,"
                 " kind TEXT NOT NULL, op TEXT NOT NULL, data TEXT NOT NULL)")
    for (table, op), body in audit.TRIGGERS.items():
        conn.execute(
            f"CREATE TRIGGER IF NOT EXISTS audit_{table}_{op} AFTER {op.upper()} ON {table}"
            f" BEGIN INSERT INTO audit (t, kind, op, data)"
            f" VALUES ({now_sql}, '{audit.KIND[table]}', '{op}', {body}); END")


def sim_store(path: str, sched: Scheduler, busy_timeout: float, seed: str) -> SQLiteStore:
    """An engine store whose audit triggers and lock wait run on the virtual clock."""
    store = open_store(path, synchronous="NORMAL", busy_timeout=busy_timeout)
    store.conn.create_function(NOW_FUNCTION, 0, sched.now)
    store.wait_clock = VirtualClock(sched)
    store.wait_rng = random.Random(seed)
    return store


# -- the network: the engine's HTTP calls, answered in-process -------------------------------

@contextmanager
def routed(provider: "SimProvider", receiver: "SimReceiver") -> Iterator[None]:
    """Answer the engine's HTTP posts (`post_json` as `engine.provider` and `engine.outbox`
    import it) with the simulation's fakes, for the duration of the block. The engine's own
    client code (ChatClient, DocumentSteps, Sender.send) runs unchanged around them."""
    import engine.outbox
    import engine.provider

    def post_json(url: str, body: Any, headers: dict, timeout: float) -> tuple[int, Any]:
        if url.startswith(PROVIDER_URL):
            return provider.post(url, body, headers, timeout)
        if url.startswith(RECEIVER_URL):
            return receiver.post(url, body, headers, timeout)
        raise PoisonError(f"not a simulated URL: {url!r}")

    saved = engine.provider.post_json, engine.outbox.post_json
    engine.provider.post_json = engine.outbox.post_json = post_json
    try:
        yield
    finally:
        engine.provider.post_json, engine.outbox.post_json = saved


# -- the heartbeat -----------------------------------------------------------------------------

class SimHeartbeat:
    """The engine's heartbeat, simulated: one actor per worker process with its own store that
    ticks every half interval on the virtual clock and, like `engine.worker.Heartbeat`,
    extends the lease of a step watched at least half an interval, and reports a lost lease.

    Between watches it does not wake (a tick with nothing watched changes nothing), but its
    ticks keep the real thread's grid: the worker's start plus a whole number of half
    intervals. Its store is opened at its first beat (`open_store`).
    """

    def __init__(self, sched: Scheduler, clock: VirtualClock, lease: float, every: float,
                 worker_id: str) -> None:
        self.sched, self.clock, self.lease, self.worker_id = sched, clock, lease, worker_id
        self.half_us = sched.us(every / 2)
        self.origin = sched.now_us
        self.actor = None
        self.store: SQLiteStore | None = None
        self.open_store: Any = None  # opens the heartbeat's own store, at its first beat
        self.watched: tuple | None = None
        self.next_tick = INF

    @contextmanager
    def watching(self, claim) -> Iterator[threading.Event]:
        lost = threading.Event()
        self.watched = (claim, lost, self.sched.now_us)
        self.next_tick = self._tick_after(self.sched.now_us)
        self.sched.wake_at(self.actor, self.next_tick)
        try:
            yield lost
        finally:
            self.watched = None

    def _tick_after(self, now_us: int) -> int:
        k = (now_us - self.origin) // self.half_us + 1
        return self.origin + k * self.half_us

    def run(self) -> None:
        """The actor's body."""
        while True:
            if self.next_tick == INF:
                self.sched.wait()
            else:
                self.sched.sleep_until(self.next_tick)
            watched = self.watched
            if watched is None:
                self.next_tick = INF
                continue
            self.next_tick = self._tick_after(self.sched.now_us)
            claim, lost, since = watched
            if self.sched.now_us - since < self.half_us:
                continue
            self._beat(claim, lost, watched)

    def _beat(self, claim, lost: threading.Event, watched: tuple) -> None:
        if self.store is None:
            self.store = self.open_store()
        try:
            if not self.store.heartbeat(claim.job_id, claim.lease_token, self.clock.now(),
                                        self.lease, self.worker_id):
                lost.set()
                if self.watched is watched:
                    self.watched = None
        except StoreBusy:
            pass  # the lease still runs; try again next tick
