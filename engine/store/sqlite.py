"""The SQLite store: every SQL statement the engine runs lives here.

One transaction primitive (`BEGIN IMMEDIATE`, rollback on any exception) serves every
write. Writes a worker makes after claiming carry `WHERE id=? AND lease_token=?` and check
their row count: a worker whose lease was taken cannot change the job.
"""
from __future__ import annotations

import json
import os
import random
import sqlite3
import time
from contextlib import contextmanager
from typing import Any, Iterator

from ..hooks import crashpoint
from ..states import Pipeline, Step
from .base import (Claim, DatabaseError, Effect, LeaseLost, OutboxClaim, Spend,
                   SubmissionConflict, canonical_json)
from .operator import OperatorSQL
from .sqlite_open import connect, explain, malformed
from .schema import MIGRATIONS, SCHEMA_VERSION

SYNCHRONOUS = ("FULL", "NORMAL")


class SQLiteStore(OperatorSQL):
    """A connection to one engine database file.

    path: the database file (created and migrated unless read_only);
    synchronous: "FULL" (committed means durable, the default) or "NORMAL";
    busy_timeout: seconds a write waits for the lock before StoreBusy.
    Raises DatabaseError naming the file when it is newer, read-only, locked or corrupt, or
    when it holds another program's tables and no engine schema (naming them).
    """

    backend = "sqlite"

    #: Where the wait for the write lock reads time and sleeps (a hooks.Clock; None: the
    #: machine's monotonic clock) and draws its jitter. A simulation sets both on its stores,
    #: which makes waiting for the lock a scheduling point on its virtual clock.
    wait_clock: Any = None
    wait_rng: Any = random
    #: Seconds the last write waited for the lock (see `_begin_immediate`).
    waited: float = 0.0
    #: Inside `batch()`: each write is a savepoint of the batch's transaction.
    _batched: bool = False

    def __init__(self, path: str | os.PathLike, *, synchronous: str = "FULL",
                 busy_timeout: float = 5.0, read_only: bool = False) -> None:
        self.path = os.fspath(path)
        if synchronous.upper() not in SYNCHRONOUS:
            raise ValueError(f"synchronous must be one of {SYNCHRONOUS}, not {synchronous!r}")
        self.read_only = read_only
        self.busy_timeout = busy_timeout
        self.conn = self._connect(synchronous.upper(), busy_timeout)
        self._migrate()
        # From here on `write()` waits for the lock itself: SQLite's own busy handler sleeps
        # a whole millisecond or more per retry, which starves writers under contention.
        self.conn.execute("PRAGMA busy_timeout=0")

    # -- connection and transactions -------------------------------------------------

    def _connect(self, synchronous: str, busy_timeout: float) -> sqlite3.Connection:
        """Every connection it makes: the seam the mutant catalog wraps to edit its SQL."""
        return connect(self.path, synchronous, busy_timeout, self.read_only)

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: BEGIN IMMEDIATE, COMMIT, or ROLLBACK on any exception.

        Waits up to `busy_timeout` seconds for the write lock, polling with short jittered
        sleeps so that waiting writers get their turn; raises StoreBusy after that.
        """
        if self._batched:
            with self._savepoint():
                yield self.conn
            return
        self._begin_immediate()
        try:
            yield self.conn
            self.conn.execute("COMMIT")
        except BaseException as exc:
            # A crash handler in a simulation raises through here: nothing uncommitted survives.
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.OperationalError) or malformed(exc):
                raise explain(exc, self.path, "write") from exc
            raise

    @contextmanager
    def batch(self) -> Iterator[None]:
        """One transaction for several writes (a group commit): every `write()` inside it
        is a savepoint in it, undone alone if it raises (so one write that fails, or one
        fenced out, leaves the others), and nothing commits before the batch does. Raises
        StoreBusy, as `write()` does, when the lock cannot be had.

        A write inside reads its time after the batch has the lock, so it waited for
        nothing (`waited` is 0 for it).
        """
        with self.write():
            self.waited, self._batched = 0.0, True
            try:
                yield
            finally:
                self._batched = False

    @contextmanager
    def _savepoint(self) -> Iterator[None]:
        self.conn.execute("SAVEPOINT w")
        try:
            yield
        except BaseException:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK TO w")
                self.conn.execute("RELEASE w")
            raise
        self.conn.execute("RELEASE w")

    def _begin_immediate(self) -> None:
        clock = self.wait_clock
        now = time.monotonic if clock is None else clock.now
        started = now()
        deadline = started + self.busy_timeout
        delay = 0.0001
        while True:
            try:
                self.conn.execute("BEGIN IMMEDIATE")
                # Measured even on the first try: SQLite's own busy handler may have waited
                # inside that execute for up to busy_timeout.
                self.waited = now() - started
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise explain(exc, self.path, "begin a write") from exc
                if now() >= deadline:
                    raise explain(exc, self.path, "begin a write") from exc
            (time.sleep if clock is None else clock.sleep)(
                delay * (0.5 + self.wait_rng.random()))
            delay = min(delay * 2, 0.004)

    @property
    def target(self) -> str:
        """The database file (what `open_store` opens again for another connection)."""
        return self.path

    def close(self) -> None:
        self.conn.close()

    def _migrate(self) -> None:
        version = self.conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise DatabaseError(
                f"database {self.path} has schema version {version}, newer than this engine's "
                f"{SCHEMA_VERSION}: upgrade ninelives to open it (nothing was changed)")
        if version == SCHEMA_VERSION:
            return
        if self.read_only:
            raise DatabaseError(f"database {self.path} needs migrating to schema "
                                f"{SCHEMA_VERSION} but was opened read-only")
        with self.write() as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]  # another may have won
            for target in range(version, SCHEMA_VERSION):
                for statement in MIGRATIONS[target]:
                    conn.execute(statement)
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def schema_version(self) -> int:
        return self.conn.execute("PRAGMA user_version").fetchone()[0]

    # -- submit ----------------------------------------------------------------------

    def submit(self, job_id: str, pipeline: Pipeline, payload: Any, now: float,
               by: str = "submit") -> bool:
        """Create job `job_id` unless it exists. True if created, False if it already was.

        Raises SubmissionConflict (the stored job untouched) when the id exists with
        another payload or pipeline.
        """
        body = canonical_json(payload)
        with self.write() as conn:
            created = conn.execute(
                "INSERT INTO job (id, pipeline, state, payload, next_run_at, updated_by,"
                " created, updated) VALUES (?,?,?,?,?,?,?,?) ON CONFLICT(id) DO NOTHING",
                (job_id, pipeline.name, pipeline.initial, body, now, by, now, now)).rowcount
            if not created:
                row = conn.execute("SELECT pipeline, payload FROM job WHERE id=?",
                                   (job_id,)).fetchone()
                if (row[0], row[1]) != (pipeline.name, body):
                    raise SubmissionConflict(job_id, row[0], pipeline.name)
            crashpoint("submit.before_commit")
        return bool(created)

    # -- claim -----------------------------------------------------------------------

    def claim(self, pipeline: Pipeline, worker: str, now: float, lease: float,
              max_claims: int) -> Claim | None:
        """Lease the job that is due soonest and move it into its working state.

        A ready job moves to its step's working state; a working job whose lease expired is
        resumed where it stands. The lease token is bumped, so every earlier owner is fenced
        out. A job claimed more than `max_claims` times for one step is parked instead (it
        kills its workers: counting failures alone would loop forever). Returns None when
        nothing is due.
        """
        if not self._due(pipeline.name, now):
            return None  # an idle poll reads; it does not take the write lock
        with self.write() as conn:
            # A lease runs from when it is written: a claim that waited for the lock must not
            # commit a lease that began (or even ended) before it had the job.
            now += self.waited
            claim = self._claim_in(conn, pipeline, worker, now, lease, max_claims)
            if claim is not None:
                crashpoint("claim.before_commit")
        return claim

    def _claim_in(self, conn: sqlite3.Connection, pipeline: Pipeline, worker: str, now: float,
                  lease: float, max_claims: int) -> Claim | None:
        """The claim itself, inside the caller's write transaction (a claim, or the
        completion of the worker's previous job)."""
        while True:
            row = conn.execute(
                "SELECT id, state, claims, attempts FROM job WHERE pipeline=? AND"
                " next_run_at IS NOT NULL AND next_run_at<=? ORDER BY next_run_at LIMIT 1",
                (pipeline.name, now)).fetchone()
            if row is None:
                return None
            job_id, state, claims, attempts = row
            step = pipeline.step_for(state)
            if state == step.ready:
                pipeline.check(state, step.working)
                claims = 0
            if claims < max_claims:
                return self._take_lease(conn, job_id, state, step, claims + 1, attempts,
                                        worker, now, lease)
            self._park_crash_loop(conn, pipeline, job_id, state, step, claims, worker, now)

    def _due(self, pipeline: str, now: float) -> bool:
        return self.conn.execute(
            "SELECT 1 FROM job WHERE pipeline=? AND next_run_at IS NOT NULL AND next_run_at<=?"
            " LIMIT 1", (pipeline, now)).fetchone() is not None

    def _take_lease(self, conn: sqlite3.Connection, job_id: str, state: str, step: Step,
                    claims: int, attempts: int, worker: str, now: float,
                    lease: float) -> Claim:
        until = now + lease
        row = conn.execute(
            "UPDATE job SET state=?, claims=?, lease_until=?, next_run_at=?, lease_owner=?,"
            " lease_token=lease_token+1, updated_by=?, updated=? WHERE id=? AND state=?"
            " RETURNING lease_token, payload",
            (step.working, claims, until, until, worker, worker, now, job_id, state)).fetchone()
        if row is None:  # cannot happen under BEGIN IMMEDIATE; fail loudly if it does
            raise LeaseLost(job_id, "claim lost its compare-and-swap")
        memos = dict(conn.execute("SELECT step, output FROM step_result WHERE job_id=?",
                                  (job_id,)).fetchall())
        return Claim(job_id=job_id, step=step, lease_token=row[0], claims=claims,
                     attempts=attempts, lease_until=until, payload=row[1], memos=memos)

    @staticmethod
    def _park_crash_loop(conn: sqlite3.Connection, pipeline: Pipeline, job_id: str, state: str,
                         step: Step, claims: int, worker: str, now: float) -> None:
        target = step.parked
        if state == step.ready:
            conn.execute("UPDATE job SET state=?, updated_by=?, updated=? WHERE id=?",
                         (step.working, worker, now, job_id))  # walk the edges, never skip
            state = step.working
        pipeline.check(state, target)
        conn.execute(
            "UPDATE job SET state=?, next_run_at=NULL, lease_until=0, lease_owner=NULL,"
            " lease_token=lease_token+1, last_error=?, updated_by=?, updated=? WHERE id=?",
            (target, f"crash loop: step {step.name!r} was claimed {claims} times without "
             "finishing; parked", worker, now, job_id))

    def input_for(self, claim: Claim, pipeline: Pipeline) -> Any:
        """The step's input: the job payload for the first step, else the previous memo."""
        index = pipeline.steps.index(claim.step)
        if index == 0:
            return json.loads(claim.payload)
        prev = pipeline.steps[index - 1].name
        if prev not in claim.memos:
            raise DatabaseError(f"job {claim.job_id} is at step {claim.step.name!r} but has no "
                                f"memo for the previous step {prev!r}")
        return json.loads(claim.memos[prev])

    # -- finishing a step --------------------------------------------------------------

    def complete(self, claim: Claim, pipeline: Pipeline, worker: str, now: float, *,
                 output: str | None, cost: float = 0.0, effects: tuple[Effect, ...] = (),
                 spend: Spend | None = None, park_reason: str | None = None,
                 continue_lease: float | None = None,
                 claim_next: tuple[float, int] | None = None) -> Claim | None:
        """Commit a step in ONE transaction: memo, spend, state, outbox rows.

        output: the step's JSON output, or None on a memo hit (the memo exists already);
        park_reason: the step's own verdict sends the job to its parked state;
        continue_lease: keep the job and move it into the next working state under the same
        lease (a claim saved per step); returns the next Claim then, else None.
        claim_next: (lease, max_claims): when this job is released (terminal or parked), claim
        the next due job in the same transaction (a claim transaction saved per job).
        Raises LeaseLost when the lease was taken: the memo and spend are kept (first writer
        wins, the work is valid), the transition and outbox rows are not.
        """
        step = claim.step
        target = step.parked if park_reason else step.done
        pipeline.check(step.working, target)
        with self.write() as conn:
            # The lock wait ages `now`: the next step's lease (continue_lease, claim_next)
            # must run from this commit, or it may be over before the worker starts on it.
            now += self.waited
            memos = claim.memos
            if output is not None:
                kept = conn.execute(
                    "INSERT OR IGNORE INTO step_result (job_id, step, output, cost, at, worker,"
                    " lease_token) VALUES (?,?,?,?,?,?,?)",
                    (claim.job_id, step.name, output, cost, now, worker,
                     claim.lease_token)).rowcount
                if not kept:  # a fenced-out worker committed this step first; its memo wins
                    output = self.memo(claim.job_id, step.name)
                memos = {**memos, step.name: output}
            if spend is not None:
                self._record_spend(conn, spend)
            moved = conn.execute(
                "UPDATE job SET state=?, result=COALESCE(?, result), attempts=0, claims=0,"
                " next_run_at=?, lease_until=0, lease_owner=NULL, last_error=?, updated_by=?,"
                " updated=? WHERE id=? AND lease_token=? AND state=?",
                (target, output if output is not None else claim.memo,
                 None if park_reason or target in pipeline.terminal else now,
                 park_reason, worker, now, claim.job_id, claim.lease_token,
                 step.working)).rowcount
            nxt = None
            if moved == 1 and target == step.done:  # a parked job sends nothing
                self._insert_effects(conn, claim.job_id, effects, worker, now)
                if continue_lease is not None and target == step.done \
                        and target not in pipeline.terminal:
                    nxt = self._continue(conn, claim, memos, pipeline, worker, now,
                                         continue_lease)
                elif claim_next is not None:
                    nxt = self._claim_in(conn, pipeline, worker, now, *claim_next)
            # When fenced out, the memo and spend still commit: the work is valid.
            crashpoint("worker.before_commit")
        if moved != 1:
            raise LeaseLost(claim.job_id, f"finishing step {step.name!r}")
        return nxt

    def _continue(self, conn: sqlite3.Connection, claim: Claim, memos: dict[str, str],
                  pipeline: Pipeline, worker: str, now: float, lease: float) -> Claim:
        step = pipeline.step_for(claim.step.done)
        pipeline.check(step.ready, step.working)
        until = now + lease
        conn.execute(
            "UPDATE job SET state=?, claims=1, lease_until=?, next_run_at=?, lease_owner=?,"
            " updated_by=?, updated=? WHERE id=? AND lease_token=? AND state=?",
            (step.working, until, until, worker, worker, now, claim.job_id,
             claim.lease_token, step.ready))
        return Claim(job_id=claim.job_id, step=step, lease_token=claim.lease_token, claims=1,
                     attempts=0, lease_until=until, payload=claim.payload, memos=memos)

    @staticmethod
    def _insert_effects(conn: sqlite3.Connection, job_id: str, effects: tuple[Effect, ...],
                        worker: str, now: float) -> None:
        for effect in effects:
            conn.execute(
                "INSERT OR IGNORE INTO outbox (job_id, kind, payload, idempotency_key,"
                " next_attempt_at, updated_by, created) VALUES (?,?,?,?,?,?,?)",
                (job_id, effect.kind, canonical_json(effect.payload), effect.key(job_id), now,
                 worker, now))

    def fail(self, claim: Claim, pipeline: Pipeline, worker: str, now: float, *,
             error: str, retry_at: float | None, spend: Spend | None = None) -> str:
        """Record a failed attempt: back to the ready state until `retry_at`, or park.

        retry_at None parks the job in its step's parked state with `error` as last_error.
        Returns the state the job is now in. Raises LeaseLost (spend kept) if fenced out.
        """
        step = claim.step
        target = step.ready if retry_at is not None else step.parked
        pipeline.check(step.working, target)
        with self.write() as conn:
            if spend is not None:
                self._record_spend(conn, spend)
            moved = conn.execute(
                "UPDATE job SET state=?, attempts=attempts+1, next_run_at=?, lease_until=0,"
                " lease_owner=NULL, last_error=?, updated_by=?, updated=?"
                " WHERE id=? AND lease_token=? AND state=?",
                (target, retry_at, error[:500], worker, now, claim.job_id, claim.lease_token,
                 step.working)).rowcount
            crashpoint("worker.fail.before_commit")
        if moved != 1:
            raise LeaseLost(claim.job_id, f"recording a failure of step {step.name!r}")
        return target

    def heartbeat(self, job_id: str, lease_token: int, now: float, lease: float,
                  worker: str | None = None) -> bool:
        """Extend a lease. False when the lease was taken (the row count says so). The
        caller passes the point worker.heartbeat first (engine.worker)."""
        with self.write() as conn:
            until = now + self.waited + lease  # an extension runs from when it is written
            # ... and never moves a lease back: a beat delayed between its clock read and
            # its write (a pause, a scheduling gap) would otherwise end a live lease early.
            n = conn.execute("UPDATE job SET lease_until=MAX(lease_until, ?),"
                             " next_run_at=MAX(next_run_at, ?),"
                             " updated_by=COALESCE(?, updated_by) WHERE id=? AND"
                             " lease_token=? AND lease_until>0",
                             (until, until, worker, job_id, lease_token)).rowcount
        return n == 1

    def record_spend(self, spend: Spend) -> None:
        """Write a spend record on its own (a call billed after the lease was lost)."""
        with self.write() as conn:
            self._record_spend(conn, spend)

    @staticmethod
    def _record_spend(conn: sqlite3.Connection, s: Spend) -> None:
        conn.execute(Spend.INSERT, s.row())

    # -- outbox ----------------------------------------------------------------------

    def claim_outbox(self, sender: str, now: float, lease: float,
                     max_attempts: int) -> OutboxClaim | None:
        """Lease the unsent outbox row that is due soonest; dead-letter rows past the cap."""
        while True:
            if self.conn.execute("SELECT 1 FROM outbox WHERE sent_at IS NULL AND dead_at IS NULL"
                                 " AND next_attempt_at<=? LIMIT 1", (now,)).fetchone() is None:
                return None
            with self.write() as conn:
                now += self.waited  # the row's lease runs from this write, as a job's does
                row = conn.execute(
                    "SELECT id, attempts FROM outbox WHERE sent_at IS NULL AND dead_at IS NULL"
                    " AND next_attempt_at<=? ORDER BY next_attempt_at LIMIT 1",
                    (now,)).fetchone()
                if row is None:
                    return None
                if row[1] >= max_attempts:
                    conn.execute(
                        "UPDATE outbox SET dead_at=?, lease_until=0, lease_owner=NULL,"
                        " lease_token=lease_token+1, last_error=COALESCE(last_error, '') || ?,"
                        " updated_by=? WHERE id=?",
                        (now, f" [dead-lettered after {row[1]} attempts]", sender, row[0]))
                    continue
                until = now + lease
                got = conn.execute(
                    "UPDATE outbox SET attempts=attempts+1, lease_until=?, next_attempt_at=?,"
                    " lease_owner=?, lease_token=lease_token+1, updated_by=? WHERE id=?"
                    " RETURNING id, job_id, kind, payload, idempotency_key, lease_token,"
                    " attempts", (until, until, sender, sender, row[0])).fetchone()
            crashpoint("sender.after_claim")
            return OutboxClaim(*got, lease_until=until)

    def mark_sent(self, row: OutboxClaim, sender: str, now: float) -> bool:
        """Mark a row sent, fenced by its lease token. False if the lease was taken."""
        with self.write() as conn:
            n = conn.execute(
                "UPDATE outbox SET sent_at=?, lease_until=0, lease_owner=NULL, updated_by=?"
                " WHERE id=? AND lease_token=? AND sent_at IS NULL",
                (now, sender, row.id, row.lease_token)).rowcount
            crashpoint("sender.before_commit")
        return n == 1

    def outbox_failed(self, row: OutboxClaim, sender: str, now: float, *, error: str,
                      retry_at: float | None) -> bool:
        """Schedule a retry at `retry_at`, or dead-letter (retry_at None). Fenced."""
        with self.write() as conn:
            n = conn.execute(
                "UPDATE outbox SET next_attempt_at=COALESCE(?, next_attempt_at), dead_at=?,"
                " lease_until=0, lease_owner=NULL, last_error=?, updated_by=?"
                " WHERE id=? AND lease_token=? AND sent_at IS NULL",
                (retry_at, None if retry_at is not None else now, error[:500], sender, row.id,
                 row.lease_token)).rowcount
        return n == 1

    # -- reading -----------------------------------------------------------------------

    def query(self, sql: str, params: tuple = ()) -> list[dict]:
        """Run a read-only query and return its rows (operator queries live in queries.py)."""
        cur = self.conn.execute(sql, params)
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r)) for r in cur.fetchall()]

    def active_jobs(self, pipeline: str) -> int:
        """How many jobs of `pipeline` still wait for a worker (not terminal, not parked)."""
        return self.conn.execute("SELECT COUNT(*) FROM job WHERE pipeline=? AND next_run_at IS"
                                 " NOT NULL", (pipeline,)).fetchone()[0]

    def unsent_rows(self) -> int:
        """How many outbox rows are neither sent nor dead-lettered."""
        return self.conn.execute("SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL AND"
                                 " dead_at IS NULL").fetchone()[0]

    def job(self, job_id: str) -> dict | None:
        rows = self.query("SELECT * FROM job WHERE id=?", (job_id,))
        return rows[0] if rows else None

    def memo(self, job_id: str, step: str) -> str | None:
        row = self.conn.execute("SELECT output FROM step_result WHERE job_id=? AND step=?",
                                (job_id, step)).fetchone()
        return row[0] if row else None

    def integrity_check(self) -> str:
        return self.conn.execute("PRAGMA integrity_check").fetchone()[0]
