"""no-rebill-after-commit, memo-consistent and cost-accounted: clean histories pass, each
violation fails citing its events, and the subtle cases (a call overlapping the commit, a memo
discarded by an operator, a memo hit) are judged as the rules say."""
from __future__ import annotations

import pytest
from builders import (OP, W1, W2, call, delivered_job, job, memo, nemesis, process, snapshot,
                      snapshot_of, spend, submit, zombie_finish)

from chaos.checkers.billing import (check_cost_accounted, check_memo_consistent,
                                    check_no_rebill_after_commit)
from chaos.history import merge

DOC = "doc-1"


def run(check, history, **overrides):
    history = merge(history)
    return check(history, snapshot_of(history, **overrides))


def assert_fails(verdict, type_, *witnesses):
    assert verdict.status == "fail", verdict.reason
    assert verdict.by_type == {type_: len(verdict.failures)}
    assert verdict.failures[0].events == list(witnesses)


KINDS = {"job": ("submitted", "claimed", "state", "removed"), "spend": ("billed",)}


def the(history, type_, **fields):
    """The one event of `type_` in history with these fields ("job": any job operation;
    `writer`: the operation's worker)."""
    if "writer" in fields:
        fields["worker"] = fields.pop("writer")
    types = KINDS.get(type_, (type_,))
    found = [e for e in history if e["type"] in types
             and all(e.get(k) == v for k, v in fields.items())]
    assert len(found) == 1, found
    return found[0]


def delivered():
    """doc-1 delivered by W1: claimed at 1.1, fetch called 1.11-1.15, its memo at 1.16."""
    return delivered_job(DOC)


def fetch_memo(history):
    return the(history, "memo", step="fetch", op="insert")


def without_ledger(history):
    return [e for e in history if e["src"] != "provider"]


# -- no-rebill-after-commit -----------------------------------------------------------------

def test_a_clean_delivery_bills_each_step_once():
    verdict = run(check_no_rebill_after_commit, delivered())
    assert verdict.status == "pass"
    assert verdict.checked == 3
    assert verdict.metrics["calls_after_commit"] == 0


def test_a_call_started_after_the_memo_committed_is_a_rebill():
    history = delivered()
    again = call(2.0, 2.1, DOC, "fetch", W2, billed=0.02)
    verdict = run(check_no_rebill_after_commit, history + [again])
    assert_fails(verdict, "rebilled-after-commit", fetch_memo(history), again)
    assert verdict.metrics["billed_after_commit"] == 0.02


def test_a_call_that_started_before_the_commit_and_ended_after_is_duplicate_spend_not_a_rebill():
    overlapping = call(1.12, 1.40, DOC, "fetch", W2)
    verdict = run(check_no_rebill_after_commit, delivered() + [overlapping])
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["overlapping_duplicate_calls"] == 1


def test_a_call_within_the_clock_tolerance_of_the_commit_is_not_judged_a_rebill():
    close = call(1.164, 1.2, DOC, "fetch", W2)
    assert run(check_no_rebill_after_commit, delivered() + [close]).status == "pass"


def test_a_call_after_an_operator_discarded_the_memo_is_not_a_rebill():
    history = delivered()
    discard = [memo(3.0, DOC, "fetch", W1, 1, op="delete"),
               job(3.0, DOC, "needs_human", "extracted", OP, 2, old_token=1)]
    rerun = call(4.0, 4.1, DOC, "fetch", W2)
    assert run(check_no_rebill_after_commit, history + discard + [rerun]).status == "pass"


def test_a_rebill_by_a_worker_that_claimed_before_the_commit_says_so():
    history = delivered()
    stale_claim = job(1.12, DOC, "fetching", "fetching", W2, 2, old_token=1)
    late_call = call(1.30, 1.35, DOC, "fetch", W2)
    verdict = run(check_no_rebill_after_commit, history + [stale_claim, late_call])
    assert_fails(verdict, "rebilled-after-commit", fetch_memo(history), late_call, stale_claim)
    assert verdict.metrics["calls_after_commit_claimed_before"] == 1
    assert "came before the memo" in verdict.failures[0].message


