"""processes-survive: an engine process that ends by itself is a finding; one the harness
ended (a kill, an armed crash point, the shutdown) is not."""
from __future__ import annotations

from builders import delivered_job, process, snapshot_of

from chaos.checkers.processes import check_processes_survive


def run(history):
    return check_processes_survive(history, snapshot_of(history))


def lifecycle(*exits):
    return [process(0.5, "spawn", "worker-0.1", 101)] + delivered_job("doc-1") + list(exits)


def test_processes_the_harness_ended_survive():
    verdict = run(lifecycle(process(5.0, "exit", "worker-0.1", 101, signal="SIGTERM",
                                    killed=True)))
    assert verdict.status == "pass", verdict.reason
    assert verdict.checked == 1


def test_a_worker_that_died_by_itself_fails_with_its_log_tail():
    died = dict(process(2.0, "exit", "worker-0.1", 101, code=1, killed=False),
                log_tail="Traceback (most recent call last):\nKeyError: 'delivered'")
    verdict = run(lifecycle(died))
    assert verdict.status == "fail"
    assert verdict.by_type == {"exited-by-itself": 1}
    assert "KeyError: 'delivered'" in verdict.failures[0].message
    assert verdict.failures[0].events == [died]


def test_a_sigkill_nobody_sent_is_a_finding_but_an_armed_crash_point_is_not():
    oom = process(2.0, "exit", "worker-0.1", 101, signal="SIGKILL", killed=False)
    assert run(lifecycle(oom)).status == "fail"
    probe = {"t": 1.9, "src": "process", "type": "crashpoint", "pid": 101,
             "point": "worker.after_call", "job": "doc-1"}
    assert run(lifecycle(probe, oom)).status == "pass"


def test_exits_that_do_not_say_who_ended_them_are_unknown():
    bare = {k: v for k, v in process(2.0, "exit", "worker-0.1", 101, code=0).items()
            if k != "killed"}
    assert run(lifecycle(bare)).status == "unknown"
    assert run(lifecycle()).status == "unknown"  # spawned, never seen to exit
