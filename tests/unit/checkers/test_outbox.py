"""The outbox checkers on hand-made histories: outbox-bounded (a resend only after an ambiguous
outcome, one applied effect per job and kind) and effects-complete (every delivered job's
effects applied at the receiver, or dead-lettered)."""
from __future__ import annotations

import pytest
from builders import (S1, delivered_job, delivered_with_effects, outbox, process, request,
                      sent_effect, snapshot_with_effects)

from chaos.checkers.outbox import check_effects_complete, check_outbox_bounded

S2 = "sender:host:202:dddd"


def charge_only(job_id="doc-1", t0=1.0):
    """A delivered job whose notify effect went out cleanly; the charge is left to the test."""
    events = delivered_job(job_id, t0)
    return events + sent_effect(t0 + 0.7, job_id, "notify", 2)


def bounded(history, **overrides):
    return check_outbox_bounded(history, snapshot_with_effects(history, **overrides))


def complete(history, **overrides):
    return check_effects_complete(history, snapshot_with_effects(history, **overrides))


def test_clean_runs_pass_both_checks_with_a_duplicate_histogram():
    history = delivered_with_effects("doc-1") + delivered_with_effects("doc-2", t0=3.0)
    for verdict in (bounded(history), complete(history)):
        assert verdict.status == "pass", verdict.reason
        assert verdict.checked == 4
    metrics = bounded(history).metrics
    assert metrics["duplicates"] == {"charge": {1: 2}, "notify": {1: 2}}
    assert metrics["replays"] == 0 and metrics["ambiguous"] == {}


# -- outbox-bounded ----------------------------------------------------------------------

def test_a_resend_after_a_clean_marked_answer_is_too_many_attempts():
    history = charge_only() + sent_effect(2.0, "doc-1", "charge", 1)
    history += sent_effect(2.5, "doc-1", "charge", 1, sender=S2, token=2, status=200,
                           outcome="replayed", applied=False)
    verdict = bounded(history)
    assert verdict.status == "fail"
    assert verdict.by_type == {"too-many-attempts": 1}
    requests = [e for e in history if e["src"] == "receiver" and e["kind"] == "charge"]
    assert verdict.failures[0].events == requests
    assert "2 receiver requests but only 0 ambiguous" in verdict.failures[0].message


def test_a_replay_under_the_same_key_after_a_dropped_answer_is_allowed():
    history = charge_only() + sent_effect(2.0, "doc-1", "charge", 1, status=None,
                                          outcome="dropped", mark=False)
    history += sent_effect(2.5, "doc-1", "charge", 1, sender=S2, token=2, status=200,
                           outcome="replayed", applied=False)
    verdict = bounded(history)
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["replays"] == 1
    assert verdict.metrics["ambiguous"] == {"answer": 1}
    assert verdict.metrics["duplicates"]["charge"] == {2: 1}


@pytest.mark.parametrize("fault", ["timeout", None])
def test_an_answer_the_sender_had_given_up_on_is_ambiguous_even_when_ledgered_as_a_replay(fault):
    # The first request is held past the sender's timeout; the resend applies meanwhile, so
    # the first one, answered last, is ledgered as a plain 200 replay.
    history = charge_only() + sent_effect(2.0, "doc-1", "charge", 1, mark=False)
    first = history[-1]
    first.update(status=200, outcome="replayed", applied=False, t_end=3.5, fault=fault)
    history += sent_effect(3.0, "doc-1", "charge", 1, token=2)
    verdict = bounded(sorted(history, key=lambda e: e["t"]))
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["ambiguous"] == {"answer": 1}


def test_an_effect_applied_twice_without_a_key_is_a_violation_even_when_the_resend_was_allowed():
    history = charge_only() + sent_effect(2.0, "doc-1", "charge", 1, key=None, status=None,
                                          outcome="dropped", mark=False)
    history += sent_effect(2.5, "doc-1", "charge", 1, key=None, sender=S2, token=2)
    verdict = bounded(history)
    assert verdict.by_type == {"applied-twice": 1}
    applied = [e for e in history if e["src"] == "receiver" and e["kind"] == "charge"]
    assert verdict.failures[0].events == applied
    assert "applied 2 times" in verdict.failures[0].message


