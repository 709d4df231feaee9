"""Operator actions and queries: cancel, requeue and resolve move only jobs they apply to, bump
the lease token so a stale worker is fenced, and change nothing when refused; the four
queries and the alerts return the expected rows on a small hand-built database."""
from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from engine import Worker
from engine.steps import CallResult, InstantSteps
from engine.store import LeaseLost, OperatorError, Spend

NOW = 1_000_000.0
LEASE = 5.0


class CountingSteps(InstantSteps):
    """InstantSteps that count their calls; `verdict` replaces verify's answer."""

    def __init__(self, verdict: dict | None = None) -> None:
        self.verdict = verdict
        self.calls: Counter[str] = Counter()

    def call(self, step, data, ctx):
        self.calls[step] += 1
        if step == "verify" and self.verdict is not None:
            return CallResult(self.verdict, 0.002)
        return super().call(step, data, ctx)


@pytest.fixture
def run(store, config, clock):
    """Work every due job with `runner` until none is due; returns the runner."""
    def work(runner=None):
        runner = runner or CountingSteps()
        worker = Worker(store, config, runner=runner, clock=clock, rng=random.Random(1))
        while worker.run_once():
            pass
        return runner
    return work


def claim(store, pipeline, now=NOW, max_claims=10):
    return store.claim(pipeline, "w1", now, LEASE, max_claims)


def job_in(store, pipeline, run, state: str) -> None:
    """Bring job-1 into `state` through the engine's own writes."""
    store.submit("job-1", pipeline, {"title": "t", "body": "b"}, NOW)
    if state == "fetching":
        claim(store, pipeline)
    elif state == "failed_fetch":
        store.fail(claim(store, pipeline), pipeline, "w1", NOW, error="400", retry_at=None)
    elif state == "needs_human":
        run(CountingSteps(verdict={"ok": False, "reason": "looks odd"}))
    elif state == "delivered":
        run()
    elif state == "cancelled":
        store.cancel("job-1", "op", NOW)
    assert store.job("job-1")["state"] == state


# -- cancel ----------------------------------------------------------------------------------

@pytest.mark.parametrize("state", ["pending", "failed_fetch", "needs_human"])
def test_cancel_from_a_ready_or_parked_state_bumps_the_token(store, pipeline, run, state):
    job_in(store, pipeline, run, state)
    token = store.job("job-1")["lease_token"]
    assert store.cancel("job-1", "op", NOW + 1) == state
    job = store.job("job-1")
    assert (job["state"], job["lease_token"], job["next_run_at"], job["updated_by"]) == (
        "cancelled", token + 1, None, "op")
    assert claim(store, pipeline, NOW + 3600) is None


def test_a_claim_taken_before_a_cancel_is_fenced_after_it(store, pipeline):
    store.submit("job-1", pipeline, {}, NOW)
    stale = claim(store, pipeline)
    store.fail(stale, pipeline, "w1", NOW, error="503", retry_at=NOW + 1)  # back to pending
    store.cancel("job-1", "op", NOW)
    before = store.job("job-1")
    assert store.heartbeat("job-1", stale.lease_token, NOW, LEASE) is False
    with pytest.raises(LeaseLost):
        store.complete(stale, pipeline, "w1", NOW, output="{}")
    with pytest.raises(LeaseLost):
        store.fail(stale, pipeline, "w1", NOW, error="x", retry_at=None)
    assert store.job("job-1") == before


@pytest.mark.parametrize("state", ["fetching", "delivered", "cancelled"])
def test_cancel_is_refused_for_working_and_terminal_jobs(store, pipeline, run, state):
    job_in(store, pipeline, run, state)
    before = store.job("job-1")
    with pytest.raises(OperatorError, match=f"'{state}'"):
        store.cancel("job-1", "op", NOW + 1)
    assert store.job("job-1") == before


def test_a_refused_cancel_leaves_the_lease_holder_working(store, pipeline):
    store.submit("job-1", pipeline, {}, NOW)
    live = claim(store, pipeline)
    with pytest.raises(OperatorError):
        store.cancel("job-1", "op", NOW)
    store.complete(live, pipeline, "w1", NOW, output="{}")
    assert store.job("job-1")["state"] == "fetched"


def test_actions_on_an_unknown_job_are_refused(store):
    for action in (store.cancel, store.requeue, store.resolve):
        with pytest.raises(OperatorError, match="no job 'ghost'"):
            action("ghost", "op", NOW)


