"""deadlines-kept: a client that gives up by its deadline passes; one whose own spend record
outlasts it, or that waits a hung call or a late receiver out and uses the answer, fails
citing the call; a late failure write and a write the harness held back are not judged; a
run where nothing ran past a deadline is unknown. The time the client's own process was
frozen by the harness or stalled during the call is not held against it: it excuses an
answer that came within it, and no more (another process's pause excuses nothing)."""
from __future__ import annotations

import pytest
from builders import S1, W1, call, job, memo, nemesis, outbox, request, snapshot_of, spend

from chaos.checkers.deadlines import check_deadlines_kept
from chaos.history import merge

DOC = "doc-1"
HUNG = call(1.0, 2.3, DOC, "fetch", W1, outcome="hang", fault="hang")  # call timeout 1.0 s


def run(history):
    history = merge(history)
    return check_deadlines_kept(history, snapshot_of(history))


def attempt(write_at: float, completed: bool = False) -> list[dict]:
    """W1 claims DOC, its fetch hangs at the fake until 2.3, and it writes the failure (or,
    having waited for the answer, the step's memo and completion)."""
    claim = job(0.99, DOC, "pending", "fetching", W1, 1, old_token=0, claims=1, lease_until=3.0)
    if completed:
        return [claim, HUNG, memo(write_at, DOC, "fetch", W1, 1),
                job(write_at, DOC, "fetching", "fetched", W1, 1)]
    return [claim, HUNG, job(write_at, DOC, "fetching", "pending", W1, 1, attempts=1,
                             next_run_at=write_at + 0.1, last_error="timeout")]


def test_a_worker_that_gives_up_at_its_call_timeout_passes():
    verdict = run(attempt(2.05))
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["overran_calls"] == 1


def test_a_worker_that_waits_a_hung_call_out_and_uses_the_answer_fails():
    verdict = run(attempt(2.35, completed=True))
    assert verdict.by_type == {"waited-past-deadline": 1}
    assert verdict.failures[0].events[0] == HUNG
    assert "1 s deadline" in verdict.failures[0].message


def test_a_late_answer_whose_client_had_gone_is_not_judged_used():
    # The fake found the client gone when its answer was ready ("info"): it did not wait,
    # whoever writes the step's completion under its worker id afterwards.
    history = attempt(2.35, completed=True)
    history[1] = {**HUNG, "completion": "info"}
    assert run(history).status == "pass"


def test_a_slot_workers_completion_after_its_callers_death_is_a_successors():
    # Worker ids that name a slot: process 101 called and was killed; 111, under the same
    # id, completed the step later. The dead caller waited for nothing.
    history = attempt(2.35, completed=True)
    history[1] = {**HUNG, "pid": 101}
    died = {"t": 1.5, "src": "process", "type": "exit", "name": "worker-0.0", "role": "worker",
            "pid": 101, "code": None, "signal": "SIGKILL", "killed": True}
    history[2] = {**history[2], "pid": 111}
    assert run(history + [died]).status == "pass"
    assert run(history).by_type == {"waited-past-deadline": 1}  # the caller lived on: it did


def test_a_failure_written_late_is_not_judged():
    assert run(attempt(2.35)).status == "pass"  # a stall or a lock after giving up


def test_a_write_the_harness_held_back_is_not_judged():
    held = [nemesis(1.9, "contention", seconds=0.5), nemesis(2.4, "contention_end")]
    assert run(attempt(2.35, completed=True) + held).status == "pass"


@pytest.mark.parametrize("outcome, status", [("timeout", "pass"), ("ok", "fail")],
                         ids=["recorded-its-timeout", "recorded-the-answer"])
def test_the_engines_own_spend_record_says_whether_it_waited(outcome, status):
    record = spend(2.35, DOC, "fetch", W1, 1, outcome=outcome, started=1.0)
    assert run(attempt(2.35) + [record]).status == status


@pytest.mark.parametrize("mark_at, sent, status", [(1.55, False, "pass"),
                                                  (1.85, False, "pass"),
                                                  (1.85, True, "fail")],
                         ids=["gave-up-in-time", "failure-written-late", "marked-sent-late"])
