"""operator-moves: an operator action reported done wrote the job, released its lease, and a
requeue or resolve started the step over in a ready state, due at once; a cancel ended it;
an action that raised fails; a run with no action done is unknown."""
from __future__ import annotations

import pytest
from builders import OP, job, nemesis, snapshot_of

from chaos.checkers.operator import check_operator_moves
from chaos.history import merge

DOC = "doc-1"


def run(history):
    history = merge(history)
    return check_operator_moves(history, snapshot_of(history))


def done(t, action):
    return nemesis(t, "operator", action=action, job=DOC, result="done")


def requeued(t, **kw):
    """The operator's requeue of a job parked in failed_fetch, as the engine wrote it."""
    fields = {"attempts": 0, "claims": 0, "lease_until": 0.0, "next_run_at": t, **kw}
    return job(t, DOC, "failed_fetch", "pending", OP, 2, old_token=1, **fields)


def test_a_requeue_that_starts_the_step_over_passes():
    verdict = run([requeued(1.0), done(1.01, "requeue")])
    assert verdict.status == "pass", verdict.reason
    assert verdict.checked == 1


@pytest.mark.parametrize("history, kind", [
    ([requeued(1.0, attempts=3), done(1.01, "requeue")], "operator-move-kept-counters"),
    ([requeued(1.0, lease_until=9.0), done(1.01, "requeue")], "operator-move-kept-lease"),
    ([requeued(1.0, next_run_at=9.0), done(1.01, "requeue")], "operator-move-not-due"),
    ([done(1.01, "requeue")], "operator-move-missing"),
    ([job(1.0, DOC, "failed_fetch", "fetched", OP, 2, old_token=1), done(1.01, "cancel")],
     "operator-move-wrong-state"),
    ([nemesis(1.0, "error", fault="operator", error="DatabaseError: changed under it")],
     "operator-action-raised"),
], ids=["counters-kept", "lease-kept", "not-due", "nothing-written", "cancel-not-terminal",
        "raised"])
def test_an_operator_move_that_breaks_its_promise_fails(history, kind):
    verdict = run(history)
    assert verdict.by_type == {kind: 1}, verdict.reason


def test_no_operator_action_done_is_unknown():
    refused = nemesis(1.0, "operator", action="cancel", job=DOC, result="refused: delivered")
    assert run([refused]).status == "unknown"


def test_two_actions_on_one_job_at_one_instant_are_matched_in_order():
    """sim operator-actions seed 9: a requeue and a cancel of one job in the same turn."""
    cancelled = job(1.0, DOC, "pending", "cancelled", OP, 3, old_token=2, attempts=0, claims=0,
                    lease_until=0.0)
    verdict = run([done(1.0, "requeue"), done(1.0, "cancel"), requeued(1.0), cancelled])
    assert verdict.status == "pass", verdict.reason
    assert verdict.checked == 2


# -- refusals ------------------------------------------------------------------------------

W = "worker:host:101:aaaa"


def refused(t_start, t, action, why="refused: not parked"):
    return nemesis(t, "operator", action=action, job=DOC, result=why, t_start=t_start)


def parked_in_failed_fetch(t):
    """A job the worker parked in failed_fetch: a requeue, resolve or cancel always applies."""
    return [job(t - 0.5, DOC, None, "pending", "submit", 0, op="insert"),
            job(t, DOC, "fetching", "failed_fetch", W, 1, last_error="fetch: gave up")]


@pytest.mark.parametrize("action", ["requeue", "resolve", "cancel"])
def test_an_action_refused_in_a_state_it_always_applies_from_fails(action):
    verdict = run(parked_in_failed_fetch(1.0) + [refused(2.0, 2.01, action, "refused: no job")])
    assert verdict.by_type == {"operator-refused-wrongly": 1}, verdict.reason
    assert "'failed_fetch' throughout" in verdict.failures[0].message


def test_a_refusal_where_the_action_does_not_apply_passes_and_counts():
    history = [job(0.5, DOC, None, "pending", "submit", 0, op="insert"),
               job(1.0, DOC, "pending", "fetching", W, 1, old_token=0, lease_until=5.0),
               refused(2.0, 2.01, "requeue")]
    verdict = run(history)
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["refusals_judged"] == 1


def test_a_refusal_raced_by_a_write_during_the_action_is_not_judged():
    """The job was parked when the action began, but a write landed while it ran."""
    history = parked_in_failed_fetch(1.0) + [
        job(2.005, DOC, "failed_fetch", "cancelled", OP, 2, old_token=1),
        refused(2.0, 2.01, "requeue")]
    verdict = run(history)
    assert verdict.status == "unknown" and verdict.metrics["refusals_judged"] == 0


def test_an_action_the_engine_does_not_name_is_not_judged_on_its_refusals():
    from builders import pipeline_json, snapshot_of as snap
    history = merge(parked_in_failed_fetch(1.0) + [refused(2.0, 2.01, "requeue")])
    snapshot = snap(history)
    snapshot["pipeline"] = {**pipeline_json(), "operator_actions": {"cancel": ["pending"]}}
    verdict = check_operator_moves(history, snapshot)
    assert verdict.status == "unknown", verdict.reason
