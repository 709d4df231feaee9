"""Checks of a worker process that runs several jobs at once (job slots), on hand-made
histories: a process holds up to `slots` live leases, under one worker id per slot or one id
for all; one SIGKILL cuts every step it held; a group commit writes several jobs at one
instant, and a row fenced out of it leaves the others standing. Each rule passes where it
holds and fails where it is broken."""
from __future__ import annotations

import pytest
from builders import (W2, call, job, memo, nemesis, process, snapshot, snapshot_of, spend,
                      submit)

from chaos.checkers.billing import check_cost_accounted
from chaos.checkers.cuts import cut_metrics, kill_cuts
from chaos.checkers.index import readings
from chaos.checkers.leases import check_fenced_writes, check_lease_kept
from chaos.checkers.promptness import check_claims_prompt
from chaos.history import merge

PID = 301
SHARED = f"worker:host:{PID}:ffff"                        # one id for every slot
SLOT = [f"worker:host:{PID}:ffff/{k}" for k in range(4)]  # one id per slot (the reference's)
IDS = {"one id per slot": SLOT, "one id for all": [SHARED] * 4}


def settings(slots: int, **more) -> dict:
    return {**snapshot()["settings"], "slots": slots, **more}


def run(check, history, slots: int, **more):
    history = merge(history)
    return check(history, snapshot_of(history, settings=settings(slots, **more)))


def claim(t, job_id, worker, token=1, lease=2.0, frm="pending", to="fetching"):
    return job(t, job_id, frm, to, worker, token, old_token=token - 1, claims=1,
               lease_until=t + lease)


def fetched(t, job_id, worker, token=1):
    return job(t, job_id, "fetching", "fetched", worker, token)


def beat(t, job_id, worker, token=1, until=None):
    return job(t, job_id, "fetching", "fetching", worker, token, lease_until=until or t + 2.0)


def spawned(pid=PID, name="worker-0.1"):
    return process(0.0, "spawn", name, pid)


def killed(t, pid=PID, name="worker-0.1"):
    return [nemesis(t, "kill", target=name, pid=pid),
            process(t + 0.01, "exit", name, pid, signal="SIGKILL")]


def submitted(*jobs):
    return [e for j in jobs for e in (submit(0.1, j), job(0.1, j, None, "pending", "submitter",
                                                           0, op="insert", next_run_at=0.1))]


# -- lease-kept: a process never holds more live leases than its slots ----------------------------

@pytest.mark.parametrize("ids", IDS.values(), ids=IDS.keys())
def test_a_process_may_hold_as_many_live_leases_as_it_has_slots(ids):
    history = [spawned()] + [claim(1.0 + k / 10, f"j{k}", ids[k]) for k in range(4)]
    verdict = run(check_lease_kept, history, slots=4)
    assert "lease-abandoned" not in verdict.by_type, verdict.reason


@pytest.mark.parametrize("ids", IDS.values(), ids=IDS.keys())
def test_a_process_that_claims_past_its_slots_walked_away_from_a_lease(ids):
    history = [spawned()] + [claim(1.0 + k / 10, f"j{k}", ids[k]) for k in range(3)]
    verdict = run(check_lease_kept, history, slots=2)
    assert verdict.by_type == {"lease-abandoned": 1}, verdict.reason
    assert verdict.failures[0].events == [history[1], history[3]]
    assert "as many as its 2 slots" in verdict.failures[0].message


def test_slots_are_counted_per_process_whatever_ids_the_slots_write_under():
    # Two ids of one process, two jobs each would be within a per-id count of 2: the
    # process holds four.
    history = [spawned(), claim(1.0, "a", SLOT[0]), claim(1.1, "b", SLOT[1]),
               claim(1.2, "c", SLOT[2]), claim(1.3, "d", SLOT[3])]
    assert run(check_lease_kept, history, slots=2).by_type == {"lease-abandoned": 1}
    assert "lease-abandoned" not in run(check_lease_kept, history, slots=4).by_type


def slot_walks_away():
    """Slot 1 claims b while its own lease on a is live and unwritten; slots 0, 2, 3 are free."""
    return [spawned(), claim(1.0, "a", SLOT[1]), claim(1.5, "b", SLOT[1])]


