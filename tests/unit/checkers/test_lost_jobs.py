"""A job that never settles, explained (chaos.checkers.lost), on hand-made histories: the
witness of all-jobs-settle names the last process that held the job or worked on it, whether
and when it was killed and by which fault, also when the engine did not name the writer;
and the kill summary counts the jobs each kill lost, which may be more than the steps it
counted as cut."""
from __future__ import annotations

from builders import W1, W2, call, job, nemesis, process, snapshot_of

from chaos.checkers.cuts import cut_metrics, kill_cuts, with_jobs_lost
from chaos.checkers.liveness import check_all_jobs_settle
from chaos.history import merge
from chaos.reports.report_text import _cuts_line

P1, P2 = 101, 102  # the pids W1's and W2's ids name


def claim(t, job_id, worker=W1, token=1, lease=5.0):
    return job(t, job_id, "pending", "fetching", worker, token, old_token=token - 1, claims=1,
               lease_until=t + lease)


def unnamed(e):
    """`e` as an observer that cannot tell its writer records it."""
    return {**e, "worker": None, "pid": None}


def spawned(pid=P1, name="worker-0.1"):
    return process(0.0, "spawn", name, pid)


def killed(t, pid=P1, name="worker-0.1"):
    return [nemesis(t, "kill", target=name, pid=pid),
            process(t + 0.01, "exit", name, pid, signal="SIGKILL")]


def unsettled(history):
    history = merge(history)
    verdict = check_all_jobs_settle(history, snapshot_of(history))
    assert verdict.by_type.get("job-not-settled"), verdict.reason
    return {f.message.split()[1]: f for f in verdict.failures}


def why(failure) -> str:
    """The witness's explanation, after the job's row (whose last error may well be None)."""
    return failure.message.split(" after the drain: ", 1)[1].split(" (its row: ")[0]


def test_the_witness_names_the_holder_and_when_and_how_it_was_killed():
    history = [spawned(), claim(1.0, "a"), *killed(2.5)]
    [failure] = unsettled(history).values()
    assert (f"last held by worker {W1} (process worker-0.1, pid {P1}), which claimed it at "
            "+1.000 s; that process was SIGKILLed at +2.500 s by the nemesis's kill fault"
            ) in failure.message
    assert [e["type"] for e in failure.events] == ["claimed", "kill", "exit"]


def test_an_unnamed_last_writer_is_explained_by_the_claim_before_it():
    # the last write (a renewal the observer could not attribute) names no one: the claim does
    beat = unnamed(job(1.5, "a", "fetching", "fetching", W1, 1, lease_until=6.5))
    [failure] = unsettled([spawned(), claim(1.0, "a"), beat, *killed(2.0)]).values()
    assert "None" not in why(failure)
    assert f"last held by worker {W1} (process worker-0.1, pid {P1})" in failure.message
    assert "SIGKILLed at +2.000 s" in failure.message
    assert "last written by a writer the engine did not name at +1.500 s" in failure.message


def test_an_unnamed_claim_is_named_by_the_call_its_holder_made():
    # lost right after being taken: the claim names nobody, the provider call does
    work = {**call(1.1, 1.8, "a", "fetch", W2), "pid": P2}
    history = [spawned(P2, "worker-1.1"), unnamed(claim(1.0, "a", W2)), work,
               *killed(1.5, P2, "worker-1.1")]
    [failure] = unsettled(history).values()
    assert (f"last held by worker {W2} (process worker-1.1, pid {P2}), which claimed it at "
            "+1.000 s; that process was SIGKILLed at +1.500 s") in failure.message
    assert "None" not in why(failure)


def test_a_claim_nothing_names_is_said_to_be_unnamed_not_none():
    [failure] = unsettled([spawned(), unnamed(claim(1.0, "a")), *killed(2.0)]).values()
    assert "last claimed at +1.000 s by a worker the engine did not name" in failure.message
    assert "None" not in why(failure)


def test_a_crash_point_is_named_as_the_fault():
    point = {"t": 2.0, "src": "process", "type": "crashpoint", "pid": P1,
             "point": "worker.after_call", "job": "a"}
    history = [spawned(), claim(1.0, "a"), point,
               process(2.01, "exit", "worker-0.1", P1, signal="SIGKILL")]
    [failure] = unsettled(history).values()
    assert ("that process was killed at +2.000 s at crash point worker.after_call (the "
            "crash-point fault)") in failure.message


def test_a_holder_that_exited_by_itself_is_not_called_killed():
    history = [spawned(), claim(1.0, "a"), process(3.0, "exit", "worker-0.1", P1, code=1)]
    [failure] = unsettled(history).values()
    assert "exited by itself at +3.000 s (code 1) without giving the job back" in failure.message
    assert "killed" not in failure.message.lower()


def test_a_job_its_holder_let_go_is_held_by_no_one():
    retry = job(1.5, "a", "fetching", "pending", W1, 1, attempts=1, next_run_at=1.6)
    [failure] = unsettled([spawned(), claim(1.0, "a"), retry, *killed(2.0)]).values()
    assert f"last written by {W1} at +1.500 s; no process held it after" in failure.message
    assert "SIGKILLed" not in failure.message


def two_kills():
    """worker-0.1 holds a and b (slots) when killed at 2.0; worker-1.1 holds c when killed
    at 4.0, its lease run out at 3.5 with no call (walked away from, in the cuts' reading,
    yet never settled); d is taken by worker-1.1 and finished."""
    return merge([spawned(), spawned(P2, "worker-1.1"), claim(1.0, "a"), claim(1.1, "b"),
                  claim(1.2, "d", W2), job(1.3, "d", "fetching", "fetched", W2, 1),
                  *killed(2.0), claim(2.5, "c", W2, lease=1.0), *killed(4.0, P2, "worker-1.1")])


def test_the_kill_summary_counts_the_jobs_each_kill_lost():
    history = two_kills()
    snap = snapshot_of(history)
    cuts = with_jobs_lost(kill_cuts(history, snap["pipeline"]), history, snap)
    assert [(c["name"], c["jobs_lost"]) for c in cuts] == [("worker-0.1", ["a", "b"]),
                                                          ("worker-1.1", ["c"])]
    metrics = cut_metrics(cuts)
    assert (metrics["steps_cut"], metrics["jobs_lost"]) == (2, 3)  # c was lost, not cut
    assert metrics["kills_by_jobs_lost"] == {"1": 1, "2": 1}
    assert metrics["most_lost_in_one_kill"] == {"at": 2.0, "name": "worker-0.1", "pid": P1,
                                                "jobs": ["a", "b"]}
    lines = _cuts_line(metrics)
    assert lines[0].startswith("worker kills 2 cut 2 in-flight steps")
    assert lines[1] == ("jobs lost to kills: 3 never settled, last held by a killed process "
                        "(kills by jobs lost: 1: 1, 2: 1; the most, 2, by the kill of "
                        "worker-0.1 at +2.000 s: a, b)")


def test_a_kill_that_lost_nothing_adds_no_line():
    history = two_kills()
    snap = snapshot_of(history)
    for row in snap["jobs"].values():
        row["state"] = "delivered"
    metrics = cut_metrics(with_jobs_lost(kill_cuts(history, snap["pipeline"]), history, snap))
    assert metrics["jobs_lost"] == 0 and len(_cuts_line(metrics)) == 1
