"""The SQS engine's sender: receive one unsent effect under a new receipt, post it with its
idempotency key, then mark it sent (or visible again after a backoff, or dead) under that
receipt. A sender whose row was received by another since writes nothing; the new holder
sends again under the same key, which the receiver answers without applying twice."""
from __future__ import annotations

import random
import sqlite3
import time
from typing import Callable

from chaos import probe

from . import calls, store
from .settings import Settings
from .worker import process_id


class Sender:
    """Sends effects until stopped. Takes a connection, the settings, the receiver's URL, a
    random source (backoff jitter) and a clock."""

    def __init__(self, conn: sqlite3.Connection, settings: Settings, receiver_url: str,
                 rng: random.Random | None = None, clock: Callable[[], float] = time.time):
        self.conn, self.settings, self.receiver_url = conn, settings, receiver_url
        self.rng, self.clock = rng or random.Random(), clock
        self.id = process_id()

    def run(self, stop) -> None:
        while not stop.is_set():
            if not self.tick():
                stop.wait(self.settings.poll)

    def tick(self) -> bool:
        """Send one effect; False when none was visible."""
        held = store.receive_effect(self.conn, self.id, self.clock(),
                                    self.settings.outbox_visibility,
                                    store.new_receipt(self.rng))
        if held is None:
            return False
        probe.point("before_send", held.job)
        try:
            calls.send_effect(self.receiver_url, held.key, held.body, self.settings.send_timeout,
                              self.id)
        except calls.Retryable as exc:
            self.retry(held, str(exc), exc.retry_after)
            return True
        except calls.Poison as exc:
            store.settle_effect(self.conn, held, self.id, dead_at=self.clock(),
                                error=f"refused: {exc}")
            return True
        probe.point("after_send", held.job)
        self.mark(held)
        return True

    def mark(self, held: store.HeldEffect) -> None:
        probe.point("before_mark", held.job)
        store.settle_effect(self.conn, held, self.id, sent_at=self.clock())

    def retry(self, held: store.HeldEffect, error: str, retry_after: float | None) -> None:
        if held.receives >= self.settings.outbox_max_receives:
            store.settle_effect(self.conn, held, self.id, dead_at=self.clock(),
                                error=f"dead after {held.receives} receives: {error}")
            return
        wait = self.rng.uniform(0.0, self.settings.backoff_bound(held.receives))
        if retry_after is not None:
            wait = max(wait, retry_after)
        store.settle_effect(self.conn, held, self.id, visible_at=self.clock() + wait,
                            error=error)
