"""The PostgreSQL store (psycopg 3): the same tables, transitions and fences as SQLite's, for
workers on several hosts sharing one server.

Isolation: READ COMMITTED with row locks, chosen per transition:
- a claim (of a job or an outbox row) is ONE `UPDATE ... FROM (SELECT ... FOR UPDATE SKIP
  LOCKED) RETURNING`: the row is locked before it is changed, a row another claimer holds is
  skipped rather than waited for, and PostgreSQL re-checks the due condition on the row's
  newest version after locking it, so two claimers can never take one row;
- every fenced write is a single-row compare-and-swap (`WHERE id AND lease_token AND state`)
  whose row count is checked: the UPDATE locks the row and re-evaluates its WHERE on the
  committed version, so a write from a fenced-out worker matches nothing;
- memo and outbox inserts are `ON CONFLICT DO NOTHING` on their keys: a concurrent insert of
  the same key waits for the other transaction and then does nothing (first memo wins).
Nothing reads a value and writes it back in a later statement without such a fence, which is
what SERIALIZABLE would protect; it would only add serialization failures to retry.

Time: leases run on the server's clock (see `Store`): SQL below writes `{NOW}`, which is
`statement_timestamp()` on the server, or the caller's `now` with `lease_clock="caller"`.
"""
from __future__ import annotations

from typing import Any

from ..hooks import crashpoint
from ..states import Pipeline
from .base import (Claim, DatabaseError, Effect, LeaseLost, OutboxClaim, Spend,
                   SubmissionConflict, canonical_json)
from .operator import OperatorSQL
from .postgres_claims import CLAIM_JOB, CLAIM_OUTBOX, CLOCK, NOW
from .postgres_schema import MIGRATIONS, SCHEMA_VERSION, VERSION_TABLE
from .postgres_session import Cursor, PostgresSession
from .postgres_verify import CommitEvidence
from .sqlite import SQLiteStore

__all__ = ["PostgresStore"]

LEASE_CLOCKS = ("database", "caller")


#: Key of the advisory lock that serialises migrations among processes opening one database.
MIGRATION_LOCK = 0x6E696E656C697665  # "ninelive"


