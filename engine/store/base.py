"""What every store backend returns and raises: claims, effects, spend records, errors."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..states import Step


class DatabaseError(Exception):
    """The database cannot be used as asked; the message names the file and the cause."""


class StoreBusy(DatabaseError):
    """Another process held the write lock past the busy timeout. Safe to retry."""


class ConnectionDropped(DatabaseError):
    """A client-server backend's connection broke during a write, and the store could not
    make it good: `at_commit`, it broke while COMMIT was in flight and whether the
    transaction committed could not be found out (the store resolves that itself where it
    can: see PostgresSession._write); otherwise nothing was committed, and the connection
    broke again on every try within the reconnect window. The store reconnects on its next
    call."""

    def __init__(self, message: str, at_commit: bool) -> None:
        super().__init__(message)
        self.at_commit = at_commit


class LeaseLost(Exception):
    """A fenced write matched no row: another worker holds the job now."""

    def __init__(self, job_id: str, doing: str) -> None:
        super().__init__(f"lease on job {job_id} was taken by another worker while {doing}")
        self.job_id = job_id


class SubmissionConflict(ValueError):
    """A job id submitted again with a different payload (the original is untouched)."""

    def __init__(self, job_id: str, stored_pipeline: str, pipeline: str) -> None:
        what = ("pipeline" if stored_pipeline != pipeline else "payload")
        super().__init__(f"job {job_id!r} already exists with a different {what}; "
                         "the original job is unchanged (submit it under a new id)")
        self.job_id = job_id


@dataclass(frozen=True)
class Claim:
    """A leased job: what the worker needs to run its step, and the token that fences it."""

    job_id: str
    step: Step
    lease_token: int
    claims: int
    attempts: int
    lease_until: float
    payload: str
    memos: dict[str, str]  # committed outputs of this job's steps, by step name

    @property
    def memo(self) -> str | None:
        """This step's committed output, when an earlier run finished it."""
        return self.memos.get(self.step.name)


@dataclass(frozen=True)
class Effect:
    """A side effect a step asks for; it leaves through the outbox."""

    kind: str
    payload: Any

    def key(self, job_id: str) -> str:
        """The idempotency key the receiver sees: stable for (job, kind)."""
        return f"{job_id}:{self.kind}"


@dataclass(frozen=True)
class Spend:
    """One billed (or possibly billed) provider call."""

    job_id: str
    step: str
    worker: str
    lease_token: int
    started: float
    ended: float
    outcome: str
    cost: float | None
    error: str | None = None

    #: The record's insert, the same on every backend, with `row()` as its parameters.
    INSERT = ("INSERT INTO spend (job_id, step, worker, lease_token, started, ended, outcome,"
              " cost, error) VALUES (?,?,?,?,?,?,?,?,?)")

    def row(self) -> tuple:
        """The parameters of `INSERT`."""
        return (self.job_id, self.step, self.worker, self.lease_token, self.started,
                self.ended, self.outcome, self.cost, self.error)


@dataclass(frozen=True)
class OutboxClaim:
    """A leased outbox row."""

    id: int
    job_id: str
    kind: str
    payload: str
    idempotency_key: str
    lease_token: int
    attempts: int
    lease_until: float


def canonical_json(value: Any) -> str:
    """The one JSON spelling used for payloads, so equal payloads compare equal.

    Raises ValueError for what JSON cannot hold (NaN, infinities, sets, objects).
    """
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"payload is not JSON-serialisable: {exc}") from None
