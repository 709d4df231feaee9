"""The broken senders and job slots: patches that remove one safety mechanism of the outbox's
sender (its idempotency key, its claim, its backoff, its sent mark's order), of the worker's
job slots (their group commit, their heartbeat), or of durability (see
chaos.reference.mutants.patches for how a patch works)."""
from __future__ import annotations

import dataclasses
from contextlib import contextmanager
from typing import Any, Callable

from engine import hooks, worker
from engine.outbox import Sender
from engine.slots import GroupCommit
from engine.worker import Worker

from chaos.reference.mutants.sql import edit_sql
from chaos.reference.mutants.wrapping import edits_of, wrap


def sender_without_key() -> None:
    """The sender posts effects without their Idempotency-Key: every resend after an
    ambiguous outcome is applied again."""
    wrap(Sender, "__init__", lambda original: lambda self, *a, **k: original(
        self, *a, **{**k, "use_keys": False}))


def key_from_row_id() -> None:
    """The sender's Idempotency-Key is the outbox row's id (`outbox:<id>`), not a name of
    the effect: SQLite gives a lost row's id (INTEGER PRIMARY KEY, max + 1) to the next row,
    so after a power cut loses a sent row, another effect is posted under a key the
    receiver has already applied."""
    def make(original: Callable) -> Callable:
        def send(self: Sender, row) -> None:
            original(self, dataclasses.replace(row, idempotency_key=f"outbox:{row.id}"))
        return send
    wrap(Sender, "send", make)


def senders_without_claim(store: type) -> None:
    """Senders ignore outbox leases: a row another sender holds is as due as a free one, so
    two senders send it at once."""
    edit_sql(store, edits_of(store, "senders_without_claim"))


def dead_letter_at_first_failure() -> None:
    """A send that fails for a retryable reason (5xx, timeout) is dead-lettered at once."""
    def make(original: Callable) -> Callable:
        def failed(self: Sender, row, exc: Exception) -> None:
            self.store.outbox_failed(row, self.id, self.clock.now(), error=str(exc),
                                     retry_at=None)
        return failed
    wrap(Sender, "_failed", make)


def outbox_retry_at_once() -> None:
    """A failed send is retried at once, without the backoff wait."""
    def make(original: Callable) -> Callable:
        def failed(self: Sender, row, exc: Exception) -> None:
            self.store.outbox_failed(row, self.id, self.clock.now(), error=str(exc),
                                     retry_at=self.clock.now())
        return failed
    wrap(Sender, "_failed", make)


def claims_newest_first(store: type) -> None:
    """The claim picks the due job that fell due last (ORDER BY ... DESC): under a backlog
    the oldest due work waits behind every newer job."""
    edit_sql(store, edits_of(store, "claims_newest_first"))


def outbox_claim_lease_in_past(store: type) -> None:
    """A sender's claim sets the row's lease to end before the claim (now - lease): any other
    sender may take the row while the first is still sending it."""
    def make(original: Callable) -> Callable:
        def claim(self, sender, now, lease, max_attempts):
            return original(self, sender, now, -lease, max_attempts)
        return claim
    wrap(store, "claim_outbox", make)


def client_fails_before_sending() -> None:
    """The provider client raises in its own code before the request leaves (a malformed
    request it builds), and the worker parks the job as poison although nobody refused it."""
    import engine.provider as provider

    def make(original: Callable) -> Callable:
        def post(url, body, headers, timeout):
            raise ValueError(f"cannot encode the request for {url}")
        return post
    provider.post_json = make(provider.post_json)


def heartbeat_inverted() -> None:
    """The worker builds its heartbeat only when heartbeat is off: workers that should renew
    their lease never do, and a slow call loses it."""
    def make(original: Callable) -> Callable:
        def init(self: Worker, store, config, **kwargs):
            original(self, store, dataclasses.replace(config, heartbeat=not config.heartbeat),
                     **kwargs)
            self.config = config
        return init
    wrap(Worker, "__init__", make)


def mark_sent_before_send() -> None:
    """The sender marks a row sent before posting it: a post that fails loses the effect."""
    def make(original: Callable) -> Callable:
        def send(self: Sender, row) -> None:
            self.store.mark_sent(row, self.id, self.clock.now())
            original(self, row)
        return send
    wrap(Sender, "send", make)


def group_stale_fails_all() -> None:
    """A group commit lets one stale write fail the whole group: the others' paid-for
    results are rolled back with it, and every slot of the group walks away from a job whose
    lease it still holds."""
    def run(store, group):
        results = []
        with store.batch():
            for entry in group:
                results.append((entry.write(store), None))  # a LeaseLost undoes them all
            hooks.crashpoint("worker.group.before_commit")
        return results
    GroupCommit._run = staticmethod(run)


def heartbeat_one_slot() -> None:
    """The heartbeat watches one claim at a time, as a single-job worker's does: with slots,
    only the step that began last is beaten for, and the others' leases run out under them."""
    def make(original: Callable) -> Callable:
        @contextmanager
        def watching(self, claim, worker_id=None):
            with self._lock:
                self._watched.clear()
            with original(self, claim, worker_id) as lost:
                yield lost
        return watching
    wrap(worker.Heartbeat, "watching", make)


def commit_not_durable() -> None:
    """The store acknowledges a commit before it is durable: its connections run
    synchronous=OFF (no fsync of the log at a commit; on PostgreSQL synchronous_commit=off)
    while the engine's settings, and its adapter, still say FULL. Only a power cut tells
    (faults.power_loss): a process killed leaves its writes in the machine's cache."""
    from engine.store import sqlite as sqlite_store
    from engine.store.postgres_session import PostgresSession  # psycopg: imported here

    def make(original: Callable) -> Callable:
        def connect(*args: Any, **kwargs: Any):
            conn = original(*args, **kwargs)
            conn.execute("PRAGMA synchronous=OFF")
            return conn
        return connect
    wrap(sqlite_store, "connect", make)  # the name SQLiteStore opens its file with

    def make_pg(original: Callable) -> Callable:
        def open_(self):
            conn = original(self)
            conn.execute("SET synchronous_commit = off")
            return conn
        return open_
    wrap(PostgresSession, "_open", make_pg)
