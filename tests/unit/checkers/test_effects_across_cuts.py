"""Effects across a power cut, on hand-made histories. effects-complete on an idempotency key
shared by two effects: a request for one effect under a key the receiver had applied for
another applies nothing (replayed or conflict), and the witness names the power cut that
took back the first effect's sent mark. outbox-bounded: a resend is allowed once a cut took
the effect's sent mark back, and only then. fenced-writes: a call made under a claim a cut
took back is not a call without a lease."""
from __future__ import annotations

from builders import (W1, call, delivered_job, delivered_with_effects, nemesis, sent_effect,
                      snapshot_of, snapshot_with_effects)

from chaos.checkers.leases import check_fenced_writes
from chaos.checkers.outbox import check_effects_complete, check_outbox_bounded
from chaos.history import merge

DOC = "doc-1"


def cut(t, n, lost_sent):
    return nemesis(t, "power_loss", cut=n, lost_count=7, lost_sent=lost_sent,
                   durability_promised=False)


def two_jobs(second_key, second_status=422, second_outcome="conflict"):
    """doc-1's charge applied under `outbox:1`; a cut takes its sent mark back; doc-2's
    charge then goes under `second_key`."""
    history = delivered_job("doc-1") + sent_effect(1.6, "doc-1", "charge", 1, key="outbox:1")
    history += sent_effect(1.7, "doc-1", "notify", 2, key="outbox:2")
    history.append(cut(2.0, 1, [["doc-1", "charge"]]))
    history += delivered_job("doc-2", t0=3.0)
    history += sent_effect(3.6, "doc-2", "charge", 1, key=second_key, status=second_status,
                           outcome=second_outcome, applied=second_outcome == "applied",
                           mark=second_outcome != "conflict")
    history += sent_effect(3.7, "doc-2", "notify", 2, key="doc-2:notify")
    return history


def test_a_key_applied_for_another_effect_fails_naming_the_cut():
    history = two_jobs("outbox:1")
    verdict = check_effects_complete(history, snapshot_with_effects(history))
    assert verdict.status == "fail"
    assert verdict.by_type.get("key-of-another-effect") == 1
    message = verdict.failures[0].message
    assert "job doc-2 'charge'" in message and "'outbox:1'" in message
    assert "applied for job doc-1 'charge'" in message and "422 conflict" in message
    assert "after power cut 1 at" in message and "doc-1 'charge''s sent mark" in message
    request, first, power_cut = verdict.failures[0].events
    assert (request["job"], first["job"], power_cut["type"]) == ("doc-2", "doc-1", "power_loss")


def test_a_replayed_answer_for_another_effect_fails_too():
    history = two_jobs("outbox:1", 200, "replayed")
    verdict = check_effects_complete(history, snapshot_with_effects(history))
    assert "key-of-another-effect" in verdict.by_type
    assert "200 replayed" in verdict.failures[0].message


def test_keys_that_name_their_effect_pass_across_the_cut():
    # the same effect sent again under its own key after the cut: replayed, and applied once
    history = two_jobs("doc-2:charge", 201, "applied")
    history += sent_effect(2.5, "doc-1", "charge", 1, key="outbox:1", token=2, status=200,
                           outcome="replayed", applied=False)
    verdict = check_effects_complete(history, snapshot_with_effects(history))
    assert verdict.status == "pass", verdict.reason


# -- outbox-bounded across a cut ---------------------------------------------------------------

def resent_after(lost_sent):
    """doc-1's charge sent cleanly and marked, then (a cut at 2.0) sent again under its key."""
    history = delivered_with_effects("doc-1")
    history.append(cut(2.0, 1, lost_sent))
    history += sent_effect(2.5, "doc-1", "charge", 1, token=2, status=200, outcome="replayed",
                           applied=False)
    return history


def test_a_resend_after_a_cut_took_back_the_sent_mark_is_allowed():
    history = resent_after([["doc-1", "charge"]])
    verdict = check_outbox_bounded(history, snapshot_with_effects(history))
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["ambiguous"] == {"power-cut": 1}


def test_a_cut_that_kept_the_sent_mark_excuses_no_resend():
    history = resent_after([["doc-1", "notify"]])
    verdict = check_outbox_bounded(history, snapshot_with_effects(history))
    assert verdict.by_type == {"too-many-attempts": 1}


# -- fenced-writes across a cut ----------------------------------------------------------------

def call_of_a_lost_claim(lost_claims):
    """W1's claim of DOC's fetch is gone from the store (the audit shows none); it called
    the provider at 1.1; a cut at 1.5 lists the claims it took back."""
    made = {**call(1.1, 1.2, DOC, "fetch", W1), "pid": 101}  # tied to W1's process
    return [made, nemesis(1.5, "power_loss", cut=1, lost_count=1, lost_claims=lost_claims)]


def test_a_call_under_a_claim_a_cut_took_back_is_not_a_call_without_lease():
    history = merge(call_of_a_lost_claim([[DOC, W1]]))
    verdict = check_fenced_writes(history, snapshot_of(history))
    assert "call-without-lease" not in verdict.by_type, verdict.reason
    assert verdict.metrics["calls_judged"] == 1
    history = merge(call_of_a_lost_claim([[DOC, "worker:host:999:ffff"]]))  # another's
    verdict = check_fenced_writes(history, snapshot_of(history))
    assert verdict.by_type.get("call-without-lease") == 1