def test_rebill_is_unknown_without_a_provider_ledger():
    verdict = run(check_no_rebill_after_commit, without_ledger(delivered()))
    assert verdict.status == "unknown"


# -- memo-consistent ------------------------------------------------------------------------

def test_a_delivered_job_has_one_memo_per_step():
    verdict = run(check_memo_consistent, delivered())
    assert verdict.status == "pass", verdict.reason
    assert verdict.checked == 5  # four memo events and one job


def test_a_second_memo_while_the_first_is_live_fails():
    history = delivered()
    second = memo(3.0, DOC, "fetch", W2, 2)
    assert_fails(run(check_memo_consistent, history + [second]), "second-memo",
                 fetch_memo(history), second)


def test_a_memo_deleted_by_resolve_may_be_written_again():
    # The audit names a deleted memo's writer, not its deleter: the operator's job write
    # in the same transaction is what attributes the delete.
    resolve = [memo(3.0, DOC, "fetch", W1, 1, op="delete"),
               job(3.0, DOC, "delivered", "delivered", OP, 2, old_token=1),
               memo(4.0, DOC, "fetch", W2, 3)]
    assert run(check_memo_consistent, delivered() + resolve).status == "pass"


def test_a_memo_deleted_without_an_operator_fails():
    delete = memo(3.0, DOC, "fetch", W1, 1, op="delete")
    after = job(3.0, DOC, "delivered", "delivered", W2, 1)
    verdict = run(check_memo_consistent, delivered() + [delete, after],
                  memos=snapshot_of(delivered())["memos"])
    assert_fails(verdict, "memo-deleted-without-operator", delete, after)


def with_memos(steps):
    """doc-1's insert, then a memo for each step named (the job's state is set by the test)."""
    return [job(1.0, DOC, None, "pending", "submit", 0, op="insert")] + [
        memo(1.1 + i / 10, DOC, step, W1, 1) for i, step in enumerate(steps)]


@pytest.mark.parametrize("state, have, missing", [
    ("extracted", ["fetch"], "'extract'"),
    ("verifying", ["fetch"], "'extract'"),
    ("failed_deliver", ["fetch", "extract"], "'verify'"),
    ("needs_human", [], "'fetch', 'extract'"),
    ("delivered", [], "'fetch', 'extract', 'verify', 'deliver'"),
])
def test_a_job_state_implies_the_memos_of_the_steps_before_it(state, have, missing):
    history = with_memos(have)
    verdict = run(check_memo_consistent, history, jobs={DOC: {"state": state}})
    assert_fails(verdict, "missing-memo", history[0])
    assert verdict.failures[0].message.endswith(missing)


@pytest.mark.parametrize("state", ["pending", "fetching", "failed_fetch", "cancelled", "fetched"])
def test_states_needing_no_missing_memo_pass(state):
    history = with_memos(["fetch"] if state == "fetched" else [])
    verdict = run(check_memo_consistent, history, jobs={DOC: {"state": state}})
    assert verdict.status == "pass", verdict.reason


def takeover_after_memo(calls_again: bool, claim_t: float = 1.5):
    """W1 commits fetch's memo at 1.3 but is fenced; W2 re-claims at claim_t and finishes."""
    history = [job(1.0, DOC, None, "pending", "submit", 0, op="insert"),
               job(1.1, DOC, "pending", "fetching", W1, 1, old_token=0),
               call(1.11, 1.25, DOC, "fetch", W1), memo(1.3, DOC, "fetch", W1, 1),
               job(claim_t, DOC, "fetching", "fetching", W2, 2, old_token=1),
               job(claim_t + 0.1, DOC, "fetching", "fetched", W2, 2)]
    if calls_again:
        history.append(call(claim_t + 0.01, claim_t + 0.05, DOC, "fetch", W2))
    return merge(history)


def test_a_memo_hit_that_still_calls_the_provider_fails():
    history = takeover_after_memo(calls_again=True)
    verdict = run(check_memo_consistent, history)
    assert_fails(verdict, "memo-hit-called", the(history, "memo"),
                 the(history, "job", writer=W2, to="fetching"), the(history, "call", worker=W2))


