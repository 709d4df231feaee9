"""The liveness checkers on hand-made histories: all-jobs-settle (nothing left working or
pending after the drain), retry-discipline (poison parks at once, the attempt cap, Retry-After,
full-jitter backoff, spread retries after an outage) and bounded-work (claims of a step in a
row within max_claims; crash-looping jobs end parked)."""
from __future__ import annotations

import random

import pytest
from chaos.reference import backoff_bounds
from builders import (OP, W1, W2, call, delivered_job, delivered_with_effects, job, nemesis,
                      process, snapshot_with_effects, spend)

from chaos.checkers.liveness import check_all_jobs_settle, check_bounded_work
from chaos.checkers.retries import check_retry_discipline
from chaos.checkers.waits import spread_test

J = "doc-1"


# -- small story builders for the fetch step -----------------------------------------------

def claim(t, worker, token, job_id=J, frm="pending"):
    """A claim of the fetch step (frm "fetching" is a resume after an expired lease)."""
    return job(t, job_id, frm, "fetching", worker, token, old_token=token - 1, claims=1,
               lease_until=t + 2)


def retry(t, worker, token, attempts, wait, job_id=J):
    return job(t, job_id, "fetching", "pending", worker, token, attempts=attempts,
               next_run_at=t + wait, last_error="fetch: RetryableError")


def park(t, worker, token, attempts=1, job_id=J, error="fetch: PoisonError (parked)"):
    return job(t, job_id, "fetching", "failed_fetch", worker, token, attempts=attempts,
               last_error=error)


def fetch_call(t, worker, job_id=J, **kw):
    return call(t, t + 0.01, job_id, "fetch", worker, **kw)


def failed_try(t, worker, token, attempts, wait, job_id=J, frm="pending", **call_kw):
    """Claim, a failing provider call (503 unless told), and the retry write."""
    call_kw = {"status": 503, "outcome": "error", **call_kw}
    return [claim(t, worker, token, job_id, frm), fetch_call(t + 0.01, worker, job_id, **call_kw),
            retry(t + 0.03, worker, token, attempts, wait, job_id)]


def crashed_try(t, worker, token, job_id=J, frm="pending", **call_kw):
    """Claim, a call and a heartbeat, then the worker is SIGKILLed before its write."""
    beat = job(t + 0.012, job_id, "fetching", "fetching", worker, token, lease_until=t + 3)
    return [claim(t, worker, token, job_id, frm), fetch_call(t + 0.01, worker, job_id, **call_kw),
            beat, process(t + 0.015, "exit", "worker-x", int(worker.split(":")[2]),
                          signal="SIGKILL")]


def settings(backoff_base=None, **overrides):
    """The builders' settings; `backoff_base` rewrites the declared full-jitter bounds."""
    base = snapshot_with_effects([])["settings"]
    if backoff_base is not None:
        overrides["backoff_bounds"] = [list(b) for b in backoff_bounds(backoff_base, 2.0, 4)]
    return {**base, **overrides}


def retry_check(history, **overrides):
    return check_retry_discipline(history, snapshot_with_effects(history, **overrides))


def bounded(history, **overrides):
    return check_bounded_work(history, snapshot_with_effects(history, **overrides))


def settle(history, **overrides):
    return check_all_jobs_settle(history, snapshot_with_effects(history, **overrides))


def test_clean_delivered_jobs_pass_every_liveness_check():
    history = delivered_with_effects(J) + delivered_with_effects("doc-2", t0=3.0, worker=W2)
    for check in (retry_check, bounded, settle):
        verdict = check(history)
        assert verdict.status == "pass", verdict.reason
        assert verdict.checked > 0
    assert bounded(history).metrics["max_claims_per_step"] == {
        "deliver": 1, "extract": 1, "fetch": 1, "verify": 1}
    assert settle(history).metrics["settle_time"] == 9.0


# -- all-jobs-settle -----------------------------------------------------------------------

def stuck_in_extracting():
    events = delivered_job(J)
    cut = next(i for i, e in enumerate(events) if e.get("to") == "extracting")
    return events[:cut + 1]


def test_a_job_left_working_after_the_drain_is_not_settled():
    history = stuck_in_extracting() + delivered_with_effects("doc-2", t0=3.0)
    verdict = settle(history)
    assert verdict.by_type == {"job-not-settled": 1}
    assert verdict.failures[0].events == [stuck_in_extracting()[-1]]
    assert "still 'extracting'" in verdict.failures[0].message


def test_a_parked_job_is_settled():
    history = failed_try(1.0, W1, 1, 1, 0.05) + [claim(2.0, W1, 2), park(2.1, W1, 2, attempts=2)]
    assert settle(history).status == "pass"


