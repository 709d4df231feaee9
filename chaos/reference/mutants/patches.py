"""The broken engines: each patch removes ONE safety mechanism from the reference engine.

A patch runs inside an engine process started by `python -m chaos.reference.mutants NAME ROLE ...`,
before the engine's CLI starts, and changes that process only. Where the mechanism is a
guard in a SQL statement, the patch rewrites that statement as it is executed (`SQLEdit`):
the mutant is then literally the reference engine's SQL minus the guard, and a statement
that no longer reads as the patch expects stops the process with `MutantOutOfDate` instead
of running an engine that is silently not broken. Where the mechanism is Python, the patch
wraps or replaces the one method that carries it.

A mechanism in the store exists once per backend: such a patch (`STORE_PATCHES`) takes the
store class it breaks (SQLiteStore or PostgresStore) and removes the same mechanism there,
with that backend's SQL (chaos.reference.mutants.sql: a mutant's edits per backend), in
the engine process of either backend. The other patches
(`PATCHES`) break code both backends run: the worker, the sender, the retry policy, the
provider client.

Submission mutants change the harness's own call (see chaos.reference.mutants.catalog); they have no
patch here.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable

from engine import hooks, retry, worker
from engine.store import Claim, LeaseLost, SQLiteStore
from engine.worker import Worker

from chaos.reference.mutants.sender_patches import (claims_newest_first,
                                                    client_fails_before_sending, commit_not_durable,
                                                    dead_letter_at_first_failure,
                                                    group_stale_fails_all, heartbeat_inverted,
                                                    heartbeat_one_slot, key_from_row_id,
                                                    mark_sent_before_send,
                                                    outbox_claim_lease_in_past,
                                                    outbox_retry_at_once, sender_without_key,
                                                    senders_without_claim)
from chaos.reference.mutants.sql import EditingConnection, MutantOutOfDate, SQLEdit, edit_sql
from chaos.reference.mutants.wrapping import BACKENDS, edits_of, store_classes, wrap

__all__ = ["EditingConnection", "MutantOutOfDate", "PATCHES", "SQLEdit", "STORE_PATCHES",
           "apply", "store_classes"]


# -- job leases and fencing ------------------------------------------------------------------

def no_state_guard(store: type) -> None:
    """The article's claim: read a due job, then take it in a later transaction with an
    update guarded by lease time only (`lease_until <= now`), not by the state it read."""
    if store.backend == "postgres":
        from chaos.reference.mutants.pg_claim import article_claim
        wrap(store, "claim", article_claim)
        return

    def claim(self: SQLiteStore, pipeline, worker_id: str, now: float, lease: float,
              max_claims: int) -> Claim | None:
        row = self.conn.execute(
            "SELECT id, state, claims, attempts FROM job WHERE pipeline=? AND next_run_at IS"
            " NOT NULL AND next_run_at<=? ORDER BY next_run_at LIMIT 1",
            (pipeline.name, now)).fetchone()
        if row is None:
            return None
        job_id, state, claims, attempts = row
        step = pipeline.step_for(state)
        claims = 0 if state == step.ready else claims
        until = now + lease
        with self.write() as conn:
            if claims >= max_claims:  # the crash-loop cap is kept as the reference has it
                self._park_crash_loop(conn, pipeline, job_id, state, step, claims, worker_id, now)
                return None
            got = conn.execute(
                "UPDATE job SET state=?, claims=?, lease_until=?, next_run_at=?, lease_owner=?,"
                " lease_token=lease_token+1, updated_by=?, updated=? WHERE id=? AND"
                " lease_until<=? RETURNING lease_token, payload",
                (step.working, claims + 1, until, until, worker_id, worker_id, now, job_id,
                 now)).fetchone()
            if got is None:
                return None  # someone took it first; poll again
            memos = dict(conn.execute("SELECT step, output FROM step_result WHERE job_id=?",
                                      (job_id,)).fetchall())
            hooks.crashpoint("claim.before_commit")
        return Claim(job_id=job_id, step=step, lease_token=got[0], claims=claims + 1,
                     attempts=attempts, lease_until=until, payload=got[1], memos=memos)

    store.claim = claim


def fail_fenced_by_id(store: type) -> None:
    """A failure or retry write guarded by the job id alone (the article's fail_step): a
    worker whose lease was taken moves the job back anyway and clears the new lease."""
    edit_sql(store, edits_of(store, "fail_fenced_by_id"))


def no_token_on_complete(store: type) -> None:
    """Completion guarded by the state alone: a zombie whose lease was taken commits the
    step (and moves the job on) while the new owner is still working it."""
    edit_sql(store, edits_of(store, "no_token_on_complete"))


def heartbeat_ignores_rowcount(store: type) -> None:
    """The heartbeat extends the lease by job id and ignores its row count: the worker never
    learns it lost the lease, and its beats extend the new owner's lease.

    The token goes too because ignoring the row count alone changes nothing here: the worker
    does not act on the heartbeat's "lost" signal (its fenced completion does the
    abandoning), and a fenced beat of a lost lease matches no row."""
    edit_sql(store, edits_of(store, "heartbeat_ignores_rowcount"))

    def make(original: Callable) -> Callable:
        def heartbeat(self, *args: Any, **kwargs: Any) -> bool:
            original(self, *args, **kwargs)
            return True
        return heartbeat
    wrap(store, "heartbeat", make)


def claim_steals_live_leases(store: type) -> None:
    """The claim ignores lease expiry: a job another worker holds is as claimable as a
    due one."""
    edit_sql(store, edits_of(store, "claim_steals_live_leases"))


def no_crash_loop_cap() -> None:
    """Claims per step are not capped: a job that kills its worker every time is claimed
    forever (the worker is told the cap is practically infinite)."""
    def make(original: Callable) -> Callable:
        def __init__(self: Worker, store, config, **kwargs: Any) -> None:
            original(self, store, dataclasses.replace(config, max_claims=2 ** 62), **kwargs)
        return __init__
    wrap(Worker, "__init__", make)


# -- memos and the completing transaction ------------------------------------------------------

def memo_check_skipped() -> None:
    """The worker never looks for a memo (neither the one its claim read nor the fresh one
    it reads right before paying for the call): a committed step is paid for again."""
    def make_work(original: Callable) -> Callable:
        def work(self: Worker, claim: Claim) -> Claim | None:
            memos = {k: v for k, v in claim.memos.items() if k != claim.step.name}
            return original(self, dataclasses.replace(claim, memos=memos))
        return work

    def make_run_step(original: Callable) -> Callable:
        def _run_step(self: Worker, claim: Claim, ctx) -> Claim | None:
            # The step's first memo read is the fresh look before the call: it finds nothing.
            store, real = self.store, self.store.memo
            looked = []

            def memo(job_id: str, step: str) -> str | None:
                if not looked:
                    looked.append(True)
                    return None
                return real(job_id, step)

            store.memo = memo  # an instance attribute shadows the method for this step only
            try:
                return original(self, claim, ctx)
            finally:
                del store.memo
        return _run_step

    wrap(Worker, "work", make_work)
    wrap(Worker, "_run_step", make_run_step)


def memo_last_writer_wins(store: type) -> None:
    """The memo insert replaces an existing memo: a zombie's late result overwrites the one
    the job already moved on with."""
    edit_sql(store, edits_of(store, "memo_last_writer_wins"))


def separate_transactions(store: type) -> None:
    """Completion as three transactions: the state change, then the memo and spend, then
    the outbox rows. A crash between them leaves a job ahead of its memo or its effects.
    Each boundary is the crash point `worker.after_commit` (a commit has just happened)."""
    def make(original: Callable) -> Callable:
        def complete(self, claim: Claim, pipeline, worker_id: str, now: float, *,
                     output: str | None, cost: float = 0.0, effects=(), spend=None,
                     **rest: Any) -> Claim | None:
            if output is not None:  # the state write alone: as if the memo were there already
                claim = dataclasses.replace(claim, memos={**claim.memos, claim.step.name: output})
            try:
                nxt = original(self, claim, pipeline, worker_id, now, output=None, cost=cost,
                               effects=(), spend=None, **rest)
            except LeaseLost:
                _memo_and_spend(self, claim, worker_id, now, output, cost, spend)
                raise
            hooks.crashpoint("worker.after_commit")
            _memo_and_spend(self, claim, worker_id, now, output, cost, spend)
            _effects_apart(self, claim, worker_id, now, effects, rest)
            return nxt
        return complete
    wrap(store, "complete", make)


def _effects_apart(store: Any, claim: Claim, worker_id: str, now: float, effects,
                   rest: dict) -> None:
    """The outbox rows in a transaction of their own, after the step has committed."""
    if effects and not rest.get("park_reason"):
        hooks.crashpoint("worker.after_commit")
        with store.write() as conn:
            store._insert_effects(conn, claim.job_id, tuple(effects), worker_id, now)


def _memo_and_spend(store: Any, claim: Claim, worker_id: str, now: float,
                    output: str | None, cost: float, spend) -> None:
    with store.write() as conn:
        if output is not None:  # first writer wins, in words both backends read
            conn.execute("INSERT INTO step_result (job_id, step, output, cost, at, worker,"
                         " lease_token) VALUES (?,?,?,?,?,?,?) ON CONFLICT (job_id, step)"
                         " DO NOTHING",
                         (claim.job_id, claim.step.name, output, cost, now, worker_id,
                          claim.lease_token))
        if spend is not None:
            store._record_spend(conn, spend)


def outbox_after_commit(store: type) -> None:
    """The completing transaction commits memo and state; the outbox rows follow in a
    transaction of their own. A crash in between delivers a job whose effects never leave.
    The boundary is the crash point `worker.after_commit` (the step has just committed)."""
    def make(original: Callable) -> Callable:
        def complete(self, claim: Claim, pipeline, worker_id: str, now: float, *,
                     effects=(), **rest: Any) -> Claim | None:
            nxt = original(self, claim, pipeline, worker_id, now, effects=(), **rest)
            _effects_apart(self, claim, worker_id, now, effects, rest)
            return nxt
        return complete
    wrap(store, "complete", make)


def spend_unrecorded() -> None:
    """A failed call leaves no spend record: billed work that failed (a hang, a bad answer)
    is invisible in the cost report."""
    def make(original: Callable) -> Callable:
        def _fail(self: Worker, claim: Claim, exc: Exception, started: float,
                  billed: bool = True, **keywords: Any) -> None:
            original(self, claim, exc, started, billed=False, **keywords)
        return _fail
    wrap(Worker, "_fail", make)


# -- retries ----------------------------------------------------------------------------------

def poison_retried() -> None:
    """Poison (4xx, unparseable or schema-invalid answers) is classified retryable, like a
    timeout: it is called again until the attempt cap."""
    original = worker.classify
    worker.classify = lambda exc: isinstance(exc, retry.PoisonError) or original(exc)


def retry_after_ignored() -> None:
    """Backoff ignores the server's Retry-After: a 429 is retried as soon as jitter says."""
    wrap(retry.Backoff, "delay", lambda original: lambda self, attempt, rng, retry_after=None:
         original(self, attempt, rng, None))