class PostgresStore(PostgresSession, CommitEvidence, OperatorSQL):
    """A connection to one engine database on a PostgreSQL server.

    url: a libpq URL, `postgresql://user@host:port/dbname`;
    synchronous: "FULL" (synchronous_commit on: committed means on the server's disk) or
    "NORMAL" (synchronous_commit off: a server crash may lose the last commits, never
    corrupt them; a worker crash loses nothing);
    busy_timeout: seconds a write waits for a row lock (lock_timeout) before StoreBusy;
    lease_clock: "database" (leases and times on the server's clock, the default) or
    "caller" (the `now` each call gives, as SQLite: for deterministic tests and simulation);
    read_only: no migration, and every transaction is read-only;
    connect_timeout, reconnect_window and rng: see PostgresSession (how long to keep trying
    a server that cannot be reached; 0, the default, is one attempt).
    A Worker's heartbeat opens its own connection with `open_store(target)`, on the server's
    clock; a caller-clock user (a simulation) passes the Worker its own `beat_store`.
    Raises DatabaseError naming the server when it cannot connect, or the schema is newer.
    """

    backend = "postgres"
    #: An operator action locks the job's row as it reads it: READ COMMITTED takes no lock
    #: on a plain read, and a worker's write landing before the move would void it.
    ROW_LOCK = " FOR UPDATE"
    #: The SQLite store's lock-wait hooks, kept so that code setting them works on both: a
    #: PostgreSQL write waits on the server (lock_timeout), never in a client-side loop.
    wait_clock: Any = None
    waited: float = 0.0

    def __init__(self, url: str, *, synchronous: str = "FULL", busy_timeout: float = 5.0,
                 read_only: bool = False, lease_clock: str = "database",
                 connect_timeout: float = 10.0, reconnect_window: float = 0.0,
                 rng: Any = None) -> None:
        if lease_clock not in LEASE_CLOCKS:
            raise ValueError(f"lease_clock must be one of {LEASE_CLOCKS}, not {lease_clock!r}")
        self.db_clock = lease_clock == "database"
        super().__init__(url, synchronous=synchronous, busy_timeout=busy_timeout,
                         read_only=read_only, connect_timeout=connect_timeout,
                         reconnect_window=reconnect_window, rng=rng)
        self._migrate()

    def _params(self, now: float, **values: Any) -> dict:
        """Parameters for a statement written with `{NOW}`: the clock switch and `now`."""
        return {"db_clock": self.db_clock, "now": 0.0 if self.db_clock else now, **values}

    def _placed(self, now: float, when: float | None) -> float | None:
        """An absolute time of the caller's (a retry_at) as `{CLOCK} + this` expects it: an
        offset from the caller's `now` on the server's clock, itself on the caller's."""
        if when is None or not self.db_clock:
            return when
        return when - now

    def _server_now(self, now: float) -> float:
        """The time an operator action or query runs at: the server's, on its clock."""
        if not self.db_clock:
            return now
        return self._read("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()[0]

    # -- schema -----------------------------------------------------------------------------

    def _version(self, cur: Any) -> int:
        if cur.execute("SELECT to_regclass('ninelives_schema')").fetchone()[0] is None:
            return 0
        return cur.execute("SELECT COALESCE(MAX(version), 0) FROM ninelives_schema").fetchone()[0]

    def _migrate(self) -> None:
        """Bring the database to SCHEMA_VERSION: each migration in one transaction, under an
        advisory lock so that processes opening a new database together migrate it once.
        A current database is only read."""
        version = self._version(Cursor(self.conn))
        if version > SCHEMA_VERSION:
            raise DatabaseError(
                f"database {self.where} has schema version {version}, newer than this "
                f"engine's {SCHEMA_VERSION}: upgrade ninelives to open it (nothing was changed)")
        if version == SCHEMA_VERSION:
            return
        if self.read_only:
            raise DatabaseError(f"database {self.where} needs migrating to schema "
                                f"{SCHEMA_VERSION} but was opened read-only")
        with self.write() as cur:
            cur.execute("SELECT pg_advisory_xact_lock(%(key)s)", {"key": MIGRATION_LOCK})
            cur.execute(VERSION_TABLE)
            version = self._version(cur)  # another process may have migrated meanwhile
            for target in range(version, SCHEMA_VERSION):
                for statement in MIGRATIONS[target]:
                    cur.execute(statement)
                cur.execute("INSERT INTO ninelives_schema (version) VALUES (%(v)s)",
                            {"v": target + 1})

    def schema_version(self) -> int:
        return self._version(Cursor(self._connection()))

    def integrity_check(self) -> str:
        """'ok' when the server answers and the schema is current. (PostgreSQL guards its own
        pages with WAL and checksums; it has no integrity_check to run.)"""
        version = self.schema_version()
        return "ok" if version == SCHEMA_VERSION else f"schema version {version}"

    # -- submit -----------------------------------------------------------------------------

    def submit(self, job_id: str, pipeline: Pipeline, payload: Any, now: float,
               by: str = "submit") -> bool:
        """Create job `job_id` unless it exists (see Store.submit)."""
        body = canonical_json(payload)

        def run(cur: Cursor) -> bool:
            created = cur.execute(
                "INSERT INTO job (id, pipeline, state, payload, next_run_at, updated_by,"
                f" created, updated) VALUES (%(id)s, %(pipeline)s, %(state)s, %(payload)s,"
                f" {NOW}, %(by)s, {NOW}, {NOW}) ON CONFLICT (id) DO NOTHING",
                self._params(now, id=job_id, pipeline=pipeline.name, state=pipeline.initial,
                             payload=body, by=by)).rowcount
            if not created:
                row = cur.execute("SELECT pipeline, payload FROM job WHERE id=?",
                                  (job_id,)).fetchone()
                if (row[0], row[1]) != (pipeline.name, body):
                    raise SubmissionConflict(job_id, row[0], pipeline.name)
            crashpoint("submit.before_commit")
            return bool(created)

        return self._write(run, idempotent=True)

    # -- claim ------------------------------------------------------------------------------

    def claim(self, pipeline: Pipeline, worker: str, now: float, lease: float,
              max_claims: int) -> Claim | None:
        """Lease the job due soonest (see Store.claim); one statement per job looked at."""
        def run(cur: Cursor) -> Claim | None:
            claim = self._claim_in(cur, pipeline, worker, now, lease, max_claims)
            if claim is not None:
                crashpoint("claim.before_commit")
            return claim

        return self._write(run, idempotent=False,
                           verify=lambda claim: self._holds("job", claim, worker))

    def _claim_in(self, cur: Cursor, pipeline: Pipeline, worker: str, now: float,
                  lease: float, max_claims: int) -> Claim | None:
        if max_claims < 1:
            raise ValueError(f"max_claims must be at least 1, not {max_claims}")
        steps = pipeline.steps
        params = self._params(
            now, pipeline=pipeline.name, worker=worker, lease=lease, max_claims=max_claims,
            ready=[s.ready for s in steps], working=[s.working for s in steps],
            parked=[s.parked for s in steps], label=[repr(s.name) for s in steps])
        while True:
            row = cur.execute(CLAIM_JOB, params).fetchone()
            if row is None:
                return None
            job_id, state, claims, attempts, token, payload, leased, memos = row
            if leased:
                return Claim(job_id=job_id, step=pipeline.step_for(state), lease_token=token,
                             claims=claims, attempts=attempts, lease_until=now + lease,
                             payload=payload, memos=dict(memos))
            # a crash loop was parked by that statement: look at the next due job

    # -- finishing a step -------------------------------------------------------------------

    #: The step's input: the payload for the first step, else the previous memo (it reads
    #: only the Claim, so both backends share the one reading of it).
    input_for = SQLiteStore.input_for

    def complete(self, claim: Claim, pipeline: Pipeline, worker: str, now: float, *,
                 output: str | None, cost: float = 0.0, effects: tuple[Effect, ...] = (),
                 spend: Spend | None = None, park_reason: str | None = None,
                 continue_lease: float | None = None,
                 claim_next: tuple[float, int] | None = None) -> Claim | None:
        """Commit a step in ONE transaction: memo, spend, state, outbox rows (see
        SQLiteStore.complete for the options). Raises LeaseLost when fenced out: the memo and
        spend are kept, the transition and outbox rows are not."""
        step = claim.step
        target = step.parked if park_reason else step.done
        pipeline.check(step.working, target)

        def run(cur: Cursor) -> tuple[int, Claim | None]:
            result, memos = output, claim.memos
            if output is not None:
                kept = cur.execute(
                    "INSERT INTO step_result (job_id, step, output, cost, at, worker,"
                    f" lease_token) VALUES (%(job)s, %(step)s, %(output)s, %(cost)s, {NOW},"
                    " %(worker)s, %(token)s) ON CONFLICT (job_id, step) DO NOTHING",
                    self._params(now, job=claim.job_id, step=step.name, output=output,
                                 cost=cost, worker=worker, token=claim.lease_token)).rowcount
                if not kept:  # a fenced-out worker committed this step first; its memo wins
                    result = cur.execute("SELECT output FROM step_result WHERE job_id=? AND"
                                         " step=?", (claim.job_id, step.name)).fetchone()[0]
                memos = {**memos, step.name: result}
            if spend is not None:
                self._record_spend(cur, spend)
            moved = cur.execute(
                "UPDATE job SET state=%(target)s, result=COALESCE(%(result)s, result),"
                " attempts=0, claims=0,"
                f" next_run_at=CASE WHEN %(release)s THEN NULL ELSE {NOW} END, lease_until=0,"
                " lease_owner=NULL, last_error=%(reason)s, updated_by=%(worker)s,"
                f" updated={NOW} WHERE id=%(job)s AND lease_token=%(token)s"
                " AND state=%(working)s",
                self._params(now, target=target,
                             result=result if result is not None else claim.memo,
                             release=bool(park_reason) or target in pipeline.terminal,
                             reason=park_reason, worker=worker, job=claim.job_id,
                             token=claim.lease_token, working=step.working)).rowcount
            nxt = None
            if moved == 1 and target == step.done:  # a parked job sends nothing
                self._insert_effects(cur, claim.job_id, effects, worker, now)
                if continue_lease is not None and target not in pipeline.terminal:
                    nxt = self._continue(cur, claim, memos, pipeline, worker, now,
                                         continue_lease)
                elif claim_next is not None:
                    nxt = self._claim_in(cur, pipeline, worker, now, *claim_next)
            # When fenced out, the memo and spend still commit: the work is valid.
            crashpoint("worker.before_commit")
            return moved, nxt

        moved, nxt = self._write(run, idempotent=False, verify=lambda result: self._finished(
            claim, spend, result[0]))
        if moved != 1:
            raise LeaseLost(claim.job_id, f"finishing step {step.name!r}")
        return nxt

    def _continue(self, cur: Cursor, claim: Claim, memos: dict[str, str],
                  pipeline: Pipeline, worker: str, now: float, lease: float) -> Claim:
        step = pipeline.step_for(claim.step.done)
        pipeline.check(step.ready, step.working)
        cur.execute(
            f"UPDATE job SET state=%(working)s, claims=1, lease_until={NOW} + %(lease)s,"
            f" next_run_at={NOW} + %(lease)s, lease_owner=%(worker)s, updated_by=%(worker)s,"
            f" updated={NOW} WHERE id=%(job)s AND lease_token=%(token)s AND state=%(ready)s",
            self._params(now, working=step.working, lease=lease, worker=worker,
                         job=claim.job_id, token=claim.lease_token, ready=step.ready))
        return Claim(job_id=claim.job_id, step=step, lease_token=claim.lease_token, claims=1,
                     attempts=0, lease_until=now + lease, payload=claim.payload, memos=memos)

    def _insert_effects(self, cur: Cursor, job_id: str, effects: tuple[Effect, ...],
                        worker: str, now: float) -> None:
        for effect in effects:
            cur.execute(
                "INSERT INTO outbox (job_id, kind, payload, idempotency_key, next_attempt_at,"
                f" updated_by, created) VALUES (%(job)s, %(kind)s, %(payload)s, %(key)s, {NOW},"
                f" %(worker)s, {NOW}) ON CONFLICT (job_id, kind) DO NOTHING",
                self._params(now, job=job_id, kind=effect.kind,
                             payload=canonical_json(effect.payload), key=effect.key(job_id),
                             worker=worker))

    def fail(self, claim: Claim, pipeline: Pipeline, worker: str, now: float, *,
             error: str, retry_at: float | None, spend: Spend | None = None) -> str:
        """Record a failed attempt (see Store.fail). Raises LeaseLost (spend kept)."""
        step = claim.step
        target = step.ready if retry_at is not None else step.parked
        pipeline.check(step.working, target)

        def run(cur: Cursor) -> int:
            if spend is not None:
                self._record_spend(cur, spend)
            moved = cur.execute(
                "UPDATE job SET state=%(target)s, attempts=attempts+1,"
                f" next_run_at={CLOCK} + %(retry)s, lease_until=0, lease_owner=NULL,"
                f" last_error=%(error)s, updated_by=%(worker)s, updated={NOW}"
                " WHERE id=%(job)s AND lease_token=%(token)s AND state=%(working)s",
                self._params(now, target=target, retry=self._placed(now, retry_at),
                             error=error[:500], worker=worker, job=claim.job_id,
                             token=claim.lease_token, working=step.working)).rowcount
            crashpoint("worker.fail.before_commit")
            return moved

        if self._write(run, idempotent=False,
                       verify=lambda moved: self._finished(claim, spend, moved)) != 1:
            raise LeaseLost(claim.job_id, f"recording a failure of step {step.name!r}")
        return target

    def heartbeat(self, job_id: str, lease_token: int, now: float, lease: float,
                  worker: str | None = None) -> bool:
        """Extend a lease (see Store.heartbeat). False when the lease was taken. The
        caller passes the point worker.heartbeat first (engine.worker)."""

        def run(cur: Cursor) -> int:
            # GREATEST: a beat delayed between its clock read and its write never moves a
            # lease back (and so running it twice is the same as once).
            return cur.execute(
                f"UPDATE job SET lease_until=GREATEST(lease_until, {NOW} + %(lease)s),"
                f" next_run_at=GREATEST(next_run_at, {NOW} + %(lease)s),"
                " updated_by=COALESCE(%(worker)s, updated_by) WHERE id=%(job)s AND"
                " lease_token=%(token)s AND lease_until>0",
                self._params(now, lease=lease, worker=worker, job=job_id,
                             token=lease_token)).rowcount

        return self._write(run, idempotent=True) == 1

    def record_spend(self, spend: Spend) -> None:
        """Write a spend record on its own (a call billed after the lease was lost)."""
        self._write(lambda cur: self._record_spend(cur, spend), idempotent=False,
                    verify=lambda _: self._spent(spend))

    @staticmethod
    def _record_spend(cur: Cursor, s: Spend) -> None:
        # The call's times are the worker's own observation of it, kept as it reports them.
        cur.execute(Spend.INSERT, s.row())

    # -- outbox -----------------------------------------------------------------------------

    def claim_outbox(self, sender: str, now: float, lease: float,
                     max_attempts: int) -> OutboxClaim | None:
        """Lease the unsent row due soonest; dead-letter rows past the cap (one statement
        per row looked at)."""
        params = self._params(now, sender=sender, lease=lease, max_attempts=max_attempts)

        def run(cur: Cursor) -> OutboxClaim | None:
            while True:
                row = cur.execute(CLAIM_OUTBOX, params).fetchone()
                if row is None:
                    return None
                if row[-1]:  # leased, not dead-lettered
                    return OutboxClaim(*row[:-1], lease_until=now + lease)

        got = self._write(run, idempotent=False,
                          verify=lambda row: self._holds("outbox", row, sender))
        if got is not None:
            crashpoint("sender.after_claim")
        return got

    def mark_sent(self, row: OutboxClaim, sender: str, now: float) -> bool:
        """Mark a row sent, fenced by its lease token. False if the lease was taken."""
        def run(cur: Cursor) -> int:
            n = cur.execute(
                f"UPDATE outbox SET sent_at={NOW}, lease_until=0, lease_owner=NULL,"
                " updated_by=%(sender)s WHERE id=%(id)s AND lease_token=%(token)s"
                " AND sent_at IS NULL",
                self._params(now, sender=sender, id=row.id, token=row.lease_token)).rowcount
            crashpoint("sender.before_commit")
            return n

        # Run again after a commit of unknown outcome: the row ends up sent either way; the
        # answer is then False (already sent), and the sender sends nothing more for it.
        return self._write(run, idempotent=True) == 1

    def outbox_failed(self, row: OutboxClaim, sender: str, now: float, *, error: str,
                      retry_at: float | None) -> bool:
        """Schedule a retry at `retry_at`, or dead-letter (retry_at None). Fenced."""
        def run(cur: Cursor) -> int:
            return cur.execute(
                f"UPDATE outbox SET next_attempt_at=COALESCE({CLOCK} + %(retry)s,"
                f" next_attempt_at), dead_at=CASE WHEN %(dead)s THEN {NOW} END,"
                " lease_until=0, lease_owner=NULL, last_error=%(error)s, updated_by=%(sender)s"
                " WHERE id=%(id)s AND lease_token=%(token)s AND sent_at IS NULL",
                self._params(now, retry=self._placed(now, retry_at), dead=retry_at is None,
                             error=error[:500], sender=sender, id=row.id,
                             token=row.lease_token)).rowcount

        return self._write(run, idempotent=True) == 1

    # -- reading ----------------------------------------------------------------------------

    def query(self, sql: str, params: tuple = ()) -> list[dict]:
        """Run a read-only query (`?` placeholders) and return its rows."""
        cur = self._read(sql, params)
        cols = [d[0] for d in cur.description]
        return [dict(zip(cols, r)) for r in cur.fetchall()]

    def active_jobs(self, pipeline: str) -> int:
        """How many jobs of `pipeline` still wait for a worker (not terminal, not parked)."""
        return self._read("SELECT COUNT(*) FROM job WHERE pipeline=? AND next_run_at IS NOT"
                          " NULL", (pipeline,)).fetchone()[0]

    def unsent_rows(self) -> int:
        """How many outbox rows are neither sent nor dead-lettered."""
        return self._read("SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL AND dead_at IS"
                          " NULL").fetchone()[0]

    def job(self, job_id: str) -> dict | None:
        rows = self.query("SELECT * FROM job WHERE id=?", (job_id,))
        return rows[0] if rows else None

    def memo(self, job_id: str, step: str) -> str | None:
        row = self._read("SELECT output FROM step_result WHERE job_id=? AND step=?",
                         (job_id, step)).fetchone()
        return row[0] if row else None

    # -- the operator, on the server's clock ------------------------------------------------

    def cancel(self, job_id: str, by: str, now: float) -> str:
        return super().cancel(job_id, by, self._server_now(now))

    def requeue(self, job_id: str, by: str, now: float) -> str:
        return super().requeue(job_id, by, self._server_now(now))

    def resolve(self, job_id: str, by: str, now: float, output: Any | None = None) -> str:
        return super().resolve(job_id, by, self._server_now(now), output)

    def status(self, now: float) -> list[dict]:
        return super().status(self._server_now(now))

    def outbox_status(self, now: float) -> list[dict]:
        return super().outbox_status(self._server_now(now))

    def unsent(self, now: float, older_than: float, limit: int = 50) -> list[dict]:
        return super().unsent(self._server_now(now), older_than, limit)

    def stuck(self, now: float, limit: int = 50) -> list[dict]:
        return super().stuck(self._server_now(now), limit)

    def jobs(self, states: frozenset[str], now: float, limit: int = 50) -> tuple[list[dict], int]:
        return super().jobs(states, self._server_now(now), limit)

    def costs(self, now: float, window: float = 86400.0) -> list[dict]:
        return super().costs(self._server_now(now), window)