def test_a_memo_hit_that_uses_the_memo_passes():
    verdict = run(check_memo_consistent, takeover_after_memo(calls_again=False))
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["memo_hit_entries"] == 1


def test_a_worker_that_claimed_before_the_memo_committed_had_no_memo_to_hit():
    history = takeover_after_memo(calls_again=True, claim_t=1.2)
    assert run(check_memo_consistent, history).status == "pass"


def test_memo_consistent_is_unknown_without_memo_events():
    history = [e for e in delivered() if e["type"] != "memo"]
    verdict = check_memo_consistent(history, snapshot_of(delivered()))
    assert verdict.status == "unknown"


# -- cost-accounted -------------------------------------------------------------------------

def test_a_clean_delivery_commits_all_it_was_billed():
    verdict = run(check_cost_accounted, delivered())
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["billed"] == verdict.metrics["committed"] == 0.03
    assert verdict.metrics["waste"] == 0


def with_fetch_call(history, **fields):
    return [dict(e, **fields) if e["type"] == "call" and e["step"] == "fetch" else e
            for e in history]


def test_a_memo_whose_cost_differs_from_its_billed_call_fails():
    history = with_fetch_call(delivered(), billed=0.02)
    assert_fails(run(check_cost_accounted, history), "cost-mismatch", fetch_memo(history),
                 the(history, "call", step="fetch"))


def test_a_memo_whose_engine_keeps_no_cost_is_matched_to_its_call_not_judged():
    history = [dict(e, cost=None) if e["type"] == "memo" else e
               for e in with_fetch_call(delivered(), billed=0.02)]
    verdict = run(check_cost_accounted, history)
    assert "cost-mismatch" not in verdict.by_type, verdict.failures
    assert verdict.metrics["calls_by_cause"].get("duplicate", 0) == 0  # still its memo's call


def test_a_memo_with_a_cost_and_no_billed_call_fails():
    history = [e for e in delivered() if not (e["type"] == "call" and e["step"] == "fetch")]
    assert_fails(run(check_cost_accounted, history), "cost-mismatch", fetch_memo(history))


def test_a_billed_call_the_engine_never_recorded_fails():
    history = [e for e in delivered() if not (e["type"] == "billed" and e["step"] == "fetch")]
    assert_fails(run(check_cost_accounted, history), "spend-unrecorded",
                 the(history, "call", step="fetch"))


def killed(pid=102, t=1.15):
    return [nemesis(t, "kill", target="w2", pid=pid),
            process(t, "exit", "w2", pid, signal="SIGKILL")]


WASTED = call(1.12, 1.14, DOC, "fetch", W2)


@pytest.mark.parametrize("extra, cause", [
    # a call that hung: the worker gave up at its timeout
    ([dict(WASTED, outcome="hang", t_end=9.0), spend(1.2, DOC, "fetch", W2, 1, "timeout", None)],
     "timeout"),
    # the worker was SIGKILLed before it wrote anything: no spend record is owed (its
    # process is known from its claim, whose lease it then lost to nobody)
    ([job(1.105, DOC, "fetching", "fetching", W2, 2, old_token=1), WASTED] + killed(),
     "crash-before-commit"),
    # the worker's lease was taken (a later claim bumped the token) before its write
    ([job(1.105, DOC, "fetching", "fetching", W2, 2, old_token=1), WASTED,
      job(1.13, DOC, "fetching", "fetching", W1, 3, old_token=2),
      spend(1.2, DOC, "fetch", W2, 2)], "lost-lease"),
    # an answer the engine refused (schema), retried later
    ([dict(WASTED, outcome="schema"), spend(1.2, DOC, "fetch", W2, 1, "poison")], "retry"),
    # a second worker's good answer that lost to the first memo
    ([WASTED, spend(1.2, DOC, "fetch", W2, 1)], "duplicate"),
])
def test_waste_is_attributed_to_its_cause(extra, cause):
    verdict = run(check_cost_accounted, delivered() + extra)
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["waste_by_cause"] == {cause: 0.01}
    assert verdict.metrics["waste"] == pytest.approx(0.01)