# -- requeue ---------------------------------------------------------------------------------

def test_requeue_sends_a_parked_job_back_with_fresh_counters(store, pipeline, run):
    store.submit("job-1", pipeline, {"title": "t", "body": "b"}, NOW)
    store.fail(claim(store, pipeline), pipeline, "w1", NOW, error="503", retry_at=NOW)
    claim(store, pipeline, max_claims=1)                      # this worker dies
    assert claim(store, pipeline, NOW + LEASE + 1, max_claims=1) is None  # crash loop: parked
    job = store.job("job-1")
    assert (job["state"], job["attempts"], job["claims"]) == ("failed_fetch", 1, 1)
    token = job["lease_token"]
    assert store.requeue("job-1", "op", NOW) == "pending"
    job = store.job("job-1")
    assert (job["state"], job["attempts"], job["claims"], job["next_run_at"]) == (
        "pending", 0, 0, NOW)
    assert job["lease_token"] == token + 1
    run()
    assert store.job("job-1")["state"] == "delivered"


@pytest.mark.parametrize("state", ["pending", "fetching", "delivered", "cancelled"])
def test_requeue_of_a_job_that_is_not_parked_is_refused(store, pipeline, run, state):
    job_in(store, pipeline, run, state)
    before = store.job("job-1")
    with pytest.raises(OperatorError, match=f"'{state}', not parked"):
        store.requeue("job-1", "op", NOW)
    assert store.job("job-1") == before


# -- resolve ---------------------------------------------------------------------------------

def test_resolve_without_output_reruns_the_step(store, pipeline, run):
    job_in(store, pipeline, run, "needs_human")
    assert store.resolve("job-1", "op", NOW) == "extracted"
    assert store.memo("job-1", "verify") is None
    assert store.memo("job-1", "extract") is not None
    runner = run()
    assert runner.calls["verify"] == 1 and runner.calls["extract"] == 0
    assert store.job("job-1")["state"] == "delivered"


def test_resolve_with_output_records_it_and_skips_the_call(store, pipeline, run):
    job_in(store, pipeline, run, "needs_human")
    assert store.resolve("job-1", "op", NOW, output={"ok": True, "reason": "checked"}) == "extracted"
    memo = store.query("SELECT output, cost, worker FROM step_result WHERE step='verify'")[0]
    assert (json.loads(memo["output"]), memo["cost"], memo["worker"]) == (
        {"ok": True, "reason": "checked"}, 0, "op")
    runner = run()
    assert runner.calls["verify"] == 0
    assert store.job("job-1")["state"] == "delivered"


@pytest.mark.parametrize("state", ["pending", "fetching", "delivered"])
def test_resolve_of_a_job_that_is_not_parked_changes_nothing(store, pipeline, run, state):
    job_in(store, pipeline, run, state)
    before = (store.job("job-1"), store.query("SELECT * FROM step_result ORDER BY step"))
    with pytest.raises(OperatorError, match=f"'{state}'"):
        store.resolve("job-1", "op", NOW, output={"ok": True})
    assert (store.job("job-1"), store.query("SELECT * FROM step_result ORDER BY step")) == before


# -- queries ---------------------------------------------------------------------------------

DAY = 86400.0
POISON = "fetch: PoisonError: POST http://provider/v1 answered 400: bad request body"
#: id, state, created, updated, lease_until, last_error
JOBS = [
    ("a", "delivered", NOW - 500, NOW - 400, 0, None),
    ("b", "pending", NOW - 300, NOW - 100, 0, None),
    ("c", "fetching", NOW - 200, NOW - 60, NOW - 10, None),     # its worker died: stuck
    ("d", "extracting", NOW - 50, NOW - 20, NOW + 30, None),    # leased and alive
    ("e", "failed_fetch", NOW - 150, NOW - 90, 0, POISON),
    ("f", "failed_fetch", NOW - 140, NOW - 80, 0, POISON),
    ("g", "needs_human", NOW - 130, NOW - 70, 0, "verify: flagged for review: x"),
    ("h", "cancelled", NOW - 900, NOW - 800, 0, None),
]
#: job, step, cost, at
MEMOS = [("a", "fetch", 0.01, NOW - 450), ("a", "extract", 0.03, NOW - 440),
         ("d", "fetch", 0.01, NOW - 30), ("old", "fetch", 5.0, NOW - 2 * DAY)]