def test_an_unsent_outbox_row_is_pending():
    history = delivered_job(J)
    verdict = settle(history)
    assert verdict.by_type == {"outbox-pending": 2}
    inserts = [e for e in history if e["type"] == "effect_queued"]
    assert [f.events for f in verdict.failures] == [[inserts[0]], [inserts[1]]]


def test_a_scenario_that_does_not_expect_settling_reports_metrics_only():
    history = stuck_in_extracting()
    snap = snapshot_with_effects(history)
    snap["plan"]["expect"]["settle"] = False
    verdict = check_all_jobs_settle(history, snap)
    assert verdict.status == "pass"
    assert verdict.metrics["unsettled"] == 1 and verdict.metrics["states"] == {"extracting": 1}


def test_no_jobs_in_the_snapshot_after_submissions_is_unknown():
    history = delivered_job(J)
    snap = snapshot_with_effects(history, jobs={})
    assert check_all_jobs_settle(history, snap).status == "unknown"


# -- retry-discipline: poison --------------------------------------------------------------

def test_poison_called_once_then_parked_passes():
    history = [claim(1.0, W1, 1), fetch_call(1.01, W1, status=400, outcome="error"),
               park(1.03, W1, 1)]
    assert retry_check(history).status == "pass"


def test_poison_retried_like_a_timeout_is_caught():
    first = failed_try(1.0, W1, 1, 1, 0.05, status=400)
    again = [claim(2.0, W2, 2), fetch_call(2.01, W2, status=400, outcome="error")]
    verdict = retry_check(first + again)
    assert verdict.by_type == {"poison-retried": 1}
    assert verdict.failures[0].events == [first[1], first[2], again[1]]


def test_poison_retried_is_caught_when_the_retry_write_sorts_before_the_poison_call():
    first = failed_try(1.0, W1, 1, 1, 0.05, status=400)
    first[2]["t"] = first[1]["t_start"] - 0.0004
    again = [claim(2.0, W2, 2), fetch_call(2.01, W2, status=400, outcome="error")]
    verdict = retry_check(sorted(first + again, key=lambda e: e["t"]))
    assert verdict.by_type == {"poison-retried": 1}


def test_a_second_poison_call_after_the_first_worker_was_killed_is_allowed():
    history = crashed_try(1.0, W1, 1, outcome="garbage") + [
        claim(4.0, W2, 2, frm="fetching"), fetch_call(4.01, W2, outcome="garbage"),
        park(4.03, W2, 2)]
    assert retry_check(history).status == "pass"


def test_a_poison_answer_to_a_killed_slot_worker_is_not_a_retry_by_its_successor():
    # A worker id that names a slot: process 101 got the poison and was killed; the write
    # under the same id after that (a recovery putting the job back) is its successor's,
    # so the engine never knew of the poison, and W2's call is not a retry of it.
    slot = {"worker": "worker-0", "pid": None}  # the engine's rows name no process
    history = [{**claim(1.0, W1, 1), **slot},
               {**fetch_call(1.01, W1, status=400, outcome="error"), **slot, "pid": 101},
               process(1.1, "exit", "worker-0.0", 101, signal="SIGKILL"),
               {**retry(1.5, W1, 1, 1, 0.05), **slot}, claim(2.0, W2, 2),
               fetch_call(2.01, W2, status=400, outcome="error"), park(2.03, W2, 2)]
    assert "poison-retried" not in retry_check(history).by_type
    alive = [e for e in history if e["type"] != "exit"]  # the caller lived: it retried
    assert "poison-retried" in retry_check(alive).by_type


def in_memory_retries(first_seconds=0.01, completion="fail", status=400):
    """One claim, two calls answered `status` with no write between, then a park."""
    first = fetch_call(1.01, W1, status=status, outcome="error")
    first["t_end"], first["completion"] = 1.01 + first_seconds, completion
    again = fetch_call(first["t_end"] + 0.1, W1, status=status, outcome="error")
    return [claim(1.0, W1, 1), first, again, park(again["t_end"] + 0.01, W1, 1, attempts=2)]


def test_poison_retried_in_memory_under_one_claim_is_caught():
    history = in_memory_retries()
    verdict = retry_check(history)
    assert verdict.by_type == {"poison-retried": 1}
    assert verdict.failures[0].events == [history[0], history[1], history[2]]
    assert "writing nothing between" in verdict.failures[0].message


@pytest.mark.parametrize("kw", [{"completion": "info"}, {"first_seconds": 1.5},
                                {"status": 503}],
                         ids=["the-caller-was-gone", "answered-after-the-call-timeout",
                              "retryable"])
