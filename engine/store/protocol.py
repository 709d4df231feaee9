"""The `Store` protocol: what every backend provides to the worker, the sender, the CLI and
the operator, and the crash-safety obligations each method carries."""
from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from ..states import Pipeline
from .base import Claim, Effect, OutboxClaim, Spend


@runtime_checkable
class Store(Protocol):
    """One connection to an engine database. SQLite (`SQLiteStore`) is the embedded default;
    PostgreSQL (`PostgresStore`) serves workers on several hosts.

    Obligations every backend keeps (the contract suite in tests/ checks them on each):

    - **One transaction per method.** A method either commits all it writes or nothing: a
      process killed at any line leaves the database as before the call or as after it.
    - **Fencing.** Every claim (of a job or an outbox row) bumps that row's `lease_token`, and
      so does every operator move and crash-loop park. Every write a worker makes under a
      claim matches `id AND lease_token` (and the state it expects) and checks its row count;
      a write that matched nothing changed nothing and raises LeaseLost or returns False.
    - **First memo wins.** A step's memo is inserted, never overwritten; a fenced-out
      `complete` still commits its memo and its spend (the work and the bill are real), never
      its transition or its outbox rows.
    - **Busy is retryable.** StoreBusy means nothing was committed and the call may be made
      again; any other DatabaseError is not to be retried blindly.
    - **A lost connection is the store's to ride out** (client-server backends): within its
      reconnect window it reconnects, runs again a write that cannot have committed, and
      resolves one whose COMMIT's answer was lost (PostgreSQL: by its transaction id), so
      that a write returns once it committed exactly once. ConnectionDropped with
      `at_commit` means that could not be known: the caller may hold a claim it was not
      told of, and waits out its lease before claiming again (engine.worker.unknown_write).

    Time. Every method takes `now`, the caller's clock reading. The backends differ in whose
    clock places a lease:

    - SQLite keeps the caller's clock: leases, retry times and `updated` are the `now` given
      (aged by the lock wait). All workers share one machine, hence one clock.
    - PostgreSQL, by default (`lease_clock="database"`), places every lease, due time and
      timestamp it writes on the database server's clock; the caller's `now` only anchors the
      durations it passes (a `retry_at` is `now + delay`, and the delay is what is kept). So
      a worker whose clock runs ahead cannot claim a live lease, and one whose clock lags
      cannot keep an expired one. `lease_until` in a returned Claim or OutboxClaim is
      translated back onto the caller's clock (`now + lease`), for the caller's own deadlines.
      With `lease_clock="caller"` it behaves as SQLite does (deterministic tests, simulation).
    """

    backend: str
    #: What `open_store` was given to open this database (a path or a URL): enough to open
    #: another connection to it (the heartbeat's).
    target: str

    def close(self) -> None:
        """Close the connection; the store is unusable afterwards."""

    def schema_version(self) -> int:
        """The database's schema version (the engine's current one after opening it)."""

    def integrity_check(self) -> str:
        """'ok', or what the backend's own consistency check found wrong."""

    # -- jobs -------------------------------------------------------------------------------

    def submit(self, job_id: str, pipeline: Pipeline, payload: Any, now: float,
               by: str = "submit") -> bool:
        """Create the job unless it exists (True if created). Raises SubmissionConflict when
        the id exists with another payload or pipeline; the stored job is untouched."""

    def claim(self, pipeline: Pipeline, worker: str, now: float, lease: float,
              max_claims: int) -> Claim | None:
        """Lease the job due soonest (a ready job, or a working one whose lease expired) and
        move it into its working state, bumping its lease token. A job claimed `max_claims`
        times for one step is parked instead. None when nothing is due."""

    def input_for(self, claim: Claim, pipeline: Pipeline) -> Any:
        """The claimed step's input: the payload for the first step, else the previous memo."""

    def complete(self, claim: Claim, pipeline: Pipeline, worker: str, now: float, *,
                 output: str | None, cost: float = 0.0, effects: tuple[Effect, ...] = (),
                 spend: Spend | None = None, park_reason: str | None = None,
                 continue_lease: float | None = None,
                 claim_next: tuple[float, int] | None = None) -> Claim | None:
        """Commit a step in one transaction: memo, spend, transition, outbox rows (see
        SQLiteStore.complete). Raises LeaseLost when fenced out (memo and spend kept)."""

    def fail(self, claim: Claim, pipeline: Pipeline, worker: str, now: float, *,
             error: str, retry_at: float | None, spend: Spend | None = None) -> str:
        """Record a failed attempt: ready again at `retry_at`, or parked when it is None.
        Returns the new state. Raises LeaseLost (spend kept) when fenced out."""

    def heartbeat(self, job_id: str, lease_token: int, now: float, lease: float,
                  worker: str | None = None) -> bool:
        """Extend a live lease to `lease` seconds from now, never shortening it. False when
        the lease was taken or released."""

    def record_spend(self, spend: Spend) -> None:
        """Write one spend record on its own (a call billed after the lease was lost)."""

    # -- outbox -----------------------------------------------------------------------------

    def claim_outbox(self, sender: str, now: float, lease: float,
                     max_attempts: int) -> OutboxClaim | None:
        """Lease the unsent row due soonest (bumping its token); dead-letter rows past
        `max_attempts`. None when nothing is due."""

    def mark_sent(self, row: OutboxClaim, sender: str, now: float) -> bool:
        """Mark the row sent, fenced by its token. False if the lease was taken."""

    def outbox_failed(self, row: OutboxClaim, sender: str, now: float, *, error: str,
                      retry_at: float | None) -> bool:
        """Schedule a retry at `retry_at`, or dead-letter when it is None. Fenced."""

    # -- reading ----------------------------------------------------------------------------

    def query(self, sql: str, params: tuple = ()) -> list[dict]:
        """A read-only query with `?` placeholders; rows as dicts. The SQL must be portable
        across the backends (the operator's queries are)."""

    def job(self, job_id: str) -> dict | None:
        """The job's row, every column, or None."""

    def memo(self, job_id: str, step: str) -> str | None:
        """The committed output of the job's step, or None."""

    def active_jobs(self, pipeline: str) -> int:
        """How many jobs of `pipeline` still wait for a worker."""

    def unsent_rows(self) -> int:
        """How many outbox rows are neither sent nor dead-lettered."""

    # -- the operator (queries.OperatorQueries and operator.OperatorSQL) ------------------------

    def status(self, now: float) -> list[dict]: ...
    def outbox_status(self, now: float) -> list[dict]: ...
    def unsent(self, now: float, older_than: float, limit: int = 50) -> list[dict]: ...
    def stuck(self, now: float, limit: int = 50) -> list[dict]: ...
    def failures(self, parked: frozenset[str]) -> list[dict]: ...
    def jobs(self, states: frozenset[str], now: float, limit: int = 50
             ) -> tuple[list[dict], int]: ...
    def costs(self, now: float, window: float = 86400.0) -> list[dict]: ...
    def alerts(self, now: float, terminal: frozenset[str], parked: frozenset[str],
               unsent_after: float = 300.0) -> dict: ...

    def cancel(self, job_id: str, by: str, now: float) -> str:
        """Cancel a ready or parked job (bumps its token). Raises OperatorError."""

    def requeue(self, job_id: str, by: str, now: float) -> str:
        """Send a parked job back to its step's ready state. Raises OperatorError."""

    def resolve(self, job_id: str, by: str, now: float, output: Any | None = None) -> str:
        """Settle a parked step by hand (a new memo, or none). Raises OperatorError."""