def test_a_slot_that_claims_while_its_own_lease_is_live_walked_away_where_ids_name_slots():
    verdict = run(check_lease_kept, slot_walks_away(), slots=4, id_per_slot=True)
    assert verdict.by_type == {"lease-abandoned": 1}, verdict.reason
    assert "while it still held the lease on job a" in verdict.failures[0].message


def test_without_ids_per_slot_only_the_process_count_is_judged():
    # The same writes from an engine whose ids say nothing of its slots: another slot of the
    # process may have made the second claim.
    verdict = run(check_lease_kept, slot_walks_away(), slots=4)
    assert "lease-abandoned" not in verdict.by_type, verdict.reason


def test_a_slot_whose_lease_ended_by_its_write_may_claim_again_under_its_id():
    history = [spawned(), claim(1.0, "a", SLOT[1]), fetched(1.4, "a", SLOT[1]),
               claim(1.5, "b", SLOT[1])]
    verdict = run(check_lease_kept, history, slots=4, id_per_slot=True)
    assert "lease-abandoned" not in verdict.by_type, verdict.reason


def test_finishing_writes_committed_together_free_their_slots_for_the_next_claims():
    # A group commit finishes a and b at one instant; both slots claim again at once.
    history = [spawned(), claim(1.0, "a", SLOT[0]), claim(1.0, "b", SLOT[1]),
               fetched(2.0, "a", SLOT[0]), fetched(2.0, "b", SLOT[1]),
               claim(2.0, "c", SLOT[0]), claim(2.0, "d", SLOT[1])]
    verdict = run(check_lease_kept, history, slots=2)
    assert "lease-abandoned" not in verdict.by_type, verdict.reason


# -- lease-kept: one heartbeat for every slot ----------------------------------------------

def two_slots_in_a_call(renewal_of_b):
    """Slots 0 and 1 claim a and b at 1.0 (leases to 3.0), call 1.1-5.0 and finish at 5.0;
    the process's heartbeat renews a at 2.0 and 3.5, and b at 2.0 and by `renewal_of_b`."""
    history = [spawned(), process(0.0, "spawn", "worker-1.2", 302),
               claim(1.0, "a", SLOT[0]), claim(1.0, "b", SLOT[1]),
               call(1.1, 5.0, "a", "fetch", SLOT[0]), call(1.1, 5.0, "b", "fetch", SLOT[1]),
               beat(2.0, "a", SLOT[0]), beat(2.0, "b", SLOT[1]), beat(3.5, "a", SLOT[0])]
    history += [renewal_of_b] if renewal_of_b else []
    return history + [fetched(5.0, "a", SLOT[0]), fetched(5.0, "b", SLOT[1])]


@pytest.mark.parametrize("renewal, status", [
    (beat(3.5, "b", SLOT[1]), "pass"),                      # its own slot's id
    (beat(3.5, "b", SHARED), "pass"),                       # the process's own id, b's token
    (beat(3.5, "b", "worker:host:302:eeee"), "fail"),       # another process
    (beat(3.5, "b", SHARED, token=7), "fail"),              # not b's claim's token
    (None, "fail"),                                          # no renewal of b at all
], ids=["slot-id", "process-id", "other-process", "other-token", "none"])
def test_a_slot_in_a_call_keeps_its_lease_by_its_own_processes_renewals(renewal, status):
    verdict = run(check_lease_kept, two_slots_in_a_call(renewal), slots=2,
                  heartbeat_interval=0.5)
    assert verdict.status == status, verdict.reason
    if status == "fail":
        assert verdict.by_type == {"lease-lapsed": 1}
        assert "job b" in verdict.failures[0].message


# -- one SIGKILL cuts every step its process held ------------------------------------------

def one_kill_cuts_three():
    """Slots 0-2 hold a, b, c; slot 3 finished d before the kill at 2.0; W2 takes over a,
    b and c once their leases ran out."""
    history = [spawned(), process(0.0, "spawn", "worker-1.2", 102), *submitted("a", "b", "c", "d")]
    history += [claim(1.0 + k / 10, j, SLOT[k]) for k, j in enumerate("abcd")]
    history += [fetched(1.5, "d", SLOT[3]), *killed(2.0)]
    history += [claim(3.5 + k / 10, j, W2, token=2, frm="fetching") for k, j in enumerate("abc")]
    return merge(history)


