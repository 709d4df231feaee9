"""The reference engine's side of a simulation: its stores on the virtual clock (audit
triggers stamped by it, the lock wait sleeping on it), its HTTP function routed to the
in-process fakes and the errors that function raises, and its crash points as scheduling
points."""
from __future__ import annotations

import json
import random
from contextlib import contextmanager
from typing import Any, Iterator

from engine import CallTimeout, PoisonError, RetryableError, hooks
from engine.http import parse_retry_after
from engine.retry import classify_status
from engine.store import SQLiteStore, open_store

from chaos.sim.scheduler import Scheduler, VirtualClock
from chaos.sim.world import PROVIDER_URL, RECEIVER_URL, SimProvider, SimReceiver
from chaos.reference import audit

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
    def status(url: str, status: int, body: Any, retry_after: str | None,
               now: float) -> Exception:
        text = body if isinstance(body, str) else json.dumps(body)
        message = f"POST {url} answered {status}: {text[:200]}"
        if classify_status(status):
            # An HTTP date is read against the virtual time the answer came (the machine's
            # clock, unskewed, as the engine's client reads it in a real run).
            return RetryableError(message, retry_after=parse_retry_after(retry_after, now=now))
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
