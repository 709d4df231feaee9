"""The toy engine's worker: claim a job by swapping its document, run its step, and write the
outcome with a swap against the document it claimed, so a worker whose job was touched by
anyone else (a new owner, an operator, a forced expiry) writes nothing."""
from __future__ import annotations

import json
import os
import random
import secrets
import sqlite3
import threading
import time
from typing import Callable

from chaos import probe

from . import calls, jobs, store
from .settings import Settings

#: every crash point the toy's processes pass (the probe refuses any other name).
POINTS = ("after_claim", "before_call", "after_call", "before_commit", "after_commit",
          "before_send", "after_send")
#: where a crash-looping payload kills its worker.
CRASH_LOOP_POINT = "after_claim"


def process_id() -> str:
    """A writer id unique per boot: toy-<pid>-<random>."""
    return f"toy-{os.getpid()}-{secrets.token_hex(3)}"


class Worker:
    """Runs steps until stopped. Takes a connection, the settings, the provider's base URL,
    a random source (backoff jitter) and a clock."""

    def __init__(self, conn: sqlite3.Connection, settings: Settings, provider_url: str,
                 rng: random.Random | None = None, clock: Callable[[], float] = time.time):
        self.conn, self.settings, self.provider_url = conn, settings, provider_url
        self.rng, self.clock = rng or random.Random(), clock
        self.id = process_id()
        self.steps = 0

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            if not self.tick():
                stop.wait(self.settings.poll)

    def tick(self) -> bool:
        """Claim one job and run its step; False when there was nothing to claim."""
        claimed = self.claim()
        if claimed is None:
            return False
        key, text, doc = claimed
        if doc["status"] in jobs.WORKING:
            probe.point("after_claim", key)
            self.work(key, text, doc)
        return True

    def claim(self) -> tuple[str, str, dict] | None:
        """(key, document text, document) of the job this worker now holds (or has just
        parked as a crash loop), or None."""
        now = self.clock()
        with store.write(self.conn):
            for key, text in store.in_states(self.conn, jobs.READY + jobs.WORKING):
                doc = json.loads(text)
                if not jobs.claimable(doc, now):
                    continue
                new = jobs.claim(doc, self.id, now, self.settings.lease, self.settings.max_claims)
                written = store.swap(self.conn, key, text, new)
                if written is not None:
                    return key, written, new
        return None

    def work(self, key: str, text: str, doc: dict) -> None:
        name = doc["step"]
        if name == "summarize":
            memo = doc["memo"].get(name)
            if memo is not None:  # memo hit: advance at once, no call
                self.commit(key, text, jobs.finish(doc, self.id, self.clock()))
                return
            if self.clock() >= doc["lease_expires"]:
                return  # past its lease a worker does not call; the next claim will
            self.summarize(key, text, doc)
        else:
            summary = doc["memo"]["summarize"]["output"]
            effect = {"job": key, "kind": jobs.EFFECT_KIND, "summary": summary.get("summary"),
                      "digest": summary.get("digest")}
            self.commit(key, text, jobs.finish(doc, self.id, self.clock(), effect=effect))

    def summarize(self, key: str, text: str, doc: dict) -> None:
        probe.point("before_call", key)
        try:
            output, cost = calls.summarize(
                self.provider_url, self.settings.provider_key, self.settings.model, key,
                self.id, doc["payload"], self.settings.call_timeout)
        except calls.Retryable as exc:
            probe.point("after_call", key)
            self.commit(key, text, jobs.retry(doc, self.id, str(exc), self.clock(),
                                              self.wait(doc["attempts"] + 1, exc.retry_after),
                                              self.settings.max_attempts))
            return
        except calls.Poison as exc:
            probe.point("after_call", key)
            self.commit(key, text, jobs.park(doc, self.id, f"poison: {exc}", "poison"))
            return
        probe.point("after_call", key)
        self.commit(key, text, jobs.finish(doc, self.id, self.clock(), output, cost))

    def commit(self, key: str, text: str, new: dict) -> bool:
        """Swap the claimed document for `new`; False (and nothing written) when the job
        changed since the claim: the lease is someone else's now, or the job was dropped."""
        with store.write(self.conn):
            probe.point("before_commit", key)
            written = store.swap(self.conn, key, text, new) is not None
        if written:
            self.steps += 1
            probe.point("after_commit", key)
        return written

    def wait(self, attempt: int, retry_after: float | None) -> float:
        """Full-jitter backoff after failed attempt `attempt`, never under a Retry-After."""
        wait = self.rng.uniform(0.0, self.settings.backoff_bound(attempt))
        return max(wait, retry_after) if retry_after is not None else wait
