"""An engine whose one counter of claims bounds retries and crashes together (cap_counts
"claims", a queue's receive count) is judged by that counter: a job parked once its claims
of a step reach max_claims passes, whatever mix of failures and crashes made them and
whatever its attempts say; one claimed past the cap, or parked before it, is caught. The
same histories under separate counters show the difference."""
from __future__ import annotations

from builders import W1, W2, job, snapshot_with_effects
from test_liveness import J, claim, crashed_try, failed_try, fetch_call, park

from chaos.checkers.liveness import check_bounded_work
from chaos.checkers.retries import check_retry_discipline

SHARED = {"cap_counts": "claims", "max_claims": 4, "max_attempts": None}
SEPARATE = {"cap_counts": "separate", "max_claims": 4, "max_attempts": 4}
W3 = "worker:host:103:cccc"


def judge(check, history, counters: dict):
    snapshot = snapshot_with_effects(history)
    return check(history, {**snapshot, "settings": {**snapshot["settings"], **counters}})


def mixed_claims(n: int) -> list[dict]:
    """`n` claims of J's fetch that each end in a failure (written) or a crash, in turn."""
    history, attempts = [], 0
    for i in range(n):
        t, frm = 1.0 + i, "pending" if i == 0 or history[-1]["type"] == "state" else "fetching"
        if i % 2 == 0:
            attempts += 1
            history += failed_try(t, W1, i + 1, attempts, 0.05, frm=frm)
        else:
            history += crashed_try(t, W2, i + 1, frm=frm)
    return history


def parked_for_attempts(after: int) -> list[dict]:
    """`after` - 1 mixed claims, then one more whose failure parks the job for its attempts."""
    history = mixed_claims(after - 1)
    attempts = sum(e["type"] == "state" and e.get("next_run_at") is not None for e in history)
    frm = "pending" if history[-1]["type"] == "state" else "fetching"
    t = float(after)
    return history + [claim(t, W3, after, frm=frm),
                      fetch_call(t + 0.01, W3, status=503, outcome="error"),
                      park(t + 0.03, W3, after, attempts=attempts + 1,
                           error=f"fetch: RetryableError: 503 (parked after {after} receives)")]


def parked_for_a_crash_loop(after: int) -> list[dict]:
    """`after` mixed claims, then the claim that finds the cap parks the job instead."""
    history = mixed_claims(after)
    return history + [job(float(after + 1), J, "fetching", "failed_fetch", W3, after + 1,
                          old_token=after, claims=after, last_error="crash loop: received "
                          f"{after} times; parked")]


def test_a_park_for_attempts_at_the_shared_cap_passes_whatever_its_attempts_say():
    history = parked_for_attempts(4)  # 2 failures, 1 crash, then the fourth claim's failure
    assert history[-1]["cause"] == "attempts" and history[-1]["attempts"] == 3
    verdict = judge(check_retry_discipline, history, SHARED)
    assert verdict.status == "pass", (verdict.reason, [f.message for f in verdict.failures])
    # with separate counters 3 failed attempts of 4 is a premature park
    verdict = judge(check_retry_discipline, history, SEPARATE)
    assert verdict.by_type == {"parked-before-cap": 1}


def test_a_park_for_attempts_before_the_shared_cap_fails():
    verdict = judge(check_retry_discipline, parked_for_attempts(3), SHARED)
    assert verdict.by_type == {"parked-before-cap": 1}, verdict.reason
    message = verdict.failures[0].message
    assert "with 3 of max_claims=4 claims" in message
    assert "fewer than max_claims=4" in message
    # a max_attempts beside the shared cap is a second, earlier way to be due
    verdict = judge(check_retry_discipline, parked_for_attempts(3),
                    {**SHARED, "max_attempts": 2})
    assert verdict.status == "pass", verdict.reason


def test_a_crash_loop_park_at_the_shared_cap_passes_whatever_mix_made_the_claims():
    history = parked_for_a_crash_loop(4)
    assert judge(check_bounded_work, history, SHARED).status == "pass"
    # with separate counters the park ended a run of one crash: before its cap
    verdict = judge(check_bounded_work, history, SEPARATE)
    assert verdict.by_type == {"parked-before-claim-cap": 1}


def test_a_crash_loop_park_before_the_shared_cap_fails():
    verdict = judge(check_bounded_work, parked_for_a_crash_loop(3), SHARED)
    assert verdict.by_type == {"parked-before-claim-cap": 1}, verdict.reason


def test_an_engine_that_claims_past_the_shared_cap_is_caught():
    history = mixed_claims(6)
    verdict = judge(check_bounded_work, history, SHARED)
    assert verdict.by_type == {"too-many-claims": 1}, verdict.reason
    message = verdict.failures[0].message
    assert "claimed 5 times since it entered the step, failed or crashed (max_claims=4)" \
        in message
    assert verdict.metrics["max_claims_per_step"] == {"fetch": 6}
    # crashes in a row never pass 1 here: separate counters see nothing wrong
    assert judge(check_bounded_work, history, SEPARATE).status != "fail"


def test_failed_attempts_past_the_shared_cap_are_caught():
    history = []
    for a in range(1, 6):
        history += failed_try(float(a), W1, a, a, 0.05)
    verdict = judge(check_retry_discipline, history, SHARED)
    assert verdict.by_type["attempts-over-cap"] == 1
    over = next(f for f in verdict.failures if f.type == "attempts-over-cap")
    assert "recorded attempt 5" in over.message and "past max_claims=4" in over.message


def test_a_crash_looping_job_parked_at_the_shared_cap_may_say_attempts():
    """One counter cannot tell a crash loop from failures: either cause ends the loop."""
    history = parked_for_attempts(4)
    snapshot = snapshot_with_effects(history)
    snapshot = {**snapshot, "plan": {**snapshot["plan"], "crash_loop": [J]}}
    for counters, failures in ((SHARED, {}), (SEPARATE, {"crash-loop-not-parked": 1})):
        verdict = check_bounded_work(history, {**snapshot, "settings": {
            **snapshot["settings"], **counters}})
        assert verdict.by_type == failures, (counters, verdict.reason)