def test_a_call_again_under_one_claim_is_not_poison_retried_unless_the_poison_was_received(kw):
    verdict = retry_check(in_memory_retries(**kw))
    assert "poison-retried" not in verdict.by_type


@pytest.mark.parametrize("operator, status", [(False, "fail"), (True, "pass")],
                         ids=["claimed-while-parked", "after-an-operator-requeue"])
def test_no_call_after_a_poison_park_unless_an_operator_requeued(operator, status):
    history = [claim(1.0, W1, 1), fetch_call(1.01, W1, outcome="schema"), park(1.03, W1, 1)]
    if operator:
        history.append(job(2.0, J, "failed_fetch", "pending", OP, 2, old_token=1))
    later = [claim(3.0, W2, 3, frm="pending" if operator else "failed_fetch"),
             fetch_call(3.01, W2)]
    verdict = retry_check(history + later)
    assert verdict.status == status
    if not operator:
        assert verdict.by_type == {"call-after-poison-parked": 1}
        assert verdict.failures[0].events == [history[1], history[2], later[1]]


# -- retry-discipline: the attempt cap -----------------------------------------------------

def test_an_attempt_count_past_max_attempts_is_caught():
    history = []
    for a in range(1, 6):
        history += failed_try(float(a), W1, a, a, 0.05)
    verdict = retry_check(history)
    assert verdict.by_type["attempts-over-cap"] == 1
    over = next(f for f in verdict.failures if f.type == "attempts-over-cap")
    assert over.events == [history[-1]] and over.events[0]["attempts"] == 5


def test_more_calls_than_the_cap_allows_are_caught():
    history = failed_try(1.0, W1, 1, 1, 0.05) + failed_try(2.0, W1, 2, 2, 0.05)
    third = [claim(3.0, W1, 3)] + [fetch_call(3.01 + i / 100, W1, status=503, outcome="error")
                                   for i in range(3)]
    verdict = retry_check(history + third + [retry(3.1, W1, 3, 3, 0.05)])
    assert verdict.by_type == {"calls-over-cap": 1}
    assert verdict.failures[0].events == [history[1], third[3]]


def test_crashed_claims_allow_extra_calls():
    history = (failed_try(1.0, W1, 1, 1, 0.05) + crashed_try(2.0, W2, 2)
               + failed_try(5.0, W1, 3, 2, 0.05, frm="fetching") + failed_try(6.0, W1, 4, 3, 0.05)
               + crashed_try(7.0, W2, 5)
               + [claim(10.0, W1, 6, frm="fetching"), fetch_call(10.01, W1, status=503,
                                                                  outcome="error"),
                  park(10.03, W1, 6, attempts=4,
                       error="fetch: RetryableError: 503 (parked after 4 attempts)")])
    verdict = retry_check(history)
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["max_calls_per_step"] == 6


@pytest.mark.parametrize("status, error, kind", [
    (503, "fetch: PoisonError: 503 (poison: parked at once, not worth retrying)",
     "retryable-parked-as-poison"),
    (503, "fetch: RetryableError: 503 (parked after 2 attempts)", "parked-before-cap"),
], ids=["a-5xx-parked-as-poison", "attempts-short-of-the-cap"])
def test_a_job_parked_against_the_engines_own_rules_fails(status, error, kind):
    history = failed_try(1.0, W1, 1, 1, 0.05) + [
        claim(2.0, W1, 2, frm="pending"), fetch_call(2.01, W1, status=status, outcome="error"),
        park(2.03, W1, 2, attempts=2 if "attempts" in error else 1, error=error)]
    verdict = retry_check(history)
    assert kind in verdict.by_type, verdict.reason


@pytest.mark.parametrize("answer", [None, {"status": 200, "outcome": "ok"}],
                         ids=["no-call-reached-the-provider", "the-provider-answered-200"])
def test_a_poison_park_the_provider_never_refused_fails(answer):
    # A call that fails in the client (a bug before the request is sent) is not poison.
    story = [claim(1.0, W1, 1)] + ([fetch_call(1.01, W1, **answer)] if answer else []) + [
        park(1.03, W1, 1, error="fetch: TypeError: unsupported operand (poison: parked at once)")]
    verdict = retry_check(story, ledgers=["provider", "receiver"])
    assert verdict.by_type == {"parked-without-refusal": 1}, verdict.reason
    assert verdict.failures[0].events[0] is story[-1]


