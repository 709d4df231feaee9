"""The worker loop: claim a job, run its steps, commit each in one transaction.

Kill the process at any line and the next worker does the right thing: before a commit the
step runs again (the memo check makes that the only cost), after it the memo is used.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import random
import secrets
import socket
import threading
import time
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from .config import EngineConfig
from . import hooks
from .hooks import Clock, SystemClock, crashpoint
from .retry import Backoff, CallTimeout, PoisonError, StepError, classify
from .states import Pipeline, get_pipeline
from .steps import StepContext, StepRunner, make_runner
from .store import (Claim, ConnectionDropped, DatabaseError, LeaseLost, Spend, Store,
                    StoreBusy, is_postgres_url, open_store)

log = logging.getLogger("ninelives.worker")


def new_worker_id(role: str = "worker") -> str:
    """A worker id unique per boot: host, pid and a random nonce (pids are reused)."""
    return f"{role}:{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


def store_options(config: EngineConfig, target: str) -> dict[str, Any]:
    """What `open_store(target, ...)` takes from the settings; the reconnect window only
    where there is a server to reconnect to."""
    options: dict[str, Any] = {"synchronous": config.synchronous,
                               "busy_timeout": config.busy_timeout}
    if is_postgres_url(target):
        options["reconnect_window"] = config.reconnect_window
    return options


def unknown_write(exc: ConnectionDropped, lease: float, clock: Clock, who: str) -> None:
    """Ride out a write whose commit the store could not resolve (see the store's
    `_write`): it may have committed, and so this process may hold a lease (a claim, or a
    job kept for its next step) that it does not know of. Walking away at once would leave
    that lease to lapse under a live holder, and claiming again would hold two; so wait
    until any lease it could hold has run out (one lease from now: every lease it writes
    runs from its write, which was before now). The next owner then resumes from what
    committed, as after a crash; every later write of this process is fenced."""
    log.warning("%s: %s; waiting out the %s s lease before going on", who, exc, lease)
    clock.sleep(lease)


#: The longest wait between two tries of a store write; a write gives up at most this long
#: before its deadline (the adapter declares it as finish_retry_slack).
RETRY_DELAY_CAP = 0.5


def retry_store(call: Callable[[], Any], clock: Clock,
                deadline: float | Callable[[], float]) -> Any:
    """Run a store write, retrying while the database is busy and the lease still holds.

    Giving up early would throw away a paid-for result; past the deadline the lease is gone,
    and the next owner may have the step already. `deadline`: clock time, or a function
    read at each try (a lease that a heartbeat may still renew).
    """
    ends = deadline if callable(deadline) else (lambda: deadline)
    delay = 0.01
    while True:
        try:
            return call()
        except StoreBusy:
            if clock.now() + delay >= ends():
                raise
            clock.sleep(delay)
            delay = min(delay * 2, RETRY_DELAY_CAP)


@dataclass
class Watch:
    """A step's lease while the heartbeat watches it.

    until: the clock time the lease holds until as far as this process knows, its claim's
    end moved on by every renewal that matched the row; lost: set when a renewal matched no
    row (the lease was taken)."""

    until: float
    lost: threading.Event = field(default_factory=threading.Event)


class Heartbeat:
    """Extends the lease of the step being worked, from one long-lived thread with its own
    connection.

    The thread ticks every half interval and beats for a step watched at least that long,
    so starting and ending a step costs only an uncontended lock (a thread or a wake-up per
    step would cost more than the step's commit). `watching(claim)` yields the step's
    `Watch`: how long its lease now holds, and an Event that is set when an extension
    matches no row (the lease was taken, and the worker must not make the state transition).

    `thread` builds the thread and `monotonic` measures intervals: the standard library's by
    default; a simulation passes its own, so that this very code runs on its virtual clock.

    With job slots one heartbeat serves every slot of the process: it watches each slot's
    claim, and beats for all that are due in one transaction where the store can batch
    writes, each under its own token and writing under its own slot's worker id.
    """

    def __init__(self, open_store_: Callable[[], Store], clock: Clock, lease: float,
                 every: float, worker_id: str, *,
                 thread: Callable[..., Any] = threading.Thread,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._open_store, self.clock, self.lease, self.every = open_store_, clock, lease, every
        self.worker_id = worker_id
        self._new_thread, self._monotonic = thread, monotonic
        self._lock = threading.Lock()
        #: what is watched, by a key of its own: (claim, its watch, since, writer's id)
        self._watched: dict[object, tuple[Claim, Watch, float, str]] = {}
        self._thread: Any = None

    @contextmanager
    def watching(self, claim: Claim, worker_id: str | None = None) -> Iterator[Watch]:
        """Beat for `claim` (held by `worker_id`, default the heartbeat's own) while inside;
        yields its Watch."""
        watch, key = Watch(claim.lease_until), object()
        with self._lock:
            if self._thread is None:
                self._thread = self._new_thread(target=self._run, name="heartbeat",
                                                daemon=True)
                self._thread.start()
            self._watched[key] = (claim, watch, self._monotonic(), worker_id or self.worker_id)
        try:
            yield watch
        finally:
            with self._lock:
                self._watched.pop(key, None)

    def _run(self) -> None:
        store = None
        half = self.every / 2
        while True:
            self.clock.sleep(half)
            now = self._monotonic()
            with self._lock:
                due = [(k, w) for k, w in self._watched.items() if now - w[2] >= half]
            if not due:
                continue
            try:
                store = store or self._open_store()  # opened here: a server down at start
                self._beat(store, due)
            except StoreBusy:
                continue  # the leases still run; try again next tick
            except DatabaseError as exc:
                # The server is out of reach (down, restarting) past the store's reconnect
                # window: beat again next tick. If a lease ran out meanwhile and another
                # worker took the job, its token fences every write this worker makes.
                log.warning("heartbeat of job(s) %s: %s",
                            ", ".join(w[0].job_id for _, w in due), exc)

    def _renew(self, store: Store, claim: Claim, who: str | None) -> float | None:
        """Extend one lease, from the time read after its point (see `_beat`). Returns the
        time the lease now holds until at least (the store runs it from its write, after
        that read), or None when the lease was taken."""
        now = self.clock.now()
        return now + self.lease if store.heartbeat(claim.job_id, claim.lease_token, now,
                                                   self.lease, who) else None

    def _beat(self, store: Store, due: list) -> None:
        # Every lease's point is passed before the batch opens, never inside it: a process
        # held or paused at a point (an aimed hold) must not stand there with the batch's
        # write lock taken. And each renewal runs from a time read after its point: one read
        # before a pause would leave the lease ending in the past.
        for _, (claim, _, _, _) in due:
            hooks.set_current_job(claim.job_id)
            crashpoint("worker.heartbeat")
        batch = getattr(store, "batch", None)
        with batch() if batch is not None and len(due) > 1 else nullcontext():
            kept = [self._renew(store, claim, who) for _, (claim, _, _, who) in due]
        # Only now, the batch committed: a renewal rolled back with its batch renewed nothing.
        for (key, (claim, watch, _, _)), until in zip(due, kept):
            if until is not None:
                # The slot's finishing write retries until this: a slot that knew only its
                # claim's end gave a paid-for answer up while its renewed lease still held.
                watch.until = max(watch.until, until)
                continue
            log.warning("lost the lease on job %s", claim.job_id)
            watch.lost.set()
            with self._lock:
                self._watched.pop(key, None)


@dataclass
class WorkerStats:
    """What a worker did; the slots of one process share one (increments from threads)."""

    claims: int = 0
    steps: int = 0
    memo_hits: int = 0
    failures: int = 0
    leases_lost: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, name: str) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + 1)


class Worker:
    """Runs jobs of one pipeline from one database.

    store: the worker's store; runner: the step implementations; clock and rng are the
    injected time and random sources; beat_store opens the heartbeat's own connection, and
    beat_thread and monotonic are the heartbeat's thread and interval clock (see Heartbeat).
    One Worker is one job slot: `engine.slots.Slots` runs several in one process, passing
    the GroupCommit their finishing writes go through and the stats they share.
    """

    def __init__(self, store: Store, config: EngineConfig, *,
                 pipeline: Pipeline | None = None, runner: StepRunner | None = None,
                 clock: Clock | None = None, rng: random.Random | None = None,
                 worker_id: str | None = None,
                 beat_store: Callable[[], Store] | None = None,
                 beat_thread: Callable[..., Any] = threading.Thread,
                 monotonic: Callable[[], float] = time.monotonic,
                 group: Any = None, stats: WorkerStats | None = None) -> None:
        self.store, self.config, self.group = store, config, group
        self.pipeline = pipeline or get_pipeline(config.pipeline)
        self.runner = runner or make_runner(config)
        self.clock = clock or SystemClock()
        self.rng = rng or random.Random(None if config.seed < 0 else config.seed)
        self.id = worker_id or new_worker_id()
        self.backoff = Backoff(config.backoff_base, config.backoff_cap)
        self.heartbeat = Heartbeat(beat_store or self._open_beat_store, self.clock,
                                   config.lease, config.beat_every, self.id,
                                   thread=beat_thread, monotonic=monotonic,
                                   ) if config.heartbeat else None
        self.stats = stats or WorkerStats()

    # -- the loop ------------------------------------------------------------------------

    def run(self, stop: threading.Event | None = None, *, max_jobs: int | None = None,
            exit_when_idle: bool = False) -> WorkerStats:
        """Work until `stop` is set, `max_jobs` jobs were claimed, or (exit_when_idle) no job
        of the pipeline waits for a worker any more."""
        stop = stop or threading.Event()
        self._stop, self._max_jobs = stop, max_jobs
        while not stop.is_set() and (max_jobs is None or self.stats.claims < max_jobs):
            try:
                worked = self.run_once()
            except StoreBusy:
                worked = False
            except ConnectionDropped as exc:
                if not exc.at_commit:
                    raise  # it reconnected, and lost the connection again, past the window
                unknown_write(exc, self.config.lease, self.clock, self.id)
                worked = False
            if worked:
                continue
            if exit_when_idle and self.store.active_jobs(self.pipeline.name) == 0:
                break
            # Jitter keeps idle workers from polling in lockstep.
            self.clock.sleep(self.config.poll_interval * (0.5 + self.rng.random()))
        return self.stats

    def run_once(self) -> bool:
        """Claim one due job and work it through as many steps as the lease allows.

        Returns False when nothing was due.
        """
        claim = self.store.claim(self.pipeline, self.id, self.clock.now(), self.config.lease,
                                 self.config.max_claims)
        if claim is None:
            return False
        self._claimed(claim.job_id)
        while claim is not None:
            nxt = self.work(claim)
            if nxt is not None and nxt.job_id != claim.job_id:
                self._claimed(nxt.job_id)  # taken by the previous job's completion
            claim = nxt
        return True

    def _claimed(self, job_id: str) -> None:
        self.stats.add("claims")
        hooks.set_current_job(job_id)  # the point's job is the one just claimed
        crashpoint("worker.after_claim")

    def _wants_more(self) -> bool:
        """Whether to take the next job in the transaction that finishes this one."""
        stop, limit = getattr(self, "_stop", None), getattr(self, "_max_jobs", None)
        return not (stop is not None and stop.is_set()) and (
            limit is None or self.stats.claims < limit)

    def work(self, claim: Claim) -> Claim | None:
        """Run the claimed step; return the next step's claim when the job is kept."""
        hooks.set_current_job(claim.job_id)
        ctx = StepContext(claim.job_id, claim.step.name, self.id, claim.attempts + 1,
                          lambda step: json.loads(claim.memos[step]))
        try:
            if claim.memo is not None:
                return self._finish_from_memo(claim, ctx)
            return self._run_step(claim, ctx)
        except LeaseLost as exc:
            self.stats.add("leases_lost")
            log.info("%s", exc)
            return None

    def _finish_from_memo(self, claim: Claim, ctx: StepContext) -> Claim | None:
        # Already done before a crash: advance at once, releasing or passing on the lease.
        self.stats.add("memo_hits")
        try:
            conclusion = self.runner.conclude(claim.step.name, json.loads(claim.memo), ctx)
        except Exception as exc:  # a memo the step cannot use is poison, not a crash loop
            self._fail(claim, PoisonError(f"memo of step {claim.step.name!r} is unusable: "
                                          f"{type(exc).__name__}: {exc}"), self.clock.now(),
                       billed=False)
            return None
        crashpoint("worker.memo_hit.before_commit")
        return self._complete(claim, None, 0.0, conclusion, None)

    def _run_step(self, claim: Claim, ctx: StepContext) -> Claim | None:
        # A worker fenced out of this job may have committed the step since our claim read
        # the memos (first writer wins): look again right before paying for the call.
        fresh = self.store.memo(claim.job_id, claim.step.name)
        if fresh is not None:
            claim = dataclasses.replace(claim, memos={**claim.memos, claim.step.name: fresh})
            return self._finish_from_memo(claim, ctx)
        data = self.store.input_for(claim, self.pipeline)
        crashpoint("worker.before_call")
        started = self.clock.now()
        if started >= claim.lease_until:
            # Paused (or slow) past the lease before paying: another worker may own the step
            # by now. Do not call; the next owner will.
            raise LeaseLost(claim.job_id, f"about to call for step {claim.step.name!r}")
        if self.heartbeat is not None and self.runner.makes_call(claim.step.name) and \
                claim.lease_until - started < self.heartbeat.every:
            claim = self._renew_before_call(claim)
        watch = None
        try:
            with self._heartbeat(claim) as watch:
                result = self.runner.call(claim.step.name, data, ctx)
        except Exception as exc:  # the retry policy decides; a bug in a step is poison
            crashpoint("worker.after_call")
            self._fail(claim, exc, started, watch=watch)
            return None
        crashpoint("worker.after_call")
        spend = self._spend(claim, started, "ok", result.cost) if self.runner.makes_call(
            claim.step.name) else None
        conclusion = self.runner.conclude(claim.step.name, result.output, ctx)
        self.stats.add("steps")
        return self._complete(claim, json.dumps(result.output, sort_keys=True),
                              result.cost or 0.0, conclusion, spend, watch)

    def _renew_before_call(self, claim: Claim) -> Claim:
        """Renew a lease that would run out before the heartbeat's first beat for the call
        (it beats for a call watched half an interval, at its next tick): a worker slowed
        between its claim and its call (a loaded machine) would otherwise call with a lease
        that runs out under it. Raises LeaseLost when the lease was taken; a busy store
        leaves the renewal to the heartbeat."""
        crashpoint("worker.heartbeat")
        now = self.clock.now()  # after the point, as the heartbeat's own (Heartbeat._beat)
        try:
            kept = self.store.heartbeat(claim.job_id, claim.lease_token, now,
                                        self.config.lease, self.id)
        except StoreBusy:
            return claim
        if not kept:
            raise LeaseLost(claim.job_id, f"renewing the lease to call for step "
                                          f"{claim.step.name!r}")
        return dataclasses.replace(claim, lease_until=now + self.config.lease)

    def _complete(self, claim: Claim, output: str | None, cost: float, conclusion,
                  spend: Spend | None, watch: Watch | None = None) -> Claim | None:
        keep = self.config.lease if self.config.keep_job else None
        claim_next = (self.config.lease, self.config.max_claims) if (
            self.config.keep_job and self._wants_more()) else None
        nxt = self._write(lambda store: store.complete(
            claim, self.pipeline, self.id, self.clock.now(), output=output, cost=cost,
            effects=conclusion.effects, spend=spend, park_reason=conclusion.park_reason,
            continue_lease=keep, claim_next=claim_next), claim, spend, watch)
        crashpoint("worker.after_commit")
        return nxt

    def _write(self, write: Callable[[Store], Any], claim: Claim, spend: Spend | None,
               watch: Watch | None = None) -> Any:
        """A finishing write, retried while the lease holds: in the slots' group commit if
        there is one, else on this slot's own connection. If the database stays locked past
        that, the step is lost to the next owner, but its spend is still recorded.

        The lease holds until its claim's end, or later as the heartbeat renewed it while
        the step's call ran (`watch`), read at each try: the call may outlive the claim's
        lease (that is what the beats are for), and a renewal still waiting for the lock
        when the call returned counts once it is written. Judged by the claim alone, a
        slot gave up a paid-for answer at the first busy lock while its lease still held."""
        ends = (lambda: claim.lease_until) if watch is None else (lambda: watch.until)
        try:
            if self.group is not None:
                return self.group.commit(self.store, write, ends)
            return retry_store(lambda: write(self.store), self.clock, ends)
        except StoreBusy:
            if spend is not None:
                # No deadline: the money is spent, and its record fences nothing (a worker
                # that cannot write it could write nothing else either).
                retry_store(lambda: self.store.record_spend(spend), self.clock, math.inf)
            raise

    def _fail(self, claim: Claim, exc: Exception, started: float, billed: bool = True,
              watch: Watch | None = None) -> None:
        self.stats.add("failures")
        retryable = classify(exc)
        attempt = claim.attempts + 1
        now = self.clock.now()
        retry_at = None
        if retryable and attempt < self.config.max_attempts:
            retry_at = now + self.backoff.delay(attempt, self.rng, getattr(exc, "retry_after", None))
        outcome = "timeout" if isinstance(exc, (CallTimeout, TimeoutError)) else (
            "retryable" if retryable else "poison")
        error = f"{claim.step.name}: {type(exc).__name__}: {exc}"
        if retry_at is None:  # the text says why, for the operator who reads it
            error += (f" (parked after {attempt} attempt{'s' if attempt > 1 else ''})"
                      if retryable else " (poison: parked at once, not worth retrying)")
        spend = None
        if billed and self.runner.makes_call(claim.step.name):
            spend = self._spend(claim, started, outcome, getattr(exc, "cost", None)
                                if isinstance(exc, StepError) else None, error)
        self._write(lambda store: store.fail(claim, self.pipeline, self.id, now, error=error,
                                             retry_at=retry_at, spend=spend), claim, spend,
                    watch)

    def _spend(self, claim: Claim, started: float, outcome: str, cost: float | None,
               error: str | None = None) -> Spend:
        return Spend(claim.job_id, claim.step.name, self.id, claim.lease_token, started,
                     self.clock.now(), outcome, cost, error)

    def _open_beat_store(self) -> Store:
        return open_store(self.store.target, **store_options(self.config, self.store.target))

    def _heartbeat(self, claim: Claim) -> AbstractContextManager:
        if self.heartbeat is None or not self.runner.makes_call(claim.step.name):
            return nullcontext()
        return self.heartbeat.watching(claim, self.id)