def backoff_without_jitter() -> None:
    """Backoff waits exactly its exponential ceiling: retries of failures that happened
    together happen together again."""
    def delay(self: retry.Backoff, attempt: int, rng, retry_after: float | None = None) -> float:
        wait = self.ceiling(attempt)
        return wait if retry_after is None else max(wait, retry_after)
    retry.Backoff.delay = delay


def jitter_narrowed() -> None:
    """Backoff draws its wait from the top half of the full-jitter range: still random, and
    never past the ceiling, but not the spread full jitter promises."""
    def delay(self: retry.Backoff, attempt: int, rng, retry_after: float | None = None) -> float:
        wait = rng.uniform(self.ceiling(attempt) / 2, self.ceiling(attempt))
        return wait if retry_after is None else max(wait, retry_after)
    retry.Backoff.delay = delay


def no_call_deadline() -> None:
    """Provider calls wait for their answer however long it takes: the call timeout is never
    passed on to the HTTP client."""
    from engine import provider
    wrap(provider.ChatClient, "complete", lambda original: lambda self, *a, **k: original(
        dataclasses.replace(self, timeout=3600.0), *a, **k))


# -- leases -----------------------------------------------------------------------------------

def heartbeat_keeps_deadline(store: type) -> None:
    """The heartbeat rewrites the lease without moving it: a step longer than the lease loses
    its lease under its live worker. (On PostgreSQL the beat's time is the server's, not a
    `now` the caller passes: there the statement writes the lease's end as it was.)"""
    if store.backend == "postgres":
        edit_sql(store, edits_of(store, "heartbeat_keeps_deadline"))
        return

    def make(original: Callable) -> Callable:
        def heartbeat(self: SQLiteStore, job_id: str, lease_token: int, now: float,
                      lease: float, worker: str | None = None) -> bool:
            row = self.conn.execute("SELECT lease_until FROM job WHERE id=?",
                                    (job_id,)).fetchone()
            held = row[0] if row and row[0] else now + lease
            return original(self, job_id, lease_token, held - lease, lease, worker)
        return heartbeat
    wrap(store, "heartbeat", make)


