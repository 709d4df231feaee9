"""A memo is committed when its transaction commits, not when its statement ran: a store
stamps each statement, and on PostgreSQL other workers go on writing while a transaction is
open (a process the harness paused mid-transaction keeps it open until it resumes). Calls a
new owner makes before the memo committed are no re-bill and no memo hit; calls after it
still fail."""
from __future__ import annotations

import pytest
from builders import W1, W2, call, job, memo, nemesis, snapshot_of, spend

from chaos.checkers.billing import check_memo_consistent, check_no_rebill_after_commit
from chaos.history import merge

DOC = "doc-1"


def run(check, history):
    history = merge(history)
    return check(history, snapshot_of(history))


def zombie_memo(pause: bool, call_at: float, claim_at: float = 2.5):
    """W1 claims DOC at 1.0 (lease to 1.5) and calls; its finishing transaction writes the
    memo at 2.0 and its spend at 2.002, (`pause`) stopped at 2.001 until 4.0 in between;
    W2 claims DOC at `claim_at` (W1's lease long over) and calls at `call_at`."""
    history = [job(1.0, DOC, "pending", "fetching", W1, 1, old_token=0, claims=1,
                   lease_until=1.5),
               call(1.1, 1.9, DOC, "fetch", W1),
               memo(2.0, DOC, "fetch", W1, 1), spend(2.002, DOC, "fetch", W1, 1, started=1.1),
               job(claim_at, DOC, "fetching", "fetching", W2, 2, old_token=1, claims=2,
                   lease_until=claim_at + 2.0),
               call(call_at, call_at + 0.1, DOC, "fetch", W2)]
    if pause:
        history += [nemesis(2.001, "pause", pid=101), nemesis(4.0, "resume", pid=101)]
    return history


@pytest.mark.parametrize("check", [check_no_rebill_after_commit, check_memo_consistent])
def test_a_memo_whose_writer_was_paused_mid_transaction_is_not_seen_until_it_resumed(check):
    verdict = run(check, zombie_memo(pause=True, call_at=2.6))
    assert verdict.status != "fail", verdict.failures


@pytest.mark.parametrize("check, kind", [(check_no_rebill_after_commit, "rebilled-after-commit"),
                                         (check_memo_consistent, "memo-hit-called")])
def test_without_the_pause_the_memo_was_committed_and_the_call_fails(check, kind):
    verdict = run(check, zombie_memo(pause=False, call_at=2.6))
    assert kind in verdict.by_type, verdict.reason


@pytest.mark.parametrize("check, kind", [(check_no_rebill_after_commit, "rebilled-after-commit"),
                                         (check_memo_consistent, "memo-hit-called")])
def test_a_call_after_the_paused_writer_resumed_and_committed_still_fails(check, kind):
    # a claim before the commit and a call after it re-bills; a claim after it holds the memo
    history = zombie_memo(pause=True, call_at=4.3, claim_at=2.5 if kind.startswith("re")
                          else 4.2)
    verdict = run(check, history)
    assert kind in verdict.by_type, verdict.reason


def test_a_claim_between_the_memo_statement_and_its_transactions_end_saw_no_memo():
    """The memo's statement at 2.0, W2's claim at 2.001, W1's spend (same transaction) at
    2.002: the claim could not see the memo, so its call is no memo hit."""
    history = [job(1.0, DOC, "pending", "fetching", W1, 1, old_token=0, claims=1,
                   lease_until=1.5),
               call(1.1, 1.9, DOC, "fetch", W1), memo(2.0, DOC, "fetch", W1, 1),
               job(2.001, DOC, "fetching", "fetching", W2, 2, old_token=1, claims=2,
                   lease_until=4.0),
               spend(2.002, DOC, "fetch", W1, 1, started=1.1),
               call(2.003, 2.1, DOC, "fetch", W2)]
    verdict = run(check_memo_consistent, history)
    assert "memo-hit-called" not in verdict.by_type, verdict.failures


@pytest.mark.parametrize("claim_at, caught", [(2.02, False), (2.2, True)],
                         ids=["claimed-inside-the-transaction", "claimed-after-it"])
def test_a_memo_whose_transaction_a_claim_fenced_out_was_not_seen_by_that_claim(claim_at,
                                                                                 caught):
    """W1's finishing transaction writes the memo at 2.0 and its spend at 2.001, then its
    write of the job finds the token changed: W2's claim had locked the row first, so W1's
    transaction committed after the claim (PostgreSQL stamps each statement, not the commit).
    A claim well after W1's last statement saw the memo committed."""
    history = [job(1.0, DOC, "pending", "fetching", W1, 1, old_token=0, claims=1,
                   lease_until=1.5),
               call(1.1, 1.9, DOC, "fetch", W1), memo(2.0, DOC, "fetch", W1, 1),
               spend(2.001, DOC, "fetch", W1, 1, started=1.1),
               job(claim_at, DOC, "fetching", "fetching", W2, 2, old_token=1, claims=2,
                   lease_until=claim_at + 2.0),
               call(claim_at + 0.01, claim_at + 0.1, DOC, "fetch", W2)]
    verdict = run(check_memo_consistent, history)
    assert ("memo-hit-called" in verdict.by_type) is caught, verdict.failures


@pytest.mark.parametrize("call_at, kind", [(2.033, None), (2.3, "rebilled-after-commit")],
                         ids=["a-race-the-engine-loses", "a-re-bill"])
def test_the_fencing_claims_call_just_after_such_a_memo_committed_is_a_race_not_a_rebill(
        call_at, kind):
    """The memo of W1's fenced-out transaction committed just after W2's claim of 2.02: a
    call W2 began 13 ms later could not have seen it (zombie_memo_races); one 0.28 s later
    is a re-bill."""
    history = [job(1.0, DOC, "pending", "fetching", W1, 1, old_token=0, claims=1,
                   lease_until=1.5),
               call(1.1, 1.9, DOC, "fetch", W1), memo(2.0, DOC, "fetch", W1, 1),
               spend(2.001, DOC, "fetch", W1, 1, started=1.1),
               job(2.02, DOC, "fetching", "fetching", W2, 2, old_token=1, claims=2,
                   lease_until=4.0),
               call(call_at, call_at + 0.1, DOC, "fetch", W2)]
    verdict = run(check_no_rebill_after_commit, history)
    if kind is None:
        assert verdict.status == "pass" and verdict.metrics["zombie_memo_races"] == 1, \
            verdict.failures
    else:
        assert kind in verdict.by_type, verdict.reason
