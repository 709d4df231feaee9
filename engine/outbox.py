"""The outbox sender: leases unsent rows, sends each with its idempotency key, marks it sent.

A crash between the send and the mark sends again: at-least-once. The receiver's
idempotency key turns that into one effect, which is the only exactly-once there is.
"""
from __future__ import annotations

import json
import logging
import random
import threading

from .config import EngineConfig
from . import hooks
from .hooks import Clock, SystemClock, crashpoint
from .http import post_json
from .retry import Backoff, classify
from .store import ConnectionDropped, OutboxClaim, Store, StoreBusy
from .worker import new_worker_id, retry_store, unknown_write

log = logging.getLogger("ninelives.sender")


class Sender:
    """Delivers outbox rows to `config.receiver_url`."""

    def __init__(self, store: Store, config: EngineConfig, *, clock: Clock | None = None,
                 rng: random.Random | None = None, sender_id: str | None = None,
                 use_keys: bool = True) -> None:
        self.store, self.config = store, config
        self.clock = clock or SystemClock()
        self.rng = rng or random.Random(None if config.seed < 0 else config.seed)
        self.id = sender_id or new_worker_id("sender")
        self.backoff = Backoff(config.backoff_base, config.backoff_cap)
        self.use_keys = use_keys
        self.sent = 0
        self.failed = 0

    def run(self, stop: threading.Event | None = None, *, exit_when_idle: bool = False,
            idle_when=None) -> None:
        """Send until `stop` is set, or (exit_when_idle) nothing is left to send and
        `idle_when()` (if given) says no more rows can appear."""
        stop = stop or threading.Event()
        while not stop.is_set():
            try:
                worked = self.run_once()
            except StoreBusy:
                worked = False
            except ConnectionDropped as exc:  # an outbox row claimed, perhaps
                if not exc.at_commit:
                    raise  # it reconnected, and lost the connection again, past the window
                unknown_write(exc, self.config.outbox_lease, self.clock, self.id)
                worked = False
            if worked:
                continue
            # Ask "can more rows appear?" first: a delivery commits its rows with its state,
            # so once no job is active every row that will ever exist is already visible.
            if exit_when_idle and (idle_when is None or idle_when()) and \
                    self.store.unsent_rows() == 0:
                return
            self.clock.sleep(self.config.poll_interval * (0.5 + self.rng.random()))

    def run_once(self) -> bool:
        """Send one due row. False when nothing was due."""
        row = self.store.claim_outbox(self.id, self.clock.now(), self.config.outbox_lease,
                                      self.config.outbox_max_attempts)
        if row is None:
            return False
        hooks.set_current_job(row.job_id)  # the crash points' job, as a worker's slot notes it
        try:
            self.send(row)
        except Exception as exc:
            self._failed(row, exc)
            return True
        crashpoint("sender.after_send")
        if retry_store(lambda: self.store.mark_sent(row, self.id, self.clock.now()),
                       self.clock, row.lease_until):
            self.sent += 1
        return True

    def send(self, row: OutboxClaim) -> None:
        """POST the row's payload; raises the retry policy's errors."""
        headers = {"X-Ninelives-Job": row.job_id, "X-Ninelives-Kind": row.kind,
                   "X-Ninelives-Worker": self.id}
        if self.use_keys:
            headers["Idempotency-Key"] = row.idempotency_key
        post_json(self.config.receiver_url, json.loads(row.payload), headers,
                  self.config.send_timeout)

    def _failed(self, row: OutboxClaim, exc: Exception) -> None:
        self.failed += 1
        retry_at = None
        if classify(exc) and row.attempts < self.config.outbox_max_attempts:
            retry_at = self.clock.now() + self.backoff.delay(
                row.attempts, self.rng, getattr(exc, "retry_after", None))
        error = f"{row.kind}: {type(exc).__name__}: {exc}"
        if retry_at is None:
            error += f" (dead-lettered after {row.attempts} attempts)"
        log.info("outbox row %s: %s", row.id, error)
        retry_store(lambda: self.store.outbox_failed(row, self.id, self.clock.now(),
                                                     error=error, retry_at=retry_at),
                    self.clock, row.lease_until)