def claim_lease_already_over(store: type) -> None:
    """The claim sets the lease to end before the claim (now - lease, a sign slipped): the
    worker finds its lease over before it calls, walks away, and the crash-loop cap parks a
    job that crashed nobody. (PostgreSQL's claim is one statement, `_claim_in`, that writes
    the lease at its server's now + lease: the slipped sign is a lease of -lease there.)"""
    if store.backend == "postgres":
        wrap(store, "_claim_in", lambda original: lambda self, cur, pipeline, worker, now,
             lease, max_claims: original(self, cur, pipeline, worker, now, -lease, max_claims))
        return

    def make(original: Callable) -> Callable:
        def take(self: SQLiteStore, conn, job_id, state, step, claims, attempts, worker, now,
                 lease):
            return original(self, conn, job_id, state, step, claims, attempts, worker,
                            now - 2 * lease, lease)
        return take
    wrap(store, "_take_lease", make)


def completion_reports_lease_lost(store: type) -> None:
    """A completion that committed reports its lease lost: the worker drops the next step's
    lease it was handed and claims other work, so each job waits out a whole lease."""
    def make(original: Callable) -> Callable:
        def complete(self, claim: Claim, *args: Any, **kwargs: Any):
            original(self, claim, *args, **kwargs)
            raise LeaseLost(claim.job_id, "finishing the step (mutant)")
        return complete
    wrap(store, "complete", make)