def test_the_receivers_applied_list_counts_too():
    history = delivered_with_effects("doc-1")
    snap = snapshot_with_effects(history)
    snap["receiver_applied"].append({**snap["receiver_applied"][0], "id": "eff_9"})
    assert check_outbox_bounded(history, snap).by_type == {"applied-twice": 1}


def killed_sender_history(kill_at, moved_on=False):
    """S1 sends the charge (201) but never marks it; S2 resends it (replayed) at +3.0 s,
    before S1's outbox lease ran out, so only a kill of S1 can excuse the resend."""
    history = charge_only() + sent_effect(2.0, "doc-1", "charge", 1, mark=False,
                                          lease_until=3.5)
    if kill_at is not None:
        history.append(process(kill_at, "exit", "sender-1", 201, role="sender", signal="SIGKILL"))
    if moved_on:  # S1 sent another row before it died: it had lived past this one's mark
        history.append(request(2.5, 2.51, "doc-9", "charge", worker=S1))
    history += sent_effect(3.0, "doc-1", "charge", 1, sender=S2, token=2, status=200,
                           outcome="replayed", applied=False)
    return sorted(history, key=lambda e: e["t"])


def test_a_sender_killed_between_send_and_mark_allows_the_second_attempt():
    verdict = bounded(killed_sender_history(kill_at=2.025))
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["ambiguous"] == {"sender-killed": 1}


@pytest.mark.parametrize("kill_at, moved_on", [(None, False), (2.8, True)],
                         ids=["not-killed", "killed-after-its-next-send"])
def test_an_unmarked_clean_send_without_a_kill_before_the_next_send_allows_no_resend(
        kill_at, moved_on):
    verdict = bounded(killed_sender_history(kill_at, moved_on))
    assert verdict.by_type == {"too-many-attempts": 1}
    assert "0 ambiguous" in verdict.failures[0].message


@pytest.mark.parametrize("takeover_at, status", [(3.0, "pass"), (2.2, "fail")])
def test_a_takeover_excuses_a_resend_only_after_the_first_lease_ran_out(takeover_at, status):
    history = charge_only() + sent_effect(2.0, "doc-1", "charge", 1, mark=False,
                                          lease_until=2.5)
    history += sent_effect(takeover_at, "doc-1", "charge", 1, sender=S2, token=2, status=200,
                           outcome="replayed", applied=False)
    verdict = bounded(sorted(history, key=lambda e: e["t"]))
    assert verdict.status == status
    if status == "pass":
        assert verdict.metrics["ambiguous"] == {"lease-taken": 1}


def harness_cut(t: float, lease_until: float) -> dict:
    """The harness's lease_expiry fault on the outbox row, as an observer reports it."""
    return {"t": t, "src": "engine", "type": "effect_state", "row": 1, "job": "doc-1",
            "kind": "charge", "actor": "harness", "worker": None, "pid": None, "token": None,
            "completion": "ok", "attempts": 1, "sent_at": None, "dead_at": None,
            "last_error": None, "lease_until": lease_until}


@pytest.mark.parametrize("cut, status", [((2.1, 2.099), "pass"), ((2.1, 2.6), "fail"),
                                          ((1.9, 1.899), "fail")],
                         ids=["cut-before-the-takeover", "extended-not-cut",
                              "cut-before-the-claim"])
def test_a_lease_the_harness_cut_short_excuses_the_resend_of_the_sender_that_lost_it(
        cut, status):
    history = charge_only() + sent_effect(2.0, "doc-1", "charge", 1, mark=False,
                                          lease_until=2.5) + [harness_cut(*cut)]
    history += sent_effect(2.2, "doc-1", "charge", 1, sender=S2, token=2, status=200,
                           outcome="replayed", applied=False)
    verdict = bounded(sorted(history, key=lambda e: e["t"]))
    assert verdict.status == status, verdict.reason
    if status == "pass":
        assert verdict.metrics["ambiguous"] == {"lease-taken": 1}


@pytest.mark.parametrize("late_at, status", [(3.0, "pass"), (2.4, "fail")],
                         ids=["after-its-lease", "inside-its-lease"])