def test_a_sender_gives_up_on_a_late_receiver_by_its_send_timeout(mark_at, sent, status):
    late = request(1.0, 1.8, DOC, "charge", worker=S1, status=None, outcome="error",
                   applied=False)  # the fake answers 0.8 s in; the send timeout is 0.5 s
    retry = outbox(mark_at, 1, DOC, "charge", S1, 1, attempts=1,
                   sent_at=mark_at if sent else None, last_error=None if sent else "timeout")
    history = merge([outbox(0.99, 1, DOC, "charge", S1, 1, old_token=0, attempts=1), late,
                     retry])
    snap = snapshot_of(history)
    snap["settings"] = {**snap["settings"], "send_timeout": 0.5}
    assert check_deadlines_kept(history, snap).status == status


def test_nothing_past_its_deadline_is_unknown():
    quick = [call(1.0, 1.2, DOC, "fetch", W1)]
    verdict = run(quick)
    assert verdict.status == "unknown" and "no call or send ran past" in verdict.reason


# -- a trickled answer: the client that stays is seen by the fake ----------------------------

def trickled(gone_at, end=4.0, pause=None):
    """W1's fetch at 1.0 answered a byte at a time until `end`; the fake found the client
    gone at `gone_at` (None: it stayed to the end); W1 wrote its failure at 4.05."""
    history = attempt(4.05)
    history[1] = dict(HUNG, t_end=end, trickle=True, client_gone_at=gone_at)
    if pause:
        history += [nemesis(pause[0], "pause", pid=101), nemesis(pause[1], "resume", pid=101)]
    return history


@pytest.mark.parametrize("gone_at, end, pause, status", [
    (1.2, 4.0, None, "pass"),           # its deadline cut the connection: the fake saw it go
    (None, 4.0, None, "fail"),          # it stayed for the whole 3 s trickle
    (None, 2.3, None, "pass"),          # a trickle too short to tell (deadline + 2 writes + 1 s)
    (None, 4.0, (1.1, 3.0), "pass"),    # paused until 3.0: it could not leave before
    (None, 4.0, (1.1, 1.5), "fail"),    # resumed at 1.5: it had long enough
], ids=["left", "stayed", "too-short-to-tell", "paused-till-near-the-end", "paused-briefly"])
def test_a_client_that_keeps_a_trickled_answer_open_past_its_deadline_fails(
        gone_at, end, pause, status):
    history = trickled(gone_at, end, pause)
    verdict = run(history)
    assert verdict.status == status, verdict.reason
    if status == "fail":
        assert verdict.by_type == {"held-past-deadline": 1}
        assert verdict.failures[0].events == [history[1]]


def test_a_client_that_wrote_its_failure_while_the_trickle_went_on_had_given_up():
    # Its HTTP client's thread still read the trickle (the fake saw no one leave), but the
    # worker had moved on at its deadline: the open connection held no answer it waited for.
    history = trickled(None)
    history[2] = {**history[2], "t": 2.05, "next_run_at": 2.15}
    verdict = run(history)
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["abandoned_trickles"] == 1
    assert run(trickled(None)).by_type == {"held-past-deadline": 1}  # failure after the end


# -- a client the harness froze or the machine stalled: that time is not held against it ------

SLOW = call(1.0, 2.3, DOC, "fetch", W1, fault="slow")  # answered 0.3 s past a 1 s deadline


def answered(pause=None, pid=101, recorded=False, stalls=()):
    """W1's fetch at 1.0, answered at 2.3, and W1 using the answer at 2.65 (memo and
    completion; with `recorded`, its spend record with the answer too); `pause` (from, to)
    froze process `pid` (W1's is 101), and `stalls` are W1's process's stall events."""
    history = attempt(2.65, completed=True)
    history[1] = SLOW
    if pause:
        history += [nemesis(pause[0], "pause", pid=pid), nemesis(pause[1], "resume", pid=pid)]
    if recorded:
        history.append(spend(2.65, DOC, "fetch", W1, 1, outcome="ok", started=1.0))
    return history + [{"src": "process", "type": "stall", "pid": 101, **s} for s in stalls]


EVIDENCE = pytest.mark.parametrize("recorded", [True, False],
                                   ids=["spend-record-has-the-answer", "answer-used"])


@EVIDENCE
def test_a_worker_frozen_while_its_answer_came_is_not_judged(recorded):
    # Frozen from 1.5 (0.5 s into its deadline) to 2.6: the answer came at 2.3, while it
    # could not give up, and was there when it was resumed.
    verdict = run(answered(pause=(1.5, 2.6), recorded=recorded))
    assert verdict.failures == [] and verdict.status == "unknown", verdict.reason
    assert "frozen or stalled" in verdict.reason
    assert verdict.metrics["overran_calls"] == 1 and verdict.metrics["excused_calls"] == 1


