"""legal-transitions and submissions-idempotent: clean histories pass (hand-made and recorded
from the real engine), and each kind of violation fails citing the offending events."""
from __future__ import annotations

import pytest
from builders import (OP, W1, W2, audit_events, delivered_job, install_audit, job, nemesis,
                      snapshot, snapshot_of, submit)

from chaos.checkers.transitions import check_legal_transitions, check_submissions_idempotent
from engine.store import SubmissionConflict

DOC = "doc-1"


def legal(history, **overrides):
    return check_legal_transitions(history, snapshot_of(history, **overrides))


def idempotent(history, **overrides):
    return check_submissions_idempotent(history, snapshot_of(history, **overrides))


def assert_fails(verdict, type_, *witnesses):
    assert verdict.status == "fail", verdict.reason
    assert verdict.by_type == {type_: len(verdict.failures)}
    assert verdict.failures[0].type == type_
    assert verdict.failures[0].events == list(witnesses)


def fetching(t=1.0, token=1):
    """A job submitted and claimed by W1."""
    return [job(t, DOC, None, "pending", "submit", 0, op="insert"),
            job(t + 0.1, DOC, "pending", "fetching", W1, token, old_token=token - 1)]


# -- legal-transitions --------------------------------------------------------------------

def test_a_delivered_job_walks_only_edges_and_is_counted_per_edge():
    history = delivered_job(DOC) + delivered_job("doc-2", t0=5.0)
    verdict = legal(history)
    assert verdict.status == "pass"
    assert verdict.checked == 18  # 2 inserts + 8 state changes each
    assert verdict.metrics["per_edge"]["fetching->fetched"] == 2
    assert verdict.metrics["per_edge"]["(new)->pending"] == 2


def test_a_worker_skipping_a_step_is_an_illegal_edge():
    bad = job(2.0, DOC, "fetching", "extracted", W1, 1)
    assert_fails(legal(fetching() + [bad]), "illegal-edge", bad)


def test_an_operator_edge_taken_by_a_worker_is_illegal_and_legal_for_an_operator():
    history = fetching()[:1]
    by_worker = job(2.0, DOC, "pending", "cancelled", W1, 0)
    by_operator = job(2.0, DOC, "pending", "cancelled", OP, 1, old_token=0)
    assert_fails(legal(history + [by_worker]), "illegal-edge", by_worker)
    assert legal(history + [by_operator]).status == "pass"


def test_a_job_inserted_past_the_first_ready_state_fails():
    bad = job(1.0, DOC, None, "fetched", "submit", 0, op="insert")
    assert_fails(legal([bad]), "bad-initial-state", bad)


@pytest.mark.parametrize("writer", [W1, OP])
def test_a_terminal_state_is_never_left_whoever_writes(writer):
    history = delivered_job(DOC)
    bad = job(9.0, DOC, "delivered", "pending", writer, 2, old_token=1)
    assert_fails(legal(history + [bad]), "terminal-left", bad)


def parked_then_left(writer, token):
    failed = job(2.0, DOC, "fetching", "failed_fetch", W1, 1, last_error="400")
    left = job(3.0, DOC, "failed_fetch", "pending", writer, token, old_token=1)
    return fetching() + [failed, left], left


def test_a_parked_job_requeued_by_an_operator_is_legal():
    history, _ = parked_then_left(OP, 2)
    assert legal(history).status == "pass"


def test_the_same_move_out_of_a_parked_state_by_a_worker_is_illegal():
    history, left = parked_then_left(W2, 1)
    assert_fails(legal(history), "parked-left-by-worker", left)


def test_a_deleted_job_fails():
    bad = job(9.0, DOC, "delivered", "delivered", W1, 1, op="delete")
    assert_fails(legal(delivered_job(DOC) + [bad]), "job-deleted", bad)


def test_unknown_without_audit_events_for_a_run_with_jobs():
    verdict = check_legal_transitions([submit(1.0, DOC)], snapshot(submitted=[DOC]))
    assert verdict.status == "unknown"


def test_the_real_engine_with_operators_and_a_crash_loop_passes(store, clock, pipeline):
    """Recorded from the engine itself: claims, kept jobs, a park and a requeue, a crash-loop
    park (which first walks ready -> working under the last writer's name), a cancel."""
    install_audit(store, clock)
    for job_id in ("a", "b", "c"):
        store.submit(job_id, pipeline, {"title": job_id, "body": "x"}, clock.now())
    claim = store.claim(pipeline, W1, clock.now(), 5.0, 8)
    store.fail(claim, pipeline, W1, clock.now(), error="400", retry_at=None)
    store.requeue(claim.job_id, OP, clock.now())
    clock.advance(1)
    assert store.claim(pipeline, W2, clock.now(), 5.0, 0) is None  # every job crash-looped
    store.cancel("b", OP, clock.now())
    history = audit_events(store)
    parks = [e for e in history if e["to"] == "failed_fetch"]
    assert len(parks) == 4  # the test really exercised both park paths
    verdict = legal(history)
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["per_edge"]["failed_fetch->cancelled"] == 1