#: job, step, outcome, cost, started
SPEND = [("a", "fetch", "ok", 0.01, NOW - 450), ("a", "extract", "ok", 0.03, NOW - 440),
         ("d", "fetch", "retryable", 0.01, NOW - 40), ("d", "fetch", "ok", 0.01, NOW - 30),
         ("e", "fetch", "poison", 0.01, NOW - 95), ("f", "fetch", "timeout", None, NOW - 85),
         ("old", "fetch", "ok", 5.0, NOW - 2 * DAY)]


@pytest.fixture
def operated(store):
    """A hand-built database: jobs in every kind of state, memos, spend and a dead letter."""
    with store.write() as conn:
        for job_id, state, created, updated, lease_until, error in JOBS:
            conn.execute("INSERT INTO job (id, pipeline, state, payload, lease_until, last_error,"
                         " created, updated) VALUES (?, 'document', ?, '{}', ?, ?, ?, ?)",
                         (job_id, state, lease_until, error, created, updated))
        conn.executemany("INSERT INTO step_result (job_id, step, output, cost, at)"
                         " VALUES (?, ?, '{}', ?, ?)", MEMOS)
        conn.executemany("INSERT INTO outbox (job_id, kind, payload, idempotency_key, created,"
                         " attempts, dead_at, last_error) VALUES (?, ?, '{}', ?, ?, ?, ?, ?)",
                         [("a", "charge", "a:charge", NOW - 400, 8, NOW - 5, "503 x8"),
                          ("a", "notify", "a:notify", NOW - 400, 1, None, None)])
    for job_id, step, outcome, cost, started in SPEND:
        store.record_spend(Spend(job_id, step, "w1", 1, started, started + 1, outcome, cost))
    return store


def test_status_counts_jobs_per_state_with_their_age(operated):
    assert operated.status(NOW) == [
        {"state": "failed_fetch", "jobs": 2, "avg_age_s": 85.0},
        {"state": "cancelled", "jobs": 1, "avg_age_s": 800.0},
        {"state": "delivered", "jobs": 1, "avg_age_s": 400.0},
        {"state": "extracting", "jobs": 1, "avg_age_s": 20.0},
        {"state": "fetching", "jobs": 1, "avg_age_s": 60.0},
        {"state": "needs_human", "jobs": 1, "avg_age_s": 70.0},
        {"state": "pending", "jobs": 1, "avg_age_s": 100.0},
    ]


def test_stuck_lists_only_expired_leases(operated):
    assert [(r["id"], r["state"]) for r in operated.stuck(NOW)] == [("c", "fetching")]
    assert [r["id"] for r in operated.stuck(NOW + 31)] == ["c", "d"]


def test_failures_group_parked_jobs_by_cause(operated, pipeline):
    assert operated.failures(pipeline.parked_states) == [
        {"state": "failed_fetch", "error": POISON[:60], "jobs": 2},
        {"state": "needs_human", "error": "verify: flagged for review: x", "jobs": 1},
    ]


def test_costs_show_committed_billed_and_wasted_spend_per_step(operated):
    rows = {r["step"]: r for r in operated.costs(NOW)}
    assert list(rows) == ["extract", "fetch"]  # the most expensive step first
    assert rows["extract"] == {"step": "extract", "results": 1, "committed": 0.03, "mean": 0.03,
                               "calls": 1, "billed": 0.03, "wasted": 0.0}
    # fetch: 5 calls in the window billed 0.04 (one cost unknown); 2 results kept 0.02.
    assert rows["fetch"] == {"step": "fetch", "results": 2, "committed": 0.02, "mean": 0.01,
                             "calls": 5, "billed": 0.04, "wasted": 0.02}


def test_alerts_report_the_oldest_unfinished_job_parked_rows_and_dead_letters(operated,
                                                                              pipeline):
    alerts = operated.alerts(NOW, pipeline.terminal, pipeline.parked_states)
    assert alerts["oldest_unfinished"] == {"id": "b", "state": "pending", "age_s": 300.0}
    assert alerts["parked"] == [{"state": "failed_fetch", "jobs": 2},
                                {"state": "needs_human", "jobs": 1}]
    assert [(d["job_id"], d["kind"], d["attempts"]) for d in alerts["dead_letters"]] == [
        ("a", "charge", 8)]
    assert alerts["stuck"] == 1