def test_one_kill_is_reported_with_every_step_its_process_held():
    history = one_kill_cuts_three()
    [cut] = kill_cuts(history, snapshot()["pipeline"])
    assert (cut["pid"], cut["how"]) == (PID, "kill")
    assert sorted(s["job"] for s in cut["steps"]) == ["a", "b", "c"]
    assert cut_metrics([cut]) == {"kills": 1, "steps_cut": 3, "most_in_one_kill": 3,
                                  "kills_by_steps_cut": {"3": 1}}


def test_a_crash_point_one_slot_reached_cuts_the_other_slots_too():
    history = [e for e in one_kill_cuts_three() if e.get("type") != "kill"]
    history = merge(history + [{"t": 2.0, "src": "process", "type": "crashpoint", "pid": PID,
                                "point": "worker.group.before_commit", "job": "a"}])
    [cut] = kill_cuts(history, snapshot()["pipeline"])
    assert cut["how"] == "crash point worker.group.before_commit"
    assert len(cut["steps"]) == 3


def test_a_kill_cuts_the_steps_still_worked_on_not_those_a_slot_walked_away_from():
    # a's lease ran out at 2.0 with no call: its slot let it go (say it was stopped past
    # the lease); c's lease ran out too, but its call was still in flight; b is live.
    history = merge([spawned(), claim(1.0, "a", SLOT[0], lease=1.0),
                     claim(1.0, "c", SLOT[2], lease=1.0), call(1.1, 3.5, "c", "fetch", SLOT[2]),
                     claim(2.5, "b", SLOT[1]), *killed(3.0)])
    [cut] = kill_cuts(history, snapshot()["pipeline"])
    assert sorted(s["job"] for s in cut["steps"]) == ["b", "c"]


def test_the_killed_slots_leases_are_not_abandoned_and_their_successors_may_claim():
    verdict = run(check_lease_kept, one_kill_cuts_three(), slots=4)
    assert "lease-abandoned" not in verdict.by_type, verdict.reason


# -- cost-accounted: a write for another job is another slot's, not this one's -----------------

def billed_then_other_job_then_killed(worker_a, worker_b):
    """a's call is billed at 1.1-1.2 and never recorded; b (another slot) is called,
    recorded and finished at 1.5; the process is killed at 2.0."""
    return [spawned(), claim(1.0, "a", worker_a), claim(1.0, "b", worker_b),
            call(1.1, 1.2, "a", "fetch", worker_a), call(1.1, 1.4, "b", "fetch", worker_b),
            memo(1.5, "b", "fetch", worker_b, 1), spend(1.5, "b", "fetch", worker_b, 1,
                                                        started=1.1),
            fetched(1.5, "b", worker_b), *killed(2.0)]


def test_a_slot_killed_before_recording_its_spend_is_not_judged_by_another_slots_writes():
    history = billed_then_other_job_then_killed(SHARED, SHARED)
    verdict = run(check_cost_accounted, history, slots=2)
    assert "spend-unrecorded" not in verdict.by_type, verdict.reason
    assert verdict.metrics["waste_by_cause"] == {"crash-before-commit": 0.01}


def test_a_one_slot_worker_that_went_on_to_another_job_still_owed_the_spend_record():
    history = billed_then_other_job_then_killed(SHARED, SHARED)
    assert run(check_cost_accounted, history, slots=1).by_type == {"spend-unrecorded": 1}


def test_a_slot_with_an_id_of_its_own_that_went_on_to_another_job_owed_the_record():
    # The slot's own id wrote for another job: no other slot could have, it gave the call up.
    history = billed_then_other_job_then_killed(SLOT[0], SLOT[0])
    verdict = run(check_cost_accounted, history, slots=2, id_per_slot=True)
    assert verdict.by_type == {"spend-unrecorded": 1}, verdict.reason
    assert "spend-unrecorded" not in run(check_cost_accounted, history, slots=2).by_type


# -- a group commit with one row fenced out -------------------------------------------------