def test_with_no_provider_ledger_kept_a_park_without_calls_is_unknown():
    story = [claim(1.0, W1, 1), park(1.03, W1, 1)]
    verdict = retry_check(story, plan={**snapshot_with_effects(story)["plan"],
                                       "poison": {J: "status400"}})
    assert verdict.status == "unknown" and "ledger missing" in verdict.reason


def test_a_park_for_attempts_with_fewer_calls_than_the_cap_fails():
    # The engine's own counter says 4 (the cap), but the provider saw 2 calls of the step.
    history = failed_try(1.0, W1, 1, 1, 0.05) + [
        claim(2.0, W1, 2, frm="pending"), fetch_call(2.01, W1, status=503, outcome="error"),
        park(2.03, W1, 2, attempts=4, error="fetch: RetryableError: 503 (parked after 4 attempts)")]
    verdict = retry_check(history)
    assert verdict.by_type == {"parked-before-cap": 1}, verdict.reason
    assert "received only 2 call(s)" in verdict.failures[0].message


def test_poison_parked_at_once_after_a_4xx_passes():
    poisoned = [claim(1.0, W1, 1), fetch_call(1.01, W1, status=400, outcome="error"),
                park(1.03, W1, 1, error="fetch: PoisonError: 400 (poison: parked at once)")]
    assert retry_check(poisoned).status == "pass"


# -- retry-discipline: Retry-After and backoff ------------------------------------------------

def retry_after_story(wait, next_claim_at):
    """A 429 with Retry-After 2 s at +0.02 s, the retry write, and the next try."""
    failed = failed_try(1.0, W1, 1, 1, wait, status=429, retry_after=2.0)
    nxt = [claim(next_claim_at, W2, 2), fetch_call(next_claim_at + 0.01, W2)]
    return failed, nxt


def test_a_retry_after_the_client_timed_out_before_is_not_judged():
    """Real everything seed 2 under load, a false alarm: the fake took a request 1 s after
    the worker sent it and answered 429 with a Retry-After at once; the worker had already
    timed out (call timeout 1 s) and scheduled an ordinary backoff."""
    claimed = claim(1.0, W1, 1)
    late = fetch_call(1.998, W1, status=429, outcome="error", retry_after=2.0)
    late["t_end"] = 2.001
    history = [claimed, late, retry(2.005, W1, 1, 1, 0.05)]
    verdict = retry_check(history)
    assert "retry-after-ignored" not in verdict.by_type, verdict.reason
    assert verdict.metrics["retry_after_unseen"] == 1
    on_time = [claimed, {**late, "t": 1.01, "t_start": 1.01, "t_end": 1.02},
               retry(1.03, W1, 1, 1, 0.05)]
    assert retry_check(on_time).by_type == {"retry-after-ignored": 1}


def test_a_retry_after_of_two_seconds_honoured_passes():
    failed, nxt = retry_after_story(wait=2.0, next_claim_at=3.1)
    verdict = retry_check(failed + nxt)
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["retry_after_checked"] == 1


def test_an_audit_write_stamped_just_before_its_call_still_gets_the_retry_after():
    # SQLite's clock has millisecond resolution: the retry write can sort before the 429.
    failed, nxt = retry_after_story(wait=2.0, next_claim_at=3.1)
    the_429, write = failed[1], failed[2]
    the_429["t_end"] = the_429["t_start"] + 0.0001
    write.update(t=the_429["t_start"] - 0.0004, next_run_at=the_429["t_end"] + 2.0)
    history = sorted(failed + nxt, key=lambda e: e["t"])
    assert history.index(write) < history.index(the_429)
    verdict = retry_check(history)
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["retry_after_checked"] == 1


def test_a_retry_scheduled_before_the_retry_after_is_caught():
    failed, nxt = retry_after_story(wait=0.05, next_claim_at=1.2)
    verdict = retry_check(failed + nxt)
    assert verdict.by_type == {"retry-after-ignored": 1}
    assert verdict.failures[0].events == [failed[1], failed[2]]


def test_a_call_made_before_the_retry_after_elapsed_is_caught():
    failed, nxt = retry_after_story(wait=2.0, next_claim_at=1.5)
    verdict = retry_check(failed + nxt)
    assert verdict.by_type == {"retry-after-ignored": 1}
    assert verdict.failures[0].events == [failed[1], failed[2], nxt[1]]
    assert "called again 0.490 s after it" in verdict.failures[0].message


DATE = "Thu, 01 Jan 1970 00:00:04 GMT"  # epoch 4.0