def test_a_call_whose_memo_an_operator_discarded_is_waste_of_its_own():
    history = delivered() + [memo(3.0, DOC, "fetch", W1, 1, op="delete"),
                             job(3.0, DOC, "delivered", "delivered", OP, 2, old_token=1)]
    verdict = run(check_cost_accounted, history)
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["waste_by_cause"] == {"operator-discarded": 0.01}


def test_a_worker_killed_after_it_wrote_still_owes_its_spend_records():
    history = [e for e in delivered() if not (e["type"] == "billed" and e["step"] == "fetch")]
    history += killed(pid=101, t=5.0)
    assert_fails(run(check_cost_accounted, history), "spend-unrecorded",
                 the(history, "call", step="fetch"))


def test_cost_accounted_is_unknown_without_a_provider_ledger():
    assert run(check_cost_accounted, without_ledger(delivered())).status == "unknown"


def test_the_real_engine_after_a_takeover_accounts_for_every_call(store, clock, pipeline):
    """The fenced worker's memo wins (first writer), the new owner's call is duplicate waste."""
    history = zombie_finish(store, clock, pipeline)
    verdict = check_cost_accounted(history, snapshot_of(history))
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["committed"] == 0.01
    assert verdict.metrics["waste_by_cause"] == {"duplicate": 0.01}
    assert check_no_rebill_after_commit(history, snapshot_of(history)).status == "pass"
    assert check_memo_consistent(history, snapshot_of(history)).status == "pass"


def zombie_memo_race(call_start: float) -> tuple[list, dict, dict, dict]:
    """W1 holds fetch with token 1 and is fenced out by W2's claim (token 2) at 1.00; W1's
    memo commits at 1.10 (first writer wins); W2's call starts at `call_start`."""
    events = [submit(0.5, DOC), job(0.5, DOC, None, "pending", "submit", 0, op="insert"),
              job(0.6, DOC, "pending", "fetching", W1, 1, old_token=0, claims=1),
              call(0.61, 1.09, DOC, "fetch", W1),
              job(1.00, DOC, "fetching", "fetching", W2, 2, old_token=1, claims=2)]
    zombie = memo(1.10, DOC, "fetch", W1, 1)
    racing = call(call_start, call_start + 0.05, DOC, "fetch", W2)
    return events + [zombie, racing], zombie, racing, events[-1]


def test_a_call_racing_a_fenced_workers_memo_is_duplicate_spend_not_a_rebill():
    history, _, _, _ = zombie_memo_race(1.13)
    verdict = run(check_no_rebill_after_commit, history)
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["zombie_memo_races"] == 1


def test_a_call_long_after_a_fenced_workers_memo_is_a_rebill():
    history, zombie, late, claim = zombie_memo_race(1.50)
    verdict = run(check_no_rebill_after_commit, history)
    assert_fails(verdict, "rebilled-after-commit", zombie, late, claim)
    assert verdict.metrics["zombie_memo_races"] == 0


def test_a_call_the_ledger_stamps_after_its_worker_died_is_a_crash_not_unrecorded_spend():
    """The request left before the kill; the loaded provider logged it after the exit."""
    events = [submit(0.5, DOC), job(0.5, DOC, None, "pending", "submit", 0, op="insert"),
              job(0.6, DOC, "pending", "fetching", W1, 1, old_token=0, claims=1),
              process(0.70, "exit", "worker-0.1", 101, signal="SIGKILL"),
              call(0.75, 0.80, DOC, "fetch", W1)]
    verdict = run(check_cost_accounted, events)
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["calls_by_cause"] == {"crash-before-commit": 1}


def test_a_call_by_a_worker_whose_lease_was_taken_is_lost_lease_waste_not_a_rebill():
    """W1 is paused past its lease; W2 takes the job, commits fetch; W1 wakes and calls."""
    events = [submit(0.5, DOC), job(0.5, DOC, None, "pending", "submit", 0, op="insert"),
              job(0.6, DOC, "pending", "fetching", W1, 1, old_token=0, claims=1),
              job(2.0, DOC, "fetching", "fetching", W2, 2, old_token=1, claims=2),
              call(2.01, 2.05, DOC, "fetch", W2), memo(2.06, DOC, "fetch", W2, 2),
              call(3.0, 3.05, DOC, "fetch", W1)]
    verdict = run(check_no_rebill_after_commit, events)
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["zombie_calls"] == 1


