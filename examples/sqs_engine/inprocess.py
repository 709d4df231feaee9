"""The SQS engine in `ninelives sim` (the contract's in-process hooks, `chaos.sim.threads`):
its own Worker and Sender loops, run in the simulation's threads with the process's clock,
random source, threads and events, their HTTP posts answered by the simulation's fakes."""
from __future__ import annotations

import json
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from . import calls, store
from .settings import Settings


class SqsErrors:
    """What `calls.post` raises, for the simulation's fakes to raise in its place."""

    @staticmethod
    def status(url: str, status: int, body: Any, retry_after: str | None,
               now: float) -> Exception:
        return calls.classify(status, retry_after, now)

    @staticmethod
    def reset(url: str) -> Exception:
        return calls.Retryable("RemoteDisconnected: Remote end closed connection without "
                               "response")

    @staticmethod
    def timeout(url: str, seconds: float) -> Exception:
        return calls.Retryable("TimeoutError: timed out")


class SqsInProcess:
    """The hooks `chaos.sim.threads` runs the engine with; `adapter` is the SqsEngine (or a
    planted variant) whose settings and loops each process gets."""

    errors = SqsErrors()

    def __init__(self, adapter: Any) -> None:
        self.adapter = adapter

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
        self.adapter.install(db, now_sql)

    def worker(self, proc) -> None:
        worker_type, _ = self.adapter.loops()
        self._loop(proc, lambda conn, s: worker_type(
            conn, s, proc.context.provider_url, rng=proc.rng, clock=proc.now,
            thread=proc.thread, event=proc.event,
            connect=lambda: store.connect(proc.context.db)))

    def sender(self, proc) -> None:
        _, sender_type = self.adapter.loops()
        self._loop(proc, lambda conn, s: sender_type(conn, s, proc.context.receiver_url,
                                                     rng=proc.rng, clock=proc.now))

    @staticmethod
    def _loop(proc, make) -> None:
        from .adapter import process_settings
        settings = Settings.from_table(process_settings(proc.context))
        conn = store.connect(proc.context.db)
        try:
            loop = make(conn, settings)
            loop.id = f"sqs-{proc.pid}-sim{proc.context.slot}"  # the boot nonce, fixed by pid
            loop.run(proc.stop)
        finally:
            conn.close()