def retry_at_story(next_run_at, next_call_at):
    """A 429 at +0.02 s whose Retry-After is an HTTP date: 2 s, rounded up to the whole
    second (4.0, 0.98 s past t_end + 2 s), the retry write at 1.03 and the next try."""
    failed = failed_try(1.0, W1, 1, 1, next_run_at - 1.03, status=429, retry_after=2.0)
    failed[1].update(retry_at=4.0, retry_after_header=DATE)
    nxt = [claim(next_call_at - 0.01, W2, 2), fetch_call(next_call_at, W2)]
    return failed, nxt


@pytest.mark.parametrize("next_run_at, next_call_at", [(4.0, 4.0), (4.0, 4.3)],
                         ids=["at-the-date", "after-it"])
def test_a_retry_at_or_after_an_http_date_passes(next_run_at, next_call_at):
    failed, nxt = retry_at_story(next_run_at, next_call_at)
    verdict = retry_check(failed + nxt)
    assert verdict.status == "pass", verdict.reason  # the date's extra second is no backoff fault
    assert verdict.metrics["retry_after_checked"] == 1


def test_a_retry_scheduled_before_an_http_date_is_caught_though_its_seconds_passed():
    failed, nxt = retry_at_story(next_run_at=3.5, next_call_at=4.1)  # t_end + 2 s is 3.02
    verdict = retry_check(failed + nxt)
    assert verdict.by_type == {"retry-after-ignored": 1}
    assert verdict.failures[0].events == [failed[1], failed[2]]
    assert f"Retry-After {DATE!r} (an HTTP date" in verdict.failures[0].message


def test_a_call_made_before_an_http_date_is_caught():
    failed, nxt = retry_at_story(next_run_at=4.0, next_call_at=3.6)
    verdict = retry_check(failed + nxt)
    assert verdict.by_type == {"retry-after-ignored": 1}
    assert verdict.failures[0].events == [failed[1], failed[2], nxt[1]]


@pytest.mark.parametrize("status", [429, 503])
def test_an_unparseable_retry_after_asks_for_no_minimum_wait(status):
    history = failed_try(1.0, W1, 1, 1, 0.05, status=status)  # within [0, 0.1] s
    history[1]["retry_after_header"] = "soon"
    verdict = retry_check(history)
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["retry_after_checked"] == 0


@pytest.mark.parametrize("wait", [1.0, -0.5], ids=["past-the-ceiling", "negative"])
def test_a_backoff_outside_full_jitter_bounds_is_caught(wait):
    history = failed_try(1.0, W1, 1, 1, wait)  # attempt 1: [0, backoff_base=0.1] s
    verdict = retry_check(history)
    assert verdict.by_type == {"backoff-out-of-bounds": 1}
    assert verdict.failures[0].events == [history[1], history[2]]


def test_a_skewed_workers_backoff_is_not_judged_on_the_real_clock():
    skew = [nemesis(0.5, "skew", slot=0, seconds=5.0),
            process(0.6, "spawn", "worker-0.1", 101)]   # W1 runs in slot 0
    verdict = retry_check(skew + failed_try(1.0, W1, 1, 1, 5.05))
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["skipped_skewed"] == 1


def test_a_hung_call_given_up_at_the_call_timeout_is_not_a_negative_wait():
    # The provider stamps t_end when its 1.5 s hang ends; the worker gave up after 1 s.
    history = [claim(1.0, W1, 1), call(1.01, 2.51, J, "fetch", W1, outcome="hang"),
               retry(2.02, W1, 1, 1, 0.03)]
    assert retry_check(history).status == "pass"


def retries(waits):
    """One failed try per wait, each on a job of its own."""
    history = []
    for i, wait in enumerate(waits):
        history += failed_try(1.0 + i, W1, 1, 1, wait, job_id=f"doc-{i}")
    return history


def test_backoff_without_jitter_is_caught():
    history = retries([0.1] * 8)  # always the ceiling: within bounds, but no jitter
    verdict = retry_check(history)
    # 8 waits all at one end are also as far from a spread as 8 waits can be
    assert verdict.by_type == {"no-jitter": 1, "jitter-not-spread": 1}, verdict.reason
    assert verdict.failures[0].events == [e for e in history if e.get("to") == "pending"][:4]


def test_jittered_backoff_passes():
    rng = random.Random(3)
    assert retry_check(retries([rng.uniform(0, 0.1) for _ in range(8)])).status == "pass"


@pytest.mark.parametrize("low, high", [(0.05, 0.1), (0.0, 0.04)],
                         ids=["top-half-of-the-range", "bottom-40-percent"])
def test_waits_jittered_over_part_of_the_range_are_caught_by_their_spread(low, high):
    rng = random.Random(5)
    verdict = retry_check(retries([rng.uniform(low, high) for _ in range(60)]))
    assert verdict.by_type == {"jitter-not-spread": 1}, verdict.reason
    assert verdict.metrics["jitter_spread"]["waits"] == 60