def test_a_call_the_provider_stamped_late_is_judged_by_when_the_worker_began_it():
    """The worker began before the memo (its spend record says so); the ledger stamped the
    request later, when the loaded provider got to it."""
    history, _, late, _ = zombie_memo_race(1.50)
    history.append(spend(1.56, DOC, "fetch", W2, 2, started=1.05))
    verdict = run(check_no_rebill_after_commit, history)
    assert verdict.status == "pass", verdict.reason


# -- cost-accounted: a good answer is not given up while its lease holds ---------------------

SLACK = {"finish_retry_slack": 0.5}


def locked_out(spend_t: float, *, renewed_to: float | None = None) -> list:
    """W2 claims doc-1 at 1.0 (lease to 3.0), gets a good answer at 1.05 and, kept out by the
    write lock, records only its spend at `spend_t`; W1 takes the job over at 3.1."""
    events = [submit(0.5, DOC), job(0.5, DOC, None, "pending", "submit", 0, op="insert"),
              job(1.0, DOC, "pending", "fetching", W2, 1, old_token=0, claims=1,
                  lease_until=3.0),
              call(1.01, 1.05, DOC, "fetch", W2)]
    if renewed_to is not None:
        events.append(job(1.03, DOC, "fetching", "fetching", W2, 1, claims=1,
                          lease_until=renewed_to) | {"heartbeat": True})
    events += [spend(spend_t, DOC, "fetch", W2, 1, started=1.01),
               job(max(3.1, spend_t + 0.1), DOC, "fetching", "fetching", W1, 2, old_token=1,
                   claims=2, lease_until=5.1),
               call(3.11, 3.15, DOC, "fetch", W1), memo(3.16, DOC, "fetch", W1, 2),
               spend(3.16, DOC, "fetch", W1, 2, started=3.11),
               job(3.16, DOC, "fetching", "fetched", W1, 2)]
    return events


def settings(**extra):
    return {"settings": {**snapshot()["settings"], **SLACK, **extra}}


def test_a_good_answer_given_up_while_its_lease_held_fails():
    history = locked_out(1.6)
    assert_fails(run(check_cost_accounted, history, **settings()), "result-discarded",
                 the(history, "call", worker=W2), the(history, "spend", worker=W2),
                 the(history, "job", writer=W2))


def test_a_good_answer_given_up_when_its_lease_ran_out_is_waste_not_a_failure():
    verdict = run(check_cost_accounted, locked_out(2.6), **settings())
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["calls_by_cause"] == {"duplicate": 1}


def test_the_lease_a_renewal_extended_is_the_one_to_keep_trying_for():
    history = locked_out(2.6, renewed_to=4.0)
    assert_fails(run(check_cost_accounted, history, **settings()), "result-discarded",
                 the(history, "call", worker=W2), the(history, "spend", worker=W2),
                 the(history, "job", writer=W2, heartbeat=None))


def test_giving_up_early_is_not_judged_for_an_engine_that_promises_nothing_about_it():
    assert run(check_cost_accounted, locked_out(1.6)).status == "pass"


def test_an_answer_that_came_after_the_call_timeout_may_be_given_up():
    history = [dict(e, t_end=2.2) if e["type"] == "call" and e["worker"] == W2 else e
               for e in locked_out(1.6)]
    assert run(check_cost_accounted, history, **settings()).status == "pass"


def test_a_worker_that_gave_up_its_write_and_went_on_still_owes_the_spend_record():
    history = [e for e in locked_out(2.6) if not (e["type"] == "billed" and e["worker"] == W2)]
    history += [submit(3.5, "doc-2"), job(3.5, "doc-2", None, "pending", "submit", 0, op="insert"),
                job(3.6, "doc-2", "pending", "fetching", W2, 1, old_token=0, claims=1,
                    lease_until=5.6),
                process(9.0, "exit", "w2", 102, signal="SIGKILL")]
    assert_fails(run(check_cost_accounted, history), "spend-unrecorded",
                 the(history, "call", worker=W2))


# -- cost-accounted: a spend record says what the provider did --------------------------------