# -- submissions-idempotent -----------------------------------------------------------------

def test_duplicates_that_changed_nothing_pass():
    history = delivered_job(DOC) + [submit(9.0, DOC, "exists", duplicate=True),
                                    submit(9.1, DOC, "rejected", payload_hash="h2", duplicate=True)]
    verdict = idempotent(history)
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["results"] == {"created": 1, "exists": 1, "rejected": 1}


def test_a_submitted_job_that_never_appeared_is_missing():
    sent = submit(1.0, DOC)
    assert_fails(idempotent([sent]), "missing-job", sent)


def test_a_second_insert_of_one_id_fails():
    history = delivered_job(DOC)
    again = job(9.0, DOC, None, "pending", "submit", 0, op="insert")
    assert_fails(idempotent(history + [again]), "duplicate-insert", history[1], again)


def test_a_duplicate_submit_that_changed_the_job_fails():
    history = delivered_job(DOC)
    reset = job(9.0, DOC, "delivered", "delivered", "submit", 1)
    assert_fails(idempotent(history + [submit(9.0, DOC, "exists", duplicate=True), reset]),
                 "duplicate-changed-job", history[1], reset)


def test_a_payload_that_changes_after_the_insert_fails():
    history = fetching()
    overwritten = job(2.0, DOC, "fetching", "fetched", W1, 1, payload_hash="h2")
    verdict = idempotent([submit(1.0, DOC)] + history + [overwritten])
    assert verdict.by_type == {"payload-changed": 1, "original-overwritten": 1}
    assert verdict.failures[0].events == [history[0], overwritten]


@pytest.mark.parametrize("payload_hash, result, type_", [
    ("h2", "exists", "mismatch-accepted"),
    ("h2", "created", "mismatch-accepted"),
    ("h1", "rejected", "duplicate-not-idempotent"),
    ("h1", "created", "duplicate-not-idempotent"),
])
def test_a_duplicate_gets_the_answer_its_payload_calls_for(payload_hash, result, type_):
    history = delivered_job(DOC)
    dup = submit(9.0, DOC, result, payload_hash=payload_hash, duplicate=True)
    assert_fails(idempotent(history + [dup]), type_, history[0], dup)


def test_a_duplicate_submit_that_raised_fails():
    raised = nemesis(9.0, "error", fault="duplicate_submit",
                     error="IndexError: tuple index out of range")
    assert_fails(idempotent(delivered_job(DOC) + [raised]), "submit-raised", raised)


def test_a_first_submit_that_was_rejected_fails():
    first = submit(1.0, DOC, "rejected")
    history = [first] + delivered_job(DOC)[1:]
    assert_fails(idempotent(history), "first-submit-rejected", first)


def test_a_stored_job_overwritten_by_a_mismatched_duplicate_fails():
    history = delivered_job(DOC) + [submit(9.0, DOC, "rejected", payload_hash="h2", duplicate=True)]
    stored = snapshot_of(history)["jobs"]
    stored[DOC]["payload_hash"] = "h2"
    assert_fails(idempotent(history, jobs=stored), "original-overwritten", history[0])


def test_an_engine_that_keeps_no_payload_hash_is_not_judged_to_have_overwritten_it():
    # the snapshot documents payload_hash as "may be None": None is the engine's word that
    # it keeps none, no evidence that the stored job changed
    history = delivered_job(DOC) + [submit(9.0, DOC, "rejected", payload_hash="h2", duplicate=True)]
    stored = snapshot_of(history)["jobs"]
    stored[DOC]["payload_hash"] = None
    verdict = idempotent(history, jobs=stored)
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["original_unjudged"] == 1


def test_a_job_nobody_submitted_must_not_exist():
    history = delivered_job(DOC)
    assert_fails(idempotent(history, submitted=[]), "unsubmitted-job", history[1])


def test_unknown_when_the_history_has_no_submissions_at_all():
    verdict = check_submissions_idempotent([], snapshot(submitted=[DOC]))
    assert verdict.status == "unknown"


def test_the_real_engines_submit_passes(store, clock, pipeline):
    install_audit(store, clock)
    payload, now = {"title": "t", "body": "b"}, clock.now()
    assert store.submit(DOC, pipeline, payload, now) is True
    assert store.submit(DOC, pipeline, payload, now) is False
    with pytest.raises(SubmissionConflict):
        store.submit(DOC, pipeline, {"title": "other"}, now)
    runner = [submit(now, DOC, "created"), submit(now, DOC, "exists", duplicate=True),
              submit(now, DOC, "rejected", payload_hash="h2", duplicate=True)]
    history = runner + audit_events(store)
    stored = {DOC: {"state": "pending", "payload_hash": "h1"}}
    verdict = check_submissions_idempotent(history, snapshot(submitted=[DOC], jobs=stored))
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["jobs_inserted"] == 1
