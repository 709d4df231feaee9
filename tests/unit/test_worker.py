"""The worker loop in-process on a real SQLite file with a manual clock: a whole job in five
write transactions, memo hits that make no call, the retry policy (backoff bounds,
Retry-After, poison, attempt cap), verify's own verdict, spend records, and a lease lost
mid-step."""
from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from engine import Worker
from engine.retry import (Backoff, CallTimeout, ParseError, PoisonError, RetryableError,
                          SchemaError)
from engine.steps import CallResult, InstantSteps

DOC = {"doc_id": "d1", "title": "Invoice 7", "body": "pay  forty two\neuros"}
FETCHED = {"title": "Invoice 7 (memo)", "text": "from the memo", "chars": 13}


class ScriptedSteps(InstantSteps):
    """InstantSteps that count their calls and first answer from a script.

    script: step -> outcomes, used one per call: an exception (raised), a CallResult
    (returned), or a function called to get one (to act in the middle of a call). When a
    step's script is used up, the instant answer follows. Each call takes `duration` seconds
    of the clock.
    """

    def __init__(self, clock=None, duration: float = 0.0, **script) -> None:
        self.clock, self.duration = clock, duration
        self.script = {step: list(outcomes) for step, outcomes in script.items()}
        self.calls: Counter[str] = Counter()
        self.inputs: dict[str, object] = {}

    def call(self, step, data, ctx):
        self.calls[step] += 1
        self.inputs[step] = data
        if self.clock is not None:
            self.clock.advance(self.duration)
        if self.script.get(step):
            outcome = self.script[step].pop(0)
            outcome = outcome() if callable(outcome) else outcome
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome
        return super().call(step, data, ctx)


@pytest.fixture
def make_worker(store, config, clock, pipeline):
    """A worker on the test store whose job `job-1` is submitted; runner: the step runner."""
    store.submit("job-1", pipeline, DOC, clock.now())

    def make(runner=None, worker_id="w1"):
        return Worker(store, config, runner=runner, clock=clock, rng=random.Random(3),
                      worker_id=worker_id)

    return make


def spend_rows(store):
    return store.query("SELECT step, outcome, cost, worker, started, ended FROM spend ORDER BY id")


def test_a_job_is_delivered_in_five_write_transactions(store, make_worker, commits):
    worker = make_worker()
    del commits[:]  # the submit does not count
    assert worker.run_once() is True
    assert len(commits) == 5  # claim + one per step, each moving on under the same lease
    job = store.job("job-1")
    assert (job["state"], job["lease_token"], job["lease_until"]) == ("delivered", 1, 0)
    memos = store.query("SELECT step FROM step_result ORDER BY step")
    assert [m["step"] for m in memos] == ["deliver", "extract", "fetch", "verify"]
    assert [r["idempotency_key"] for r in store.query("SELECT * FROM outbox ORDER BY id")] == [
        "job-1:charge", "job-1:notify"]
    assert worker.run_once() is False


def test_a_memo_hit_advances_without_a_call(store, config, clock, pipeline, make_worker):
    store.claim(pipeline, "dead", clock.now(), config.lease, config.max_claims)
    with store.write() as conn:  # the dead worker committed fetch, then lost its lease
        conn.execute("INSERT INTO step_result (job_id, step, output, cost, at, worker,"
                     " lease_token) VALUES ('job-1', 'fetch', ?, 0.5, ?, 'dead', 1)",
                     (json.dumps(FETCHED), clock.now()))
    clock.advance(config.lease + 1)
    runner = ScriptedSteps()
    worker = make_worker(runner)
    assert worker.run_once() is True
    assert runner.calls["fetch"] == 0 and runner.calls["extract"] == 1
    assert runner.inputs["extract"] == FETCHED  # the memo is the next step's input
    assert worker.stats.memo_hits == 1
    assert store.job("job-1")["state"] == "delivered"
    assert store.memo("job-1", "fetch") == json.dumps(FETCHED)
    assert [s["step"] for s in spend_rows(store)] == ["extract", "verify"]