@EVIDENCE
def test_a_worker_frozen_for_less_than_its_overrun_fails(recorded):
    verdict = run(answered(pause=(1.1, 1.2), recorded=recorded))  # 0.1 s of a 0.3 s overrun
    assert verdict.by_type == {"waited-past-deadline": 1}
    assert verdict.failures[0].events[0] == SLOW
    message = verdict.failures[0].message
    for part in (W1, "doc-1/fetch", "at +0.010 s", "1 s deadline", "(pid 101)",
                 "frozen by the harness (paused until resumed) for 0.100 s",
                 "not held against the deadline", "still came 0.200 s past it"):
        assert part in message, message


@EVIDENCE
def test_a_worker_neither_frozen_nor_stalled_that_overruns_fails(recorded):
    verdict = run(answered(recorded=recorded))
    assert verdict.by_type == {"waited-past-deadline": 1}
    assert "(pid 101) was neither paused nor stalled meanwhile: the answer came 0.300 s " \
           "past the deadline" in verdict.failures[0].message


@EVIDENCE
def test_a_pause_of_another_process_does_not_excuse(recorded):
    verdict = run(answered(pause=(1.5, 2.6), pid=102, recorded=recorded))
    assert verdict.by_type == {"waited-past-deadline": 1}
    assert "neither paused nor stalled" in verdict.failures[0].message


@pytest.mark.parametrize("stall, failed", [
    ({"t": 1.5, "seconds": 0.8}, False),                  # the simulation stopped it whole
    ({"t": 1.5, "seconds": 0.8, "waited": 0.2, "cause": "run-queue"}, True),  # a quarter
], ids=["sim-stall-covers-the-overrun", "run-queue-stall-shorter-than-the-overrun"])
def test_a_stall_counts_for_the_time_the_process_was_left_unrun(stall, failed):
    verdict = run(answered(recorded=True, stalls=[stall]))
    assert verdict.by_type == ({"waited-past-deadline": 1} if failed else {})
    if failed:
        assert "left unrun by the machine for 0.200 s" in verdict.failures[0].message
        assert "still came 0.100 s past it" in verdict.failures[0].message


def test_a_pause_and_a_stall_over_the_same_time_count_once():
    verdict = run(answered(pause=(1.1, 1.3), recorded=True, stalls=[{"t": 1.1, "seconds": 0.2}]))
    assert verdict.by_type == {"waited-past-deadline": 1}
    message = verdict.failures[0].message
    assert "frozen by the harness (paused until resumed) for 0.200 s" in message
    assert "left unrun" not in message and "still came 0.100 s past it" in message


def test_a_sender_frozen_while_the_receiver_answered_is_not_judged():
    late = request(1.0, 1.8, DOC, "charge", worker=S1)  # 0.3 s past a 0.5 s send timeout
    history = merge([outbox(0.99, 1, DOC, "charge", S1, 1, old_token=0, attempts=1), late,
                     outbox(1.85, 1, DOC, "charge", S1, 1, attempts=1, sent_at=1.85),
                     nemesis(1.2, "pause", pid=201), nemesis(1.9, "resume", pid=201)])
    snap = snapshot_of(history)
    snap["settings"] = {**snap["settings"], "send_timeout": 0.5}
    verdict = check_deadlines_kept(history, snap)
    assert verdict.failures == [] and verdict.metrics["excused_sends"] == 1
    unpaused = [e for e in history if e.get("src") != "nemesis"]
    assert check_deadlines_kept(unpaused, snap).by_type == {"waited-past-deadline": 1}


def test_a_worker_that_claimed_the_job_anew_had_given_the_late_call_up():
    # W1's fetch hung past its deadline; W1 moved on, and later claimed the job again for its
    # next step (another worker had finished fetch) and completed that: its completion
    # answers another call, not the late one.
    again = [job(2.5, DOC, "fetched", "extracting", W1, 2, old_token=1, claims=1,
                 lease_until=4.5),
             job(2.6, DOC, "extracting", "extracted", W1, 2)]
    history = attempt(0.0)[:2] + again
    assert run(history).status == "pass", run(history).reason
    assert run(attempt(2.35, completed=True)).by_type == {"waited-past-deadline": 1}