def test_equal_waits_fail_the_spread_test_without_the_checker_crashing():
    """The mutant backoff_without_jitter: every wait the same, so the witnesses tie."""
    verdict = retry_check(retries([0.1] * 30))
    assert {"no-jitter", "jitter-not-spread"} <= set(verdict.by_type), verdict.reason


def test_waits_spread_over_the_whole_range_pass_the_spread_test():
    rng = random.Random(6)
    verdict = retry_check(retries([rng.uniform(0.0, 0.1) for _ in range(60)]))
    assert verdict.status == "pass", verdict.reason
    spread = verdict.metrics["jitter_spread"]
    assert max(spread["too_low"], spread["too_high"]) < spread["band"]


def test_the_spread_tests_false_alarm_rate_is_within_its_bound():
    """Uniform waits measured exactly, 4,000 runs of 30: the rejection rate at alpha = 0.01
    stays within alpha (DKW's bound holds for every n), and a range narrowed to its top half
    is rejected every time at 60 waits."""
    rng = random.Random(7)
    rejected = 0
    for _ in range(4000):
        u = [rng.random() for _ in range(30)]
        too_low, too_high, band = spread_test([(x, x) for x in u], alpha=0.01)
        rejected += max(too_low, too_high) > band
    assert rejected / 4000 <= 0.01
    for _ in range(200):
        u = [rng.uniform(0.5, 1.0) for _ in range(60)]
        too_low, too_high, band = spread_test([(x, x) for x in u])
        assert too_high > band


def test_the_spread_test_gives_the_benefit_of_a_wide_measurement():
    # each wait known only to lie in [u - 0.3, u + 0.3]: nothing can be rejected
    rng = random.Random(8)
    ranges = [(x - 0.3, x + 0.3) for x in (rng.random() for _ in range(500))]
    too_low, too_high, band = spread_test(ranges)
    assert max(too_low, too_high) <= band


# -- retry-discipline: retries after an outage -----------------------------------------------

def outage_story(retry_starts):
    """Eight fetches fail in a provider outage from +10 s to +11 s; their first retries start
    at `retry_starts`."""
    history = [nemesis(10.0, "outage", target="provider"), nemesis(11.0, "outage_end",
                                                                   target="provider")]
    for i, start in enumerate(retry_starts):
        history += [fetch_call(10.1 + i / 10, W1, job_id=f"doc-{i}", status=503, outcome="error"),
                    fetch_call(start, W1, job_id=f"doc-{i}", n=2)]
    return sorted(history, key=lambda e: e["t"])


def test_retries_released_together_after_an_outage_are_synchronized():
    history = outage_story([11.2 + i / 1000 for i in range(8)])
    verdict = retry_check(history, settings=settings(backoff_base=0.5))
    assert verdict.by_type == {"synchronized-retries": 1}
    retries = [e for e in history if e.get("n") == 2]
    outage = [e for e in history if e["src"] == "nemesis"]
    assert verdict.failures[0].events == outage + retries


def test_retries_spread_after_an_outage_pass_and_report_their_spread():
    verdict = retry_check(outage_story([11.0 + i * 0.15 for i in range(8)]),
                          settings=settings(backoff_base=0.5))
    assert verdict.status == "pass", verdict.reason
    (outage,) = verdict.metrics["outages"]
    assert outage["retries"] == 8 and outage["max_in_20ms"] == 1
    assert outage["delay_stdev"] > 0 and outage["delay_min"] < outage["delay_max"]


def test_a_jitter_range_too_small_to_judge_is_reported_not_judged():
    verdict = retry_check(outage_story([11.2 + i / 1000 for i in range(8)]),
                          settings=settings(backoff_base=0.1))
    assert verdict.status == "pass"
    assert verdict.metrics["outages"][0]["judged"] is False


def test_recorded_spend_without_a_provider_ledger_is_unknown():
    history = [claim(1.0, W1, 1), spend(1.1, J, "fetch", W1, 1), retry(1.2, W1, 1, 1, 0.05)]
    assert retry_check(history).status == "unknown"


# -- bounded-work --------------------------------------------------------------------------

def crash_loop(claims, parked=False, crashes=True):
    """`claims` claims of J's fetch, each by a fresh worker that (crashes) dies holding it."""
    history = []
    for i in range(claims):
        worker = f"worker:host:{300 + i}:cccc"
        history.append(claim(1.0 + i, worker, i + 1, frm="pending" if i == 0 else "fetching"))
        if crashes:
            history.append(process(1.5 + i, "exit", f"worker-{i}", 300 + i, signal="SIGKILL",
                                   killed=True))
    if parked:
        history.append(job(1.0 + claims, J, "fetching", "failed_fetch", W2, claims + 1,
                           old_token=claims, claims=claims, last_error="crash loop: step "
                           f"'fetch' was claimed {claims} times without finishing; parked"))
    return history