@pytest.mark.parametrize("exc", [RetryableError("503"), CallTimeout("slow"),
                                 ConnectionError("reset"), TimeoutError("read")],
                         ids=lambda e: type(e).__name__)
def test_a_retryable_error_reschedules_within_the_backoff(store, config, clock, make_worker, exc):
    runner = ScriptedSteps(fetch=[exc])
    assert make_worker(runner).run_once() is True
    job = store.job("job-1")
    assert (job["state"], job["attempts"], job["lease_until"]) == ("pending", 1, 0)
    assert 0 <= job["next_run_at"] - clock.now() <= Backoff(config.backoff_base).ceiling(1)
    assert type(exc).__name__ in job["last_error"]
    assert runner.calls["fetch"] == 1


def test_retry_after_is_honoured(store, clock, make_worker):
    runner = ScriptedSteps(fetch=[RetryableError("429", retry_after=7.0)])
    worker = make_worker(runner)
    worker.run_once()
    assert store.job("job-1")["next_run_at"] == pytest.approx(clock.now() + 7.0)
    clock.advance(6.9)
    assert worker.run_once() is False
    clock.advance(0.1)
    assert worker.run_once() is True and store.job("job-1")["state"] == "delivered"


def test_retryable_errors_back_off_then_park_after_max_attempts(store, config, clock,
                                                                make_worker):
    runner = ScriptedSteps(fetch=[RetryableError("502", cost=0.02)] * config.max_attempts)
    worker = make_worker(runner)
    backoff = Backoff(config.backoff_base, config.backoff_cap)
    for attempt in range(1, config.max_attempts):
        assert worker.run_once() is True
        job = store.job("job-1")
        assert (job["state"], job["attempts"]) == ("pending", attempt)
        assert 0 <= job["next_run_at"] - clock.now() <= backoff.ceiling(attempt)
        clock.t = job["next_run_at"]
    assert worker.run_once() is True
    job = store.job("job-1")
    assert (job["state"], job["attempts"], job["next_run_at"]) == (
        "failed_fetch", config.max_attempts, None)
    assert f"parked after {config.max_attempts} attempts" in job["last_error"]
    assert runner.calls["fetch"] == config.max_attempts
    assert worker.run_once() is False


@pytest.mark.parametrize("exc", [PoisonError("400 bad request"), SchemaError("no title"),
                                 ParseError("not JSON"), ValueError("a bug in the step")],
                         ids=lambda e: type(e).__name__)
def test_poison_parks_at_once_after_one_call(store, clock, make_worker, exc):
    runner = ScriptedSteps(fetch=[exc] * 3)
    worker = make_worker(runner)
    assert worker.run_once() is True
    job = store.job("job-1")
    assert (job["state"], job["attempts"], job["next_run_at"]) == ("failed_fetch", 1, None)
    assert "poison: parked at once" in job["last_error"] and str(exc) in job["last_error"]
    clock.advance(3600)
    assert worker.run_once() is False
    assert runner.calls["fetch"] == 1


def test_verify_not_ok_parks_in_needs_human_keeping_the_memo(store, make_worker):
    verdict = {"ok": False, "reason": "x"}
    runner = ScriptedSteps(verify=[CallResult(verdict, 0.002)])
    make_worker(runner).run_once()
    job = store.job("job-1")
    assert (job["state"], job["next_run_at"]) == ("needs_human", None)
    assert "x" in job["last_error"]
    assert json.loads(store.memo("job-1", "verify")) == verdict
    assert runner.calls["deliver"] == 0
    assert store.query("SELECT * FROM outbox") == []