def test_a_send_made_after_the_senders_own_lease_ran_out_is_the_lapses(late_at, status):
    """Sim `everything` seed 5, a false alarm: S1 claimed the row (lease to 2.5) and was
    paused before it sent; S2 took the row, sent and marked it; S1 woke at +3.0 s and sent
    (replayed). Both answers were clean, but S1 sent with no lease left to send under."""
    claim = outbox(1.5, 1, "doc-1", "charge", S1, 1, old_token=0, attempts=1,
                   lease_until=2.5)
    history = charge_only() + [claim]
    history += sent_effect(2.6 if status == "pass" else 2.0, "doc-1", "charge", 1,
                           sender=S2, token=2, lease_until=4.0)
    history.append(request(late_at, late_at + 0.01, "doc-1", "charge", worker=S1, n=2,
                           status=200, outcome="replayed", applied=False))
    verdict = bounded(sorted(history, key=lambda e: e["t"]))
    assert verdict.status == status, verdict.reason
    if status == "pass":
        assert verdict.metrics["ambiguous"] == {"lease-lapsed": 1}


def test_a_mark_sent_under_a_later_claim_does_not_make_an_earlier_send_clean():
    """Sim `everything` seed 31, a false alarm: S1 claimed the row, the harness cut its
    lease, S2 claimed it; S1 sent anyway (201), S2's send timed out, and S1, claiming the
    row again later, resent and marked it. S1's first send was after its lease ended: its
    mark came under its next claim, not this one."""
    history = charge_only() + [
        outbox(2.0, 1, "doc-1", "charge", S1, 1, old_token=0, attempts=1, lease_until=3.5),
        harness_cut(2.01, 2.009)]
    history += sent_effect(2.02, "doc-1", "charge", 1, sender=S2, token=2, lease_until=3.5,
                           status=200, outcome="replayed", applied=False, mark=False)
    history[-1]["fault"] = "timeout"
    history.append(request(2.025, 2.03, "doc-1", "charge", worker=S1, n=1))
    history += sent_effect(3.0, "doc-1", "charge", 1, sender=S1, token=3, status=200,
                           outcome="replayed", applied=False)
    verdict = bounded(sorted(history, key=lambda e: e["t"]))
    assert verdict.status == "pass", verdict.reason
    ambiguous = verdict.metrics["ambiguous"]
    assert ambiguous.pop("answer") == 1 and sum(ambiguous.values()) == 1, ambiguous


def test_a_retry_after_an_error_status_is_allowed():
    history = charge_only() + sent_effect(2.0, "doc-1", "charge", 1, status=503,
                                          outcome="error", applied=False, mark=False)
    history += sent_effect(2.5, "doc-1", "charge", 1, token=2)
    assert bounded(history).status == "pass"


def test_sent_rows_without_any_receiver_ledger_are_unknown():
    history = [e for e in delivered_with_effects("doc-1") if e["src"] != "receiver"]
    snap = snapshot_with_effects(history, receiver_applied=[])
    assert check_outbox_bounded(history, snap).status == "unknown"
    assert check_effects_complete(history, snap).status == "unknown"


# -- effects-complete --------------------------------------------------------------------

def test_a_delivered_job_whose_effects_never_went_out_fails():
    history = delivered_job("doc-1")
    verdict = complete(history)
    assert verdict.by_type == {"not-applied": 2}
    inserts = [e for e in history if e["src"] == "engine" and e["type"].startswith("effect_")]
    assert [f.events for f in verdict.failures] == [[inserts[0]], [inserts[1]]]


def test_a_row_marked_sent_that_the_receiver_never_applied_fails():
    history = charge_only() + sent_effect(2.0, "doc-1", "charge", 1, status=503,
                                          outcome="error", applied=False)
    verdict = complete(history)
    assert verdict.by_type == {"marked-sent-not-applied": 1}
    mark, req = history[-1], history[-2]
    assert verdict.failures[0].events == [mark, req]
    assert "marked sent by sender:host:201:cccc" in verdict.failures[0].message


def test_a_dead_lettered_effect_is_allowed_and_counted():
    history = charge_only() + sent_effect(2.0, "doc-1", "charge", 1, status=503,
                                          outcome="error", applied=False, mark=False)
    history.append(outbox(2.1, 1, "doc-1", "charge", S1, 2, old_token=1, attempts=6,
                          dead_at=2.1, last_error="dead-lettered after 6 attempts"))
    verdict = complete(history)
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["dead_lettered"] == 1


