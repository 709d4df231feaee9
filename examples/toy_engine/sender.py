"""The toy engine's sender: claims one unsent effect inside its job's document, posts it with
the effect's idempotency key, then marks it sent (or schedules a retry, or dead-letters it)."""
from __future__ import annotations

import json
import random
import sqlite3
import threading
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
        self.sent = self.failed = 0

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            if not self.tick():
                stop.wait(self.settings.poll)

    def tick(self) -> bool:
        """Send one effect; False when none was due."""
        claimed = self.claim()
        if claimed is None:
            return False
        key, kind, effect = claimed
        probe.point("before_send", key)
        try:
            calls.send_effect(self.receiver_url, effect["key"], effect["body"],
                              self.settings.send_timeout, sender=self.id)
        except calls.Retryable as exc:
            self.failed += 1
            self.settle(key, kind, self.retry_change(effect, str(exc), exc.retry_after))
            return True
        except calls.Poison as exc:
            self.failed += 1
            self.settle(key, kind, {"dead": True, "dead_at": self.clock(),
                                    "error": f"refused: {exc}"})
            return True
        probe.point("after_send", key)
        self.settle(key, kind, {"sent": True, "sent_at": self.clock(), "error": None})
        self.sent += 1
        return True

    def claim(self) -> tuple[str, str, dict] | None:
        """(job, kind, effect) of one due effect this sender now holds, or None."""
        now = self.clock()
        with store.write(self.conn):
            for key, text in store.with_unsent(self.conn):
                doc = json.loads(text)
                for effect in doc["effects"]:
                    if effect["sent"] or effect["dead"] or effect["not_before"] > now or (
                            effect["owner"] and effect["lease_expires"] > now):
                        continue
                    effect.update(owner=self.id, lease_expires=now + self.settings.outbox_lease,
                                  attempts=effect["attempts"] + 1, by=self.id)
                    if store.swap(self.conn, key, text, doc) is not None:
                        return key, effect["kind"], dict(effect)
                    break
        return None

    def retry_change(self, effect: dict, error: str, retry_after: float | None) -> dict:
        if effect["attempts"] >= self.settings.outbox_max_attempts:
            return {"dead": True, "dead_at": self.clock(),
                    "error": f"dead after {effect['attempts']} attempts: {error}"}
        wait = self.rng.uniform(0.0, self.settings.backoff_bound(effect["attempts"]))
        if retry_after is not None:
            wait = max(wait, retry_after)
        return {"not_before": self.clock() + wait, "error": error}

    def settle(self, key: str, kind: str, change: dict) -> None:
        """Write the outcome of one send and release the effect, only while this sender still
        holds it: a sender whose lease was taken writes nothing (the new holder sends again
        under the same key, which the receiver answers without applying twice)."""
        def apply(doc: dict) -> dict:
            effect = next(e for e in doc["effects"] if e["kind"] == kind)
            if effect["sent"] or effect["owner"] != self.id:
                return doc
            effect.update(change, owner=None, lease_expires=None, by=self.id)
            return doc
        store.update(self.conn, key, apply)