def test_every_call_is_recorded_as_spend_with_its_cost(store, clock, make_worker):
    runner = ScriptedSteps(clock=clock, duration=0.25,
                           fetch=[RetryableError("503", cost=0.02), CallTimeout("slow")],
                           extract=[CallResult({"title": "t", "words": 1, "entities": [],
                                                "amount_cents": 5}, None)],
                           verify=[PoisonError("400")])
    worker = make_worker(runner)
    while worker.run_once():
        clock.advance(60)
    assert store.job("job-1")["state"] == "needs_human"  # verify's parked state
    assert [(s["step"], s["outcome"], s["cost"], s["worker"]) for s in spend_rows(store)] == [
        ("fetch", "retryable", 0.02, "w1"), ("fetch", "timeout", None, "w1"),
        ("fetch", "ok", InstantSteps.COST, "w1"), ("extract", "ok", None, "w1"),
        ("verify", "poison", None, "w1")]
    assert all(s["ended"] - s["started"] == pytest.approx(0.25) for s in spend_rows(store))
    committed = store.query("SELECT step, cost FROM step_result ORDER BY step")
    assert [(m["step"], m["cost"]) for m in committed] == [("extract", 0.0),
                                                           ("fetch", InstantSteps.COST)]


def test_a_lease_lost_mid_call_keeps_the_memo_but_not_the_transition(store, config, clock,
                                                                     pipeline, make_worker):
    fetched = {"title": "t", "text": "x", "chars": 1}

    def taken_over():
        clock.advance(config.lease + 1)  # a long call: another worker resumes the job
        store.claim(pipeline, "w2", clock.now(), config.lease, config.max_claims)
        return CallResult(fetched, 0.001)

    worker = make_worker(ScriptedSteps(fetch=[taken_over]))
    assert worker.run_once() is True
    assert worker.stats.leases_lost == 1
    job = store.job("job-1")
    assert (job["state"], job["lease_owner"], job["lease_token"]) == ("fetching", "w2", 2)
    assert json.loads(store.memo("job-1", "fetch")) == fetched
    assert [(s["outcome"], s["worker"]) for s in spend_rows(store)] == [("ok", "w1")]


class _IdleThread:
    """A heartbeat thread that never beats: only the worker's own renewals write the lease."""

    def __init__(self, **kwargs):
        pass

    def start(self):
        pass


@pytest.mark.parametrize("slowed, renewals", [(4.8, 1), (3.0, 0)])
def test_a_call_begun_with_less_than_a_beat_of_lease_left_renews_it_first(
        store, config, clock, pipeline, monkeypatch, slowed, renewals):
    """Claimed with a 5 s lease and slowed 4.8 s before its call (0.2 s left, less than the
    1 s heartbeat interval, before which the heartbeat's first beat need not come), the
    worker renews the lease itself before calling: the call runs under a whole lease. With
    2 s left it leaves the renewal to the heartbeat (no write of its own)."""
    import dataclasses
    beating = dataclasses.replace(config, heartbeat=True, heartbeat_interval=1.0)
    store.submit("job-1", pipeline, DOC, clock.now())
    leases_at_call = []
    read_input, renew = store.input_for, store.heartbeat
    beats = []

    def slow_input(claim, pipe):
        clock.advance(slowed)  # the claim-to-call path of a loaded machine
        return read_input(claim, pipe)

    def counted(*args, **kwargs):
        beats.append(clock.now())
        return renew(*args, **kwargs)

    def lease_at_call():
        leases_at_call.append(store.job("job-1")["lease_until"] - clock.now())
        return CallResult(FETCHED, 0.001)

    monkeypatch.setattr(store, "input_for", slow_input)
    monkeypatch.setattr(store, "heartbeat", counted)
    worker = Worker(store, beating, runner=ScriptedSteps(fetch=[lease_at_call]), clock=clock,
                    rng=random.Random(3), worker_id="w1", beat_thread=_IdleThread)
    claimed_at = clock.now()
    worker.work(store.claim(pipeline, "w1", claimed_at, beating.lease, beating.max_claims))
    assert beats == [claimed_at + slowed] * renewals  # one renewal, right before the call
    assert leases_at_call == [pytest.approx(beating.lease if renewals else 5.0 - slowed)]