def refused_then_recorded(outcome, cost, status=503, t_end=1.13, billed=0.0, t_write=None):
    """W2 claims doc-1 at 1.1 and its fetch call is answered `status` at `t_end`; W2 records
    the spend (`outcome`, `cost`) with its failure (at `t_write`, default just after), and W1
    delivers the job later."""
    t_write = t_end + 0.01 if t_write is None else t_write
    return delivered_job(DOC, t0=5.0) + [
        job(1.1, DOC, "pending", "fetching", W2, 1, old_token=0, claims=1, lease_until=3.1),
        call(1.11, t_end, DOC, "fetch", W2, status=status, billed=billed,
             outcome={200: "schema", None: "reset"}.get(status, "error")),
        spend(t_write, DOC, "fetch", W2, 1, outcome=outcome, cost=cost, started=1.11),
        job(t_write, DOC, "fetching", "pending", W2, 1, attempts=1,
            next_run_at=t_write + 0.5, last_error="fetch: RetryableError")]


@pytest.mark.parametrize("outcome, cost, status, t_end, billed, kind", [
    ("retryable", None, 503, 1.13, 0.0, None),
    ("timeout", None, 503, 1.13, 0.0, "spend-outcome-mismatch"),   # a 503 at once is no timeout
    ("timeout", None, 503, 2.0, 0.0, None),      # an answer near the deadline: it may have been
    ("timeout", None, None, 1.13, 0.0, "spend-outcome-mismatch"),  # a reset at once neither
    ("poison", 0.01, 200, 1.13, 0.01, None),     # the answer failed the step's schema
    ("poison", None, 200, 1.13, 0.01, "spend-cost-mismatch"),     # ... and its cost was dropped
], ids=["retryable", "timeout-for-an-instant-503", "timeout-near-the-deadline",
        "timeout-for-an-instant-reset", "schema-with-its-cost", "schema-without-its-cost"])
def test_a_spend_record_says_what_the_provider_did(outcome, cost, status, t_end, billed, kind):
    history = refused_then_recorded(outcome, cost, status, t_end, billed)
    verdict = run(check_cost_accounted, history, clock="virtual")
    if kind is None:
        assert kind not in verdict.by_type and verdict.status == "pass", verdict.reason
    else:
        assert_fails(verdict, kind, the(history, "call", worker=W2),
                     the(history, "spend", worker=W2))


def test_a_timeout_recorded_by_a_client_the_harness_froze_is_not_a_mismatch():
    # The 503 came at once, but W2 was paused from 1.12 until past its 1 s call timeout:
    # resumed, its client found the deadline gone and recorded a timeout.
    history = refused_then_recorded("timeout", None, 503, 1.13, 0.0, t_write=2.5)
    frozen = [nemesis(1.12, "pause", pid=102, target="w2"),
              nemesis(2.4, "resume", pid=102, target="w2")]
    verdict = run(check_cost_accounted, history + frozen, clock="virtual")
    assert "spend-outcome-mismatch" not in verdict.by_type, verdict.reason
    short = [nemesis(1.12, "pause", pid=102, target="w2"),
             nemesis(1.2, "resume", pid=102, target="w2")]  # resumed well before the deadline
    assert "spend-outcome-mismatch" in run(check_cost_accounted, history + short,
                                           clock="virtual").by_type


def test_an_operators_memo_delete_naming_a_worker_is_not_that_worker_living_on():
    """sim everything seed 19, a false alarm: W2's call hung, W2 was paused and then killed
    before it wrote; meanwhile an operator's resolve deleted a memo W2 had written for another
    job, and the delete names W2 as the memo's writer. W2 owed no spend record."""
    history = delivered_job(DOC, t0=5.0) + [
        job(1.1, DOC, "pending", "fetching", W2, 1, old_token=0, claims=1, lease_until=3.1),
        call(1.11, 4.0, DOC, "fetch", W2, outcome="hang", fault="hang"),
        memo(2.0, "doc-2", "verify", W2, 1, op="delete"),
        process(2.5, "exit", "w2", 102, signal="SIGKILL")]
    verdict = run(check_cost_accounted, history)
    assert "spend-unrecorded" not in verdict.by_type, verdict.reason