def group_with_a_fenced_row(stale_committed: bool):
    """Slots 0 and 1 hold a and b (leases to 3.0); the process is paused 1.2-3.9, W2 takes a
    at 3.5; at 4.0 one group commits b's completion, and a's, stale, either rolls back to its
    savepoint (not written) or, in a broken engine, commits by id alone."""
    history = [spawned(), process(0.0, "spawn", "worker-1.2", 102),
               claim(1.0, "a", SLOT[0]), claim(1.0, "b", SLOT[1]),
               nemesis(1.2, "pause", pid=PID), claim(3.5, "a", W2, token=2, frm="fetching"),
               nemesis(3.9, "resume", pid=PID),
               memo(4.0, "b", "fetch", SLOT[1], 1), fetched(4.0, "b", SLOT[1])]
    if stale_committed:
        history.append(fetched(4.0, "a", SLOT[0], token=2))
    return history


def test_a_group_commit_whose_stale_row_rolled_back_keeps_the_others_writes():
    verdict = run(check_fenced_writes, group_with_a_fenced_row(False), slots=2)
    assert verdict.status == "pass", verdict.reason


def test_a_stale_row_committed_in_a_group_fails_alone():
    history = merge(group_with_a_fenced_row(True))
    verdict = check_fenced_writes(history, snapshot_of(history, settings=settings(2)))
    assert verdict.by_type == {"zombie-write": 1}, verdict.reason
    assert verdict.failures[0].events[-1]["job"] == "a"


# -- claims-prompt: a free slot claims due work ------------------------------------------------

def busy_slots(free_at: float | None, refill: bool = False):
    """Slots 0 and 1 hold x and y from 0.2; slot 1 finishes y at `free_at` (None: at 4.5, with
    x), and (`refill`) claims w at once; job z is due from 1.0 and W2 claims it at 4.0."""
    history = [*submitted("x", "y"), claim(0.2, "x", SLOT[0], lease=9.0),
               claim(0.2, "y", SLOT[1], lease=9.0),
               job(free_at or 4.5, "y", "fetching", "delivered", SLOT[1], 1),
               job(4.5, "x", "fetching", "delivered", SLOT[0], 1)]
    if refill:
        history += [*submitted("w"), claim(free_at, "w", SLOT[1], lease=9.0),
                    job(4.5, "w", "fetching", "delivered", SLOT[1], 1)]
    history += [job(1.0, "z", None, "pending", "submitter", 0, op="insert", next_run_at=1.0),
                claim(4.0, "z", W2), job(4.1, "z", "fetching", "delivered", W2, 1)]
    return history


@pytest.mark.parametrize("free_at, refill, status", [
    (None, False, "pass"), (1.0, True, "pass"), (1.0, False, "fail")],
    ids=["every-slot-busy", "a-slot-refilled-at-once", "one-slot-free"])
def test_due_work_waits_only_while_every_slot_of_a_process_is_taken(free_at, refill, status):
    history = merge(busy_slots(free_at, refill))
    snap = snapshot_of(history, settings=settings(2, claim_latency=0.03))
    verdict = check_claims_prompt(history, snap)
    assert verdict.status == status, verdict.reason
    if status == "fail":
        assert verdict.by_type == {"due-job-waited": 1}
        assert SLOT[1] in verdict.failures[0].message and f"pid {PID}" in verdict.failures[0].message


# -- holdings end with their process, all of them ---------------------------------------------

def test_every_holding_of_a_killed_process_ends_with_it_though_its_id_lives_on():
    """An engine whose worker id names a slot (not a process): process 301 holds a and b
    under "exec-0" and is killed; process 302, under the same id, then finishes both. Its
    writes are a successor's, not the killed holdings' own."""
    def op(t, job_id, frm, to, pid, type_="state", **fields):
        return {"t": t, "src": "engine", "type": type_, "job": job_id, "from": frm, "to": to,
                "worker": "exec-0", "pid": pid, "actor": "worker", "token": None,
                "completion": "ok", **fields}
    history = [spawned(), *killed(2.0), process(2.1, "spawn", "worker-0.2", 302)]
    history += [op(1.0, j, "pending", "fetching", PID, "claimed", step="fetch",
                   continued=False) for j in "ab"]
    history += [op(3.0, j, "fetching", "fetched", 302) for j in "ab"]
    tl = readings(merge(history)).timeline(snapshot()["pipeline"])
    assert all(h.write is None for j in "ab" for h in tl.holdings[j])