@pytest.mark.parametrize("attempts, status, verdict_", [
    (2, 503, "fail"), (2, None, "fail"), (2, 422, "pass"), (6, 503, "pass")],
    ids=["5xx-before-the-cap", "timeout-before-the-cap", "refused-for-good", "at-the-cap"])
def test_a_row_is_dead_lettered_only_for_good_or_at_the_cap(attempts, status, verdict_):
    history = charge_only() + sent_effect(2.0, "doc-1", "charge", 1, status=status,
                                          outcome="error", applied=False, mark=False)
    history.append(outbox(2.1, 1, "doc-1", "charge", S1, 2, old_token=1, attempts=attempts,
                          dead_at=2.1, last_error="dead-lettered"))
    verdict = complete(history)
    assert verdict.status == verdict_, verdict.reason
    if verdict_ == "fail":
        assert verdict.by_type == {"dead-lettered-early": 1}
        assert f"after {attempts} attempt(s) of 6" in verdict.failures[0].message


@pytest.mark.parametrize("dropped, what", [({"charge", "notify"}, "no outbox row"),
                                            ({"notify"}, "no notify row")])
def test_a_delivered_job_without_its_outbox_rows_fails(dropped, what):
    history = [e for e in delivered_with_effects("doc-1") if e.get("kind") not in dropped]
    verdict = complete(history)
    assert verdict.by_type == {"no-outbox-rows": 1}
    assert verdict.failures[0].events == [next(e for e in history if e.get("to") == "delivered")]
    assert what in verdict.failures[0].message


def test_an_unfinished_drain_is_still_judged_and_says_so():
    history = delivered_job("doc-1")
    snap = snapshot_with_effects(history)
    snap["phases"]["drained"] = False
    verdict = check_effects_complete(history, snap)
    assert verdict.status == "fail"
    assert "drain did not finish" in verdict.reason


@pytest.mark.parametrize("release_at, status", [(4.0, "pass"), (2.1, "fail")],
                         ids=["its-lease-ran-out-first", "within-its-lease"])
def test_a_clean_send_the_sender_could_not_mark_before_its_lease_ran_out_allows_a_resend(
        release_at, status):
    """Real everything seed 6 under load, a false alarm: a sender paused between its send
    (201 applied) and its mark, resumed after its lease ran out, could not mark the row,
    let it go and sent it again (200 replayed)."""
    history = charge_only() + sent_effect(2.0, "doc-1", "charge", 1, lease_until=3.0,
                                          mark=False)
    history.append(outbox(release_at, 1, "doc-1", "charge", S1, 1, attempts=1,
                          lease_until=0.0))
    history += sent_effect(release_at + 0.1, "doc-1", "charge", 1, token=2, status=200,
                           outcome="replayed", applied=False)
    verdict = bounded(sorted(history, key=lambda e: e["t"]))
    assert verdict.status == status, verdict.reason
    if status == "pass":
        assert verdict.metrics["ambiguous"] == {"lease-lapsed": 1}


@pytest.mark.parametrize("clock, status", [(None, "pass"), ("virtual", "fail")],
                         ids=["real-processes", "simulation"])
def test_a_clean_answer_its_sender_recorded_as_failed_near_its_deadline_allows_a_resend(
        clock, status):
    """Real everything seed 5 on a machine at load 10, a false alarm: the receiver applied
    the charge 0.21 s after the sender's claim, the sender (send timeout 0.6 s) read it past
    its deadline, recorded a failure and sent again (200 replayed). Between real processes
    the machine's slack (1 s) may have held the answer back that long; in the simulation's
    0.15 s it cannot have."""
    history = charge_only() + sent_effect(2.0, "doc-1", "charge", 1, mark=False)
    history.append(outbox(2.7, 1, "doc-1", "charge", S1, 1, attempts=1, lease_until=0.0,
                          last_error="charge: CallTimeout"))
    history += sent_effect(3.0, "doc-1", "charge", 1, token=2, status=200,
                           outcome="replayed", applied=False)
    settings = {"send_timeout": 0.6, "outbox_lease": 2.0, "outbox_max_attempts": 6}
    overrides = {"settings": settings} | ({"clock": clock} if clock else {})
    verdict = bounded(sorted(history, key=lambda e: e["t"]), **overrides)
    assert verdict.status == status, verdict.reason
