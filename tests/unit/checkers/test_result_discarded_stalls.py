"""result-discarded (cost-accounted) judges only answers that came in time for their caller: an
answer the provider gave within the call timeout, while the machine left the caller unrun
(a run-queue stall) or the harness paused it from its arrival to the end of the timeout,
could not be read in time,
and giving it up is no failure; a stall that left the caller time to read it excuses
nothing."""
from __future__ import annotations

from builders import W1, W2, call, job, snapshot_of, spend, submit

from chaos.checkers.billing import check_cost_accounted
from chaos.history import merge

DOC = "doc-1"
PID = int(W2.split(":")[2])


def gave_up(stall: tuple[float, float] | None) -> list[dict]:
    """W2 claims doc-1 at 1.0 (lease to 3.0), its call runs 1.01..1.85 (inside the 1 s
    timeout), and it records only its spend at 2.1, well before its lease ends; W1 takes
    the job over at 3.1. `stall`: (from, seconds) W2's process was left unrun."""
    events = [submit(0.5, DOC), job(0.5, DOC, None, "pending", "submit", 0, op="insert"),
              job(1.0, DOC, "pending", "fetching", W2, 1, old_token=0, claims=1,
                  lease_until=3.0),
              call(1.01, 1.85, DOC, "fetch", W2),
              spend(2.1, DOC, "fetch", W2, 1, outcome="timeout", started=1.01),
              job(3.1, DOC, "fetching", "fetching", W1, 2, old_token=1, claims=2,
                  lease_until=5.1)]
    if stall is not None:
        events.append({"t": stall[0], "src": "process", "type": "stall", "pid": PID,
                       "name": "worker-0.1", "role": "worker", "thread": "main",
                       "seconds": stall[1]})
    return events


def judged(history: list[dict]):
    history = merge(history)
    snap = snapshot_of(history)
    snap["settings"] = {**snap["settings"], "finish_retry_slack": 0.5, "call_timeout": 1.0}
    return check_cost_accounted(history, snap)


def test_an_answer_in_time_given_up_early_fails():
    assert "result-discarded" in judged(gave_up(None)).by_type


def test_an_answer_that_arrived_while_its_caller_was_unrun_past_its_timeout_is_excused():
    verdict = judged(gave_up((1.8, 0.4)))  # unrun from before 1.85 to 2.2, past 2.01
    assert "result-discarded" not in verdict.by_type, verdict.reason


def test_an_answer_that_arrived_as_the_harness_paused_its_caller_is_excused():
    # paused from 1.849 to 3.5: the answer of 1.85 was never read before the 2.01 deadline
    pause = [{"t": 1.849, "src": "nemesis", "type": "pause", "pid": PID, "seconds": 1.65},
             {"t": 3.5, "src": "nemesis", "type": "resume", "pid": PID}]
    verdict = judged(gave_up(None) + pause)
    assert "result-discarded" not in verdict.by_type, verdict.reason


def test_a_pause_that_ended_in_time_to_read_the_answer_excuses_nothing():
    pause = [{"t": 1.8, "src": "nemesis", "type": "pause", "pid": PID, "seconds": 0.08},
             {"t": 1.88, "src": "nemesis", "type": "resume", "pid": PID}]
    assert "result-discarded" in judged(gave_up(None) + pause).by_type


def test_a_stall_that_ended_in_time_to_read_the_answer_excuses_nothing():
    assert "result-discarded" in judged(gave_up((1.8, 0.08))).by_type  # run again at 1.88