# -- operator actions -------------------------------------------------------------------------

def operator_move_not_written(target: Any = SQLiteStore) -> None:
    """An operator action reports done without writing the job: the operator believes a
    parked job requeued (or a job cancelled) that never moved. `target`: the class, or one
    store (the harness's control calls, which run on threads of their own)."""
    wrap(target, "_operator_move", lambda original: lambda *a, **k: None)


#: Patches of code both backends run (the worker, the sender, the retry policy, the client).
PATCHES: dict[str, Callable[[], None]] = {f.__name__: f for f in (
    no_crash_loop_cap, memo_check_skipped, spend_unrecorded, poison_retried,
    retry_after_ignored, backoff_without_jitter, jitter_narrowed, no_call_deadline,
    operator_move_not_written, sender_without_key, mark_sent_before_send,
    dead_letter_at_first_failure, outbox_retry_at_once, client_fails_before_sending,
    heartbeat_inverted, group_stale_fails_all, heartbeat_one_slot, commit_not_durable,
    key_from_row_id)}

#: Patches of the store: each takes the store class it breaks, SQLite's or PostgreSQL's.
STORE_PATCHES: dict[str, Callable[[type], None]] = {f.__name__: f for f in (
    no_state_guard, fail_fenced_by_id, no_token_on_complete, heartbeat_ignores_rowcount,
    claim_steals_live_leases, memo_last_writer_wins, separate_transactions,
    outbox_after_commit, heartbeat_keeps_deadline, senders_without_claim,
    claim_lease_already_over, completion_reports_lease_lost, claims_newest_first,
    outbox_claim_lease_in_past)}

NAMES = frozenset(PATCHES) | frozenset(STORE_PATCHES)


def apply(name: str, backends: Iterable[str] = BACKENDS) -> None:
    """Break this process's engine as mutant `name` says: a store patch on the store class
    of each of `backends` (the backend of the process's database; both when it is not
    known). KeyError for an unknown name."""
    if name in STORE_PATCHES:
        for store in store_classes(backends):
            STORE_PATCHES[name](store)
    else:
        PATCHES[name]()
