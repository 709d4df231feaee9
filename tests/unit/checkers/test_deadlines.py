"""deadlines-kept: a client that gives up by its deadline passes; one whose own spend record
outlasts it, or that waits a hung call or a late receiver out and uses the answer, fails
citing the call; a late failure write and a write the harness held back are not judged; a
run where nothing ran past a deadline is unknown."""
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