def test_a_crash_loop_job_without_a_claim_cap_is_caught():
    history = crash_loop(12)
    verdict = bounded(history, plan={**snapshot_with_effects([])["plan"], "crash_loop": [J]})
    assert verdict.by_type == {"too-many-claims": 1, "crash-loop-not-parked": 1}
    too_many, not_parked = verdict.failures
    assert too_many.events == [history[0], history[16]]
    assert not_parked.events == [history[-2]]  # its last claim (the exit follows)
    assert verdict.metrics["max_claims_per_step"] == {"fetch": 12}


def test_a_crash_loop_job_parked_at_the_cap_passes():
    history = crash_loop(8, parked=True)
    verdict = bounded(history, plan={**snapshot_with_effects([])["plan"], "crash_loop": [J]})
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["claims_histogram"] == {8: 1}


def test_a_park_for_a_crash_loop_before_the_claim_cap_fails():
    verdict = bounded(crash_loop(7, parked=True),
                      plan={**snapshot_with_effects([])["plan"], "crash_loop": [J]})
    assert verdict.by_type == {"parked-before-claim-cap": 1}, verdict.reason
    assert "after 7 claim(s)" in verdict.failures[0].message


def test_a_park_for_a_crash_loop_whose_claims_never_crashed_fails():
    """A worker that walks away from every claim (its lease already over when granted, say)
    makes the cap park a job that crashed nobody."""
    verdict = bounded(crash_loop(8, parked=True, crashes=False))
    assert verdict.by_type == {"crash-loop-without-crashes": 1}, verdict.reason
    assert "only 0 of them" in verdict.failures[0].message


def test_a_crash_loop_job_an_operator_cancelled_after_parking_passes():
    history = crash_loop(8, parked=True) + [job(20.0, J, "failed_fetch", "cancelled", OP, 10,
                                                old_token=9)]
    verdict = bounded(history, plan={**snapshot_with_effects([])["plan"], "crash_loop": [J]})
    assert verdict.status == "pass", verdict.reason


@pytest.mark.parametrize("through", ["retry", "operator"])
def test_a_retry_or_an_operator_requeue_starts_a_new_run_of_claims(through):
    history, token = [], 0
    for n in range(3):     # three runs of 4 claims: 12 claims of fetch, none over the cap of 8
        t = 10.0 * n
        history.append(claim(t + 1, W1, token + 1))
        history += [claim(t + 1 + i, W1, token + 1 + i, frm="fetching") for i in range(1, 4)]
        token += 4
        if through == "retry":
            history.append(retry(t + 5, W1, token, n + 1, 0.05))
        else:
            history += [park(t + 5, W1, token, error="fetch: boom"),
                        job(t + 6, J, "failed_fetch", "pending", OP, token + 1, old_token=token)]
            token += 1
    verdict = bounded(history)
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["claims_histogram"] == {4: 3}


def test_waits_all_at_the_top_of_the_range_are_caught_as_missing_jitter():
    """Write latency blurs equal waits on a loaded machine; all near the ceiling is the tell."""
    waits = [0.0998, 0.0946, 0.0959, 0.1, 0.0951, 0.0937, 0.0935, 0.1]  # ceiling 0.1
    assert retry_check(retries(waits)).by_type == {"no-jitter": 1}


# -- retry-discipline: the sender's waits ---------------------------------------------------

def failed_send(t, wait, attempts=1, sender="sender:host:201:cccc", status=503):
    """A send of doc-1's charge answered `status`, then its retry scheduled `wait` later."""
    from builders import outbox, request
    return [outbox(t - 0.05, 1, J, "charge", sender, attempts, old_token=attempts - 1,
                   attempts=attempts, lease_until=t + 1.0),
            request(t - 0.04, t - 0.001, J, "charge", worker=sender, n=attempts, status=status,
                    outcome="error", applied=False),
            outbox(t, 1, J, "charge", sender, attempts, attempts=attempts, lease_until=0.0,
                   last_error="charge: RetryableError: 503", next_attempt_at=t + wait)]


def outbox_settings(**overrides):
    return settings(outbox_backoff_bounds=[[0.0, 0.05 * 2 ** i] for i in range(6)],
                    **overrides)


