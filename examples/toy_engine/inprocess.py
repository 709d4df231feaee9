"""The toy engine in `ninelives sim` (the contract's in-process hooks, `chaos.sim.threads`):
its own Worker and Sender loops, run in the simulation's threads with the process's clock and
random source, their HTTP posts answered by the simulation's fakes."""
from __future__ import annotations

import json
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from . import calls, observer, store
from .sender import Sender
from .settings import Settings
from .worker import Worker


class ToyErrors:
    """What `calls.post` raises, for the simulation's fakes to raise in its place."""

    @staticmethod
    def status(url: str, status: int, body: Any, retry_after: str | None,
               now: float) -> Exception:
        return calls.classify(status, retry_after, now)  # an HTTP date read at virtual `now`

    @staticmethod
    def reset(url: str) -> Exception:
        return calls.Retryable("RemoteDisconnected: Remote end closed connection without "
                               "response")

    @staticmethod
    def timeout(url: str, seconds: float) -> Exception:
        return calls.Retryable("TimeoutError: timed out")


class ToyInProcess:
    """The hooks `chaos.sim.threads` runs the toy with."""

    errors = ToyErrors()

    @contextmanager
    def route(self, post: Callable[[str, Any, dict, float], tuple[int, Any]]) -> Iterator[None]:
        """`calls.post` answered by `post`, its answer encoded as the wire would carry it."""
        saved = calls.post

        def routed(url: str, body: Any, headers: dict, timeout: float) -> tuple[int, bytes]:
            status, answer = post(url, body, headers, timeout)
            raw = answer if isinstance(answer, str) else json.dumps(answer)
            return status, raw.encode()

        calls.post = routed
        try:
            yield
        finally:
            calls.post = saved

    def install(self, db: str, now_sql: str) -> None:
        conn = store.connect(db)
        try:
            store.init(conn)
            with store.write(conn):
                observer.install(conn, now_sql)
        finally:
            conn.close()

    def worker(self, proc) -> None:
        self._loop(proc, lambda conn, s: Worker(conn, s, proc.context.provider_url,
                                                rng=proc.rng, clock=proc.now))

    def sender(self, proc) -> None:
        self._loop(proc, lambda conn, s: Sender(conn, s, proc.context.receiver_url,
                                                rng=proc.rng, clock=proc.now))

    @staticmethod
    def _loop(proc, make) -> None:
        from .adapter import process_settings
        settings = Settings.from_table(process_settings(proc.context))
        conn = store.connect(proc.context.db)
        try:
            loop = make(conn, settings)
            loop.id = f"toy-{proc.pid}-sim{proc.context.slot}"  # the boot nonce, fixed by pid
            loop.run(proc.stop)
        finally:
            conn.close()