def test_a_write_kept_out_by_the_lock_tries_until_its_lease_ends_and_never_loses_the_spend(
        store, clock, make_worker, monkeypatch):
    """The lock is held from the claim for a minute, past the lease (5 s) and past ten busy
    timeouts: the step's write gives up no sooner than the lease's end less the longest
    retry wait, and the spend record is written once the lock is free."""
    from engine.store import StoreBusy
    from engine.worker import RETRY_DELAY_CAP
    free_at = clock.now() + 60.0
    tries = {"complete": [], "record_spend": []}

    def locked(name, real):
        def attempt(*args, **kwargs):
            tries[name].append(clock.now())
            if clock.now() < free_at:
                raise StoreBusy("database is locked")
            return real(*args, **kwargs)
        return attempt

    for name in tries:
        monkeypatch.setattr(store, name, locked(name, getattr(store, name)))
    worker = make_worker()
    claimed_at = clock.now()
    with pytest.raises(StoreBusy):
        worker.run_once()
    lease_end = claimed_at + 5.0
    assert lease_end - RETRY_DELAY_CAP <= tries["complete"][-1] <= lease_end
    assert [(s["step"], s["outcome"]) for s in spend_rows(store)] == [("fetch", "ok")]
    assert tries["record_spend"][-1] >= free_at


def test_a_completion_whose_commit_cannot_be_known_waits_out_the_lease_and_goes_on(
        store, config, clock, pipeline, make_worker, monkeypatch):
    """The store could not tell whether the completion committed (ConnectionDropped at
    commit): the worker neither dies nor claims again while it may hold a lease; one lease
    later the job is claimed again where it stands and finished, by the same process."""
    from engine.store import ConnectionDropped
    real, claims = store.complete, []
    calls = iter([ConnectionDropped("database x: whether it committed is unknown", True)])

    def complete(*args, **kwargs):
        exc = next(calls, None)
        if exc is not None:
            raise exc
        return real(*args, **kwargs)

    claim = store.claim
    monkeypatch.setattr(store, "complete", complete)
    monkeypatch.setattr(store, "claim", lambda *a: claims.append(clock.now()) or claim(*a))
    worker = make_worker()
    dropped_at = clock.now()
    worker.run(max_jobs=2)
    assert claims[1] >= dropped_at + config.lease  # not before its lease ran out
    assert store.job("job-1")["state"] == "delivered" and worker.stats.claims == 2


def test_a_connection_dropped_past_the_window_before_commit_still_ends_the_worker(
        store, make_worker, monkeypatch):
    from engine.store import ConnectionDropped

    def dropped(*args, **kwargs):
        raise ConnectionDropped("database x: the connection dropped (nothing was committed)",
                                False)

    monkeypatch.setattr(store, "claim", dropped)
    with pytest.raises(ConnectionDropped):
        make_worker().run(max_jobs=1)


def test_the_heartbeat_rides_out_a_server_it_cannot_reach():
    """Its store cannot be opened, then a beat cannot reach the server: the thread beats
    again at its next tick instead of dying, and the lease is not reported lost."""
    from engine.hooks import ManualClock
    from engine.store import DatabaseError
    from engine.worker import Heartbeat

    class Done(Exception):
        pass

    class BeatStore:
        def __init__(self):
            self.outcomes = [DatabaseError("cannot connect"), True, True]
            self.beats = 0

        def heartbeat(self, *args):
            self.beats += 1
            outcome = self.outcomes.pop(0)
            if isinstance(outcome, Exception):
                raise outcome
            return outcome

    beat_store, opens = BeatStore(), []

    def open_beat_store():
        opens.append(1)
        if len(opens) == 1:
            raise DatabaseError("cannot connect to database postgresql://x: refused")
        return beat_store

    clock = ManualClock()
    ticks = iter(range(4))  # four beats, then the test ends the loop

    def sleep(seconds):
        if next(ticks, None) is None:
            raise Done
        clock.advance(seconds)

    clock.sleep = sleep
    tick = iter(range(0, 1000, 10))
    heartbeat = Heartbeat(open_beat_store, clock, 6.0, 2.0, "w1",
                          thread=lambda **_: type("Idle", (), {"start": lambda self: None})(),
                          monotonic=lambda: float(next(tick)))
    claim = type("C", (), {"job_id": "job-1", "lease_token": 1, "lease_until": 6.0})()
    with heartbeat.watching(claim) as watch:
        with pytest.raises(Done):
            heartbeat._run()  # on this thread: its ticks are the clock's sleeps
    assert len(opens) == 2 and beat_store.beats == 3 and not watch.lost.is_set()