@pytest.mark.parametrize("wait, status", [(0.03, "pass"), (-0.2, "fail"), (0.5, "fail")],
                         ids=["within", "before-the-failure", "past-the-ceiling"])
def test_a_failed_send_waits_within_the_senders_backoff(wait, status):
    history = delivered_job(J) + failed_send(2.0, wait)
    verdict = retry_check(history, settings=outbox_settings())
    assert verdict.metrics["outbox"]["retry_writes"] == 1
    if status == "fail":
        assert verdict.by_type == {"outbox-backoff-out-of-bounds": 1}, verdict.reason
    else:
        assert "outbox-backoff-out-of-bounds" not in verdict.by_type, verdict.reason


@pytest.mark.parametrize("status, kind", [(402, "refusal-retried"), (422, "refusal-retried"),
                                          (429, None), (408, None), (503, None)],
                         ids=["declined", "conflict", "rate-limited", "request-timeout", "5xx"])
def test_a_send_refused_for_good_is_dead_lettered_not_retried(status, kind):
    history = delivered_job(J) + failed_send(2.0, 0.03, status=status)
    verdict = retry_check(history, settings=outbox_settings())
    assert verdict.by_type == ({kind: 1} if kind else {}), verdict.reason


def test_retried_sends_that_all_wait_nothing_are_not_spread():
    history = delivered_job(J)
    for i in range(40):  # 40 rows' first retries, each scheduled at once
        history += [dict(e, job=f"doc-{i}", key=f"doc-{i}:charge") if e.get("job") else e
                    for e in failed_send(2.0 + i * 0.1, 0.0005)]
    verdict = retry_check(history, settings=outbox_settings())
    assert verdict.by_type.get("jitter-not-spread") == 1, verdict.reason
    assert verdict.metrics["outbox"]["jitter_spread"]["waits"] == 40


def sends_failed_and_retried(waits):
    """One row's failed send per wait (doc-i's charge), its retry scheduled `wait` later."""
    history = delivered_job(J)
    for i, wait in enumerate(waits):
        history += [dict(e, job=f"doc-{i}", key=f"doc-{i}:charge") if e.get("job") else e
                    for e in failed_send(2.0 + i * 0.1, wait)]
    return history


def test_ten_failed_sends_each_retried_at_once_are_caught_though_each_is_within_bounds():
    """The mutant outbox_retry_at_once passed at seed 1: 18 failed sends, each retried at
    once, under the 20 waits the spread test then asked for. Full jitter's lowest wait is 0,
    so no single retry breaks its bounds; ten all at 0 are far from any uniform spread."""
    verdict = retry_check(sends_failed_and_retried([0.0005] * 10),
                          settings=outbox_settings())
    assert verdict.by_type == {"jitter-not-spread": 1}, verdict.reason
    assert verdict.metrics["outbox"]["jitter_spread"]["waits"] == 10


def test_ten_failed_sends_jittered_over_their_backoff_pass():
    rng = random.Random(11)
    verdict = retry_check(sends_failed_and_retried([rng.uniform(0, 0.05) for _ in range(10)]),
                          settings=outbox_settings())
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["outbox"]["jitter_spread"]["waits"] == 10


@pytest.mark.parametrize("fault, logged_at, answered_at", [("lost", 10.551, 11.451),
                                                           ("drop", 10.551, 10.552)],
                         ids=["held-past-the-timeout", "dropped-at-once"])
def test_a_retry_is_timed_from_when_the_sender_can_have_given_up(fault, logged_at, answered_at):
    """Real everything seed 4 under load, a false alarm: the fake logged a lost request 75 ms
    after the sender's claim, and the sender, timing out 0.6 s after it really sent, wrote a
    retry due before the fake's arrival time plus 0.6 s. A held request ends, for the
    sender, its send timeout after its claim at the earliest; a dropped one at its answer."""
    from builders import outbox, request
    sender = "sender:host:201:cccc"
    read = 11.076 if fault == "lost" else 10.56  # when the sender read its clock
    history = delivered_job(J) + [
        outbox(10.476, 1, J, "charge", sender, 1, old_token=0, attempts=1, lease_until=12.0),
        dict(request(logged_at, answered_at, J, "charge", worker=sender, status=None,
                     outcome=fault, applied=False), fault=fault),
        outbox(11.097, 1, J, "charge", sender, 1, attempts=1, lease_until=0.0,
               last_error="charge: CallTimeout", next_attempt_at=read + 0.005)]
    verdict = retry_check(history, settings=outbox_settings(send_timeout=0.6))
    assert "outbox-backoff-out-of-bounds" not in verdict.by_type, verdict.reason
    assert verdict.metrics["outbox"]["retry_writes"] == 1
