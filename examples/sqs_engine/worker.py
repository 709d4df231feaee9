"""The SQS engine's worker: receive a task, run its step while a heartbeat keeps the task
invisible, then delete it under its receipt in the transaction that completes the step. A
worker whose task was received by another since writes nothing (its receipt is stale)."""
from __future__ import annotations

import os
import random
import secrets
import sqlite3
import threading
import time
from typing import Any, Callable

from chaos import probe

from . import calls, store
from .settings import Settings

#: every crash point the engine's processes pass.
POINTS = ("after_receive", "memo_hit", "before_call", "after_call", "heartbeat", "before_fail",
          "before_commit", "after_commit", "before_send", "after_send", "before_mark")
#: where a crash-looping payload kills its worker.
CRASH_LOOP_POINT = "after_receive"


def process_id() -> str:
    """A writer id unique per boot: sqs-<pid>-<random>."""
    return f"sqs-{os.getpid()}-{secrets.token_hex(3)}"


class Worker:
    """Runs steps until stopped. Takes a connection, the settings, the provider's base URL,
    a random source (backoff jitter), a clock, and the thread and event types its heartbeat
    runs on (a simulation gives its own)."""

    def __init__(self, conn: sqlite3.Connection, settings: Settings, provider_url: str,
                 rng: random.Random | None = None, clock: Callable[[], float] = time.time,
                 thread: Callable[..., Any] = threading.Thread,
                 event: Callable[[], Any] = threading.Event,
                 connect: Callable[[], sqlite3.Connection] | None = None):
        self.conn, self.settings, self.provider_url = conn, settings, provider_url
        self.rng, self.clock = rng or random.Random(), clock
        self.thread, self.event = thread, event
        # the heartbeat's own connection, to the same database file by default (read here:
        # a connection is used only by the thread that made it)
        path = conn.execute("PRAGMA database_list").fetchone()[2]
        self.connect = connect or (lambda: store.connect(path))
        self.id = process_id()

    def run(self, stop) -> None:
        while not stop.is_set():
            if not self.tick():
                stop.wait(self.settings.poll)

    def tick(self) -> bool:
        """Receive one task and run its step; False when no task was visible."""
        held = store.receive(self.conn, self.id, self.clock(), self.settings.visibility,
                             self.settings.max_receives, store.new_receipt(self.rng))
        if held is None:
            return False
        probe.point("after_receive", held.job)
        try:
            self.work(held)
        except store.Lost:
            pass  # another worker received the task: it is theirs now
        return True

    def work(self, held: store.Received) -> None:
        if held.step in held.memo:  # memo hit: finish at once, no call
            probe.point("memo_hit", held.job)
            self.complete(held, effects=self.effects(held))
            return
        if held.step == "post":
            self.complete(held, effects=self.effects(held))
            return
        probe.point("before_call", held.job)
        try:
            with self.heartbeat(held):
                output, cost = calls.draft(
                    self.provider_url, self.settings.provider_key, self.settings.model,
                    held.job, self.id, held.payload, self.settings.call_timeout)
                probe.point("after_call", held.job)
        except calls.Retryable as exc:
            self.fail(held, str(exc), self.wait(held.attempts + 1, exc.retry_after))
            return
        except calls.Poison as exc:
            self.fail(held, f"poison: {exc}", None, "poison")
            return
        self.complete(held, output, cost)

    def effects(self, held: store.Received) -> tuple[dict, ...]:
        """The effects of `held`'s step: the post step notifies with the draft's digest."""
        if held.step != "post":
            return ()
        draft = held.memo["draft"]["output"]
        return ({"job": held.job, "kind": store.EFFECT_KIND, "digest": draft["digest"]},)

    def complete(self, held: store.Received, output: Any = None, cost: float = 0.0,
                 effects: tuple[dict, ...] = ()) -> None:
        with store.write(self.conn):
            probe.point("before_commit", held.job)
            store.delete_task(self.conn, held)
            store.finish_job(self.conn, held, self.id, self.clock(), output, cost, effects)
        probe.point("after_commit", held.job)

    def fail(self, held: store.Received, error: str, wait: float | None,
             cause: str = "attempts") -> None:
        """Retry after `wait`, or park with `cause` (wait None); a task received
        max_receives times is parked for its attempts rather than retried."""
        probe.point("before_fail", held.job)
        if wait is not None and held.receives >= self.settings.max_receives:
            wait, error = None, f"dead after {held.receives} receives: {error}"
        store.fail(self.conn, held, self.id, self.clock(), error, wait, cause)

    def wait(self, attempt: int, retry_after: float | None) -> float:
        """Full-jitter backoff after failed attempt `attempt`, never under a Retry-After."""
        wait = self.rng.uniform(0.0, self.settings.backoff_bound(attempt))
        return max(wait, retry_after) if retry_after is not None else wait

    def heartbeat(self, held: store.Received) -> "Heartbeat":
        return Heartbeat(self, held)

    def extend(self, conn: sqlite3.Connection, held: store.Received) -> bool:
        """One heartbeat: the task stays invisible a whole visibility timeout from now."""
        return store.extend(conn, held, self.id, self.clock() + self.settings.visibility)


class Heartbeat:
    """While its block runs, a thread extends the held task's visibility every
    `beat_every` seconds on its own connection; it stops when the receipt is stale, and is
    stopped and joined on exit."""

    def __init__(self, worker: Worker, held: store.Received) -> None:
        self.worker, self.held = worker, held
        self.stop = worker.event()
        self.thread = None

    def __enter__(self) -> None:
        if self.worker.settings.heartbeat:
            self.thread = self.worker.thread(target=self.beat, name=f"heartbeat {self.held.job}")
            self.thread.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join()

    def beat(self) -> None:
        conn = self.worker.connect()
        try:
            while not self.stop.wait(self.worker.settings.beat_every):
                probe.point("heartbeat", self.held.job)
                try:
                    if not self.worker.extend(conn, self.held):
                        return
                except sqlite3.OperationalError:  # locked: the next beat tries again
                    continue
        finally:
            conn.close()
