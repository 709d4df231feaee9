"""lease-exclusive and fenced-writes: clean histories pass; overlapping calls, duplicate spend
over the allowance and every kind of zombie write fail citing their events; a fenced worker's
memo is allowed; the real engine passes and its fenced-by-id-only mutant is caught."""
from __future__ import annotations

import pytest
from builders import (OP, S1, W1, W2, call, delivered_job, fence_by_id_only, job, memo,
                      nemesis, outbox, process, snapshot, snapshot_of, spend, zombie_finish)

from chaos.checkers.leases import check_fenced_writes, check_lease_exclusive, check_lease_kept
from chaos.history import merge

DOC = "doc-1"
S2 = "sender:host:202:dddd"


def run(check, history, **overrides):
    history = merge(history)
    return check(history, snapshot_of(history, **overrides))


def plan(exclusive: bool, allowance: float = 0.0) -> dict:
    return {**snapshot()["plan"], "expect": {"lease_exclusive": exclusive, "settle": True,
                                             "duplicate_spend_allowance": allowance}}


def assert_fails(verdict, type_, *witnesses):
    assert verdict.status == "fail", verdict.reason
    assert verdict.by_type == {type_: len(verdict.failures)}
    assert verdict.failures[0].events == list(witnesses)


# -- lease-exclusive ------------------------------------------------------------------------

def test_one_worker_per_step_is_exclusive():
    verdict = run(check_lease_exclusive, delivered_job(DOC))
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["overlapping_pairs"] == verdict.metrics["duplicate_calls"] == 0


OVERLAP = call(1.12, 1.30, DOC, "fetch", W2)  # W1's fetch call runs 1.11-1.15


def test_two_workers_calling_for_one_step_at_once_fail_when_leases_are_exclusive():
    history = merge(delivered_job(DOC) + [OVERLAP])
    verdict = run(check_lease_exclusive, history, plan=plan(exclusive=True))
    first = [e for e in history if e["type"] == "call" and e["step"] == "fetch"][0]
    assert_fails(verdict, "concurrent-calls", first, OVERLAP)


def test_the_same_overlap_is_measured_duplicate_spend_when_leases_are_not_exclusive():
    verdict = run(check_lease_exclusive, delivered_job(DOC) + [OVERLAP],
                  plan=plan(exclusive=False, allowance=0.01))
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["overlapping_pairs"] == 1
    assert verdict.metrics["duplicate_calls"] == 1
    assert verdict.metrics["duplicate_spend"] == 0.01


def test_duplicate_spend_over_the_allowance_fails_citing_the_duplicates():
    late = call(3.0, 3.1, DOC, "extract", W2, billed=0.02)
    verdict = run(check_lease_exclusive, delivered_job(DOC) + [OVERLAP, late],
                  plan=plan(exclusive=False, allowance=0.01))
    assert_fails(verdict, "duplicate-spend-over-allowance", late, OVERLAP)


@pytest.mark.parametrize("death, status", [(None, "fail"), (3.05, "unknown"), (2.0, "fail")],
                         ids=["no-process-died", "a-process-died-while-it-was-open",
                              "a-process-died-before-it-began"])
def test_a_duplicate_naming_no_worker_is_excused_only_by_a_death_it_cannot_place(death, status):
    # A plain client's call the fakes could not tie to a live process: if some process died
    # while it was open it may be that process's lost work (unknown), if none did it is a
    # duplicate whoever made it.
    nobody = {**call(3.0, 3.1, DOC, "extract", None, billed=0.02), "pid": None}
    extra = [nobody] + ([process(death, "exit", "w9", 909, signal="SIGKILL")] if death else [])
    verdict = run(check_lease_exclusive, delivered_job(DOC) + extra,
                  plan=plan(exclusive=False, allowance=0.01))
    assert verdict.status == status, verdict.reason
    if status == "fail":
        assert_fails(verdict, "duplicate-spend-over-allowance", nobody)
    else:
        assert "cannot be told" in verdict.reason
        assert verdict.metrics["unattributed_duplicates"] == 1


def test_a_call_of_a_slot_worker_is_excused_by_the_death_of_the_process_that_made_it():
    # A worker id that names a slot (its processes 101 then 111): the first process called
    # and was killed before it wrote; the call is a crash's waste, not a duplicate.
    slot = "worker-0"
    first = {**call(3.0, 3.1, DOC, "extract", slot, billed=0.02), "pid": 101}
    later = {**call(3.5, 3.6, DOC, "extract", slot, billed=0.0), "pid": 111}
    killed = process(3.2, "exit", "worker-0.0", 101, signal="SIGKILL")
    verdict = run(check_lease_exclusive, delivered_job(DOC) + [first, killed, later],
                  plan=plan(exclusive=False, allowance=0.01))
    assert verdict.status == "pass", verdict.reason
    kept_alive = {**first, "pid": 111}  # the same call by the process that lived on
    verdict = run(check_lease_exclusive, delivered_job(DOC) + [kept_alive, killed, later],
                  plan=plan(exclusive=False, allowance=0.01))
    assert verdict.status == "fail", verdict.reason


def test_without_a_memo_the_kept_call_is_the_finishers_not_a_dead_callers():
    # A step that memoizes nothing (memo=False): its first good call was made by a worker
    # killed before it wrote (a crash's waste), and the worker that finished the step paid
    # for its own. That call is the step's, not a duplicate of the dead one's.
    history = [e for e in delivered_job(DOC)
               if not (e.get("type") == "memo" and e.get("step") == "extract")]
    dead = {**call(1.15, 1.19, DOC, "extract", W2, billed=0.02), "pid": 102}
    killed = process(1.195, "exit", "worker-1.2", 102, signal="SIGKILL")
    verdict = run(check_lease_exclusive, history + [dead, killed],
                  plan=plan(exclusive=False, allowance=0.0))
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["duplicate_calls"] == 0


def test_failed_answers_are_retries_not_duplicates():
    refused = [call(1.0, 1.01, DOC, "fetch", W2, outcome="error", status=500, billed=0.0),
               call(1.02, 1.03, DOC, "fetch", W2, outcome="schema", billed=0.01)]
    verdict = run(check_lease_exclusive, delivered_job(DOC) + refused, plan=plan(exclusive=False))
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["duplicate_calls"] == 0


@pytest.mark.parametrize("gave_up", [
    spend(1.05, DOC, "fetch", W2, 1, "timeout", None),       # timed out and recorded it
    process(1.05, "exit", "w2", 102, signal="SIGKILL"),      # killed mid-call
    # an engine with no spend record: its failure write says it had stopped waiting
    job(1.05, DOC, "fetching", "pending", W2, 1),
], ids=["timed-out", "killed", "wrote-its-failure"])
def test_a_call_its_worker_abandoned_does_not_overlap_the_next_owners(gave_up):
    # In the ledger the hung call runs to 9.0, over W1's call at 1.11-1.15; W2 stopped
    # waiting at 1.05.
    hung = call(1.0, 9.0, DOC, "fetch", W2, outcome="hang")
    took = job(0.99, DOC, "pending", "fetching", W2, 1, old_token=0)  # W2's own claim
    verdict = run(check_lease_exclusive, delivered_job(DOC) + [took, hung, gave_up],
                  plan=plan(exclusive=True))
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["overlapping_pairs"] == 0


def stays(t: float, lease_until: float, heartbeat: bool) -> dict:
    """A worker's write that leaves the job in its state (an engine whose claim does not
    move it): a retry scheduled (lease let go), or a heartbeat (lease extended)."""
    return {"t": t, "src": "engine", "type": "state", "job": DOC, "from": "pending",
            "to": "pending", "actor": "worker", "worker": W2, "pid": 102, "token": None,
            "completion": "ok", "attempts": 1, "claims": None, "next_run_at": t + 0.5,
            "lease_until": lease_until, "last_error": "TimeoutError()", "cause": None,
            "heartbeat": heartbeat, "took_lease": False}


@pytest.mark.parametrize("write, status", [(stays(1.05, 0.0, False), "pass"),
                                           (stays(1.05, 4.0, True), "fail")],
                         ids=["retry-in-the-same-state", "heartbeat"])
def test_a_write_that_lets_the_lease_go_ends_the_call_and_a_heartbeat_does_not(write, status):
    hung = call(1.0, 9.0, DOC, "fetch", W2, outcome="hang")
    took = job(0.99, DOC, "pending", "fetching", W2, 1, old_token=0)
    verdict = run(check_lease_exclusive, delivered_job(DOC) + [took, hung, write],
                  plan=plan(exclusive=True))
    assert verdict.status == status, verdict.reason


def test_a_call_whose_worker_went_on_without_writing_still_overlaps():
    hung = call(1.0, 9.0, DOC, "fetch", W2, outcome="hang")
    took = job(0.99, DOC, "pending", "fetching", W2, 1, old_token=0)
    verdict = run(check_lease_exclusive, delivered_job(DOC) + [took, hung],
                  plan=plan(exclusive=True))
    assert verdict.by_type == {"concurrent-calls": 1}


def test_lease_exclusive_is_unknown_without_a_provider_ledger():
    history = [e for e in delivered_job(DOC) if e["src"] != "provider"]
    assert run(check_lease_exclusive, history).status == "unknown"


# -- fenced-writes ------------------------------------------------------------------------

def test_a_clean_delivery_writes_only_under_its_own_lease():
    verdict = run(check_fenced_writes, delivered_job(DOC))
    assert verdict.status == "pass", verdict.reason
    # 7 job writes after the claim, 2 outbox inserts, 3 calls at the fake, 3 begun in a lease
    assert verdict.checked == 15
    assert verdict.metrics["lease_takes"] == 1


def taken_over():
    """W1 claims doc-1 (token 1); W2 re-claims it after W1's lease expired (token 2)."""
    return [job(1.0, DOC, None, "pending", "submit", 0, op="insert"),
            job(1.1, DOC, "pending", "fetching", W1, 1, old_token=0),
            nemesis(2.0, "expire", job=DOC),
            job(2.0, DOC, "fetching", "fetching", "nemesis", 1, lease_until=0.5),
            job(2.1, DOC, "fetching", "fetching", W2, 2, old_token=1)]


def test_a_zombies_memo_after_a_takeover_is_allowed():
    history = taken_over() + [memo(2.5, DOC, "fetch", W1, 1)]
    verdict = run(check_fenced_writes, history)
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["fenced_memo_inserts"] == 1


@pytest.mark.parametrize("zombie", [
    job(2.5, DOC, "fetching", "fetched", W1, 2),                  # completion by id only
    job(2.5, DOC, "fetching", "pending", W1, 2, attempts=1),      # failure by id only
    job(2.5, DOC, "fetching", "fetching", W1, 2, lease_until=9),  # heartbeat by id only
], ids=["complete", "fail", "heartbeat"])
def test_a_zombies_job_write_after_a_takeover_fails(zombie):
    history = taken_over()
    verdict = run(check_fenced_writes, history + [zombie])
    assert_fails(verdict, "zombie-write", history[1], history[4], zombie)
    assert "belonged to worker:host:102:bbbb" in verdict.failures[0].message


def test_a_write_after_the_nemesis_expired_the_lease_but_before_a_takeover_is_the_owners():
    history = taken_over()[:4] + [job(2.05, DOC, "fetching", "fetched", W1, 1)]
    assert run(check_fenced_writes, history).status == "pass"


def test_a_write_that_sets_the_token_back_fails():
    history = taken_over()
    regress = job(2.5, DOC, "fetching", "fetched", W2, 1, old_token=2)
    assert_fails(run(check_fenced_writes, history + [regress]), "zombie-write",
                 history[4], regress)


def test_a_worker_write_after_an_operator_took_the_job_fails():
    history = taken_over()[:2] + [job(1.5, DOC, "fetching", "fetching", OP, 2, old_token=1)]
    zombie = job(2.0, DOC, "fetching", "fetched", W1, 2)
    assert_fails(run(check_fenced_writes, history + [zombie]), "zombie-write",
                 history[1], history[2], zombie)


def test_an_outbox_insert_by_a_fenced_worker_fails():
    history = taken_over()
    row = outbox(2.5, 1, DOC, "charge", W1, 0, op="insert")
    assert_fails(run(check_fenced_writes, history + [row]), "zombie-write",
                 history[1], history[4], row)


def sent_twice():
    """doc-1 delivered; S1 claims its charge row, its lease runs out, S2 claims it."""
    return delivered_job(DOC) + [outbox(2.0, 1, DOC, "charge", S1, 1, old_token=0, attempts=1),
                                 outbox(3.0, 1, DOC, "charge", S2, 2, old_token=1, attempts=2)]


def test_a_sender_marking_a_row_sent_under_its_own_lease_passes():
    mark = outbox(3.1, 1, DOC, "charge", S2, 2, sent_at=3.1)
    assert run(check_fenced_writes, sent_twice() + [mark]).status == "pass"


def test_a_sender_marking_a_row_it_lost_fails():
    history = merge(sent_twice())
    zombie = outbox(3.1, 1, DOC, "charge", S1, 2, sent_at=3.1)
    assert_fails(run(check_fenced_writes, history + [zombie]), "zombie-write",
                 history[-2], history[-1], zombie)


def test_fenced_writes_is_unknown_without_audit_job_events():
    verdict = check_fenced_writes([], snapshot(jobs={DOC: {"state": "pending"}}))
    assert verdict.status == "unknown"


def test_the_real_engine_fences_the_zombie_and_keeps_its_memo(store, clock, pipeline):
    history = zombie_finish(store, clock, pipeline)
    verdict = check_fenced_writes(history, snapshot_of(history))
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["fenced_memo_inserts"] == 1


def test_a_mutant_whose_completion_is_fenced_by_id_only_is_caught(store, clock, pipeline):
    fence_by_id_only(store)
    history = zombie_finish(store, clock, pipeline)
    verdict = check_fenced_writes(history, snapshot_of(history))
    assert verdict.status == "fail"
    zombie = verdict.failures[0].events[-1]
    assert (zombie["worker"], zombie["from"], zombie["to"], zombie["token"]) == (
        W1, "fetching", "fetched", 2)


# -- lease-kept ---------------------------------------------------------------------------

def held(*beats, done=3.5, lease=2.0):
    """W1 claims DOC's fetch at 1.0 (lease to 3.0), renews at `beats` [(t, until)], and
    finishes the step at `done`."""
    history = [job(1.0, DOC, "pending", "fetching", W1, 1, old_token=0, claims=1,
                   lease_until=1.0 + lease)]
    history += [job(t, DOC, "fetching", "fetching", W1, 1, claims=1, lease_until=until)
                for t, until in beats]
    history.append(call(1.01, done - 0.01, DOC, "fetch", W1))  # waiting on the model
    history.append(job(done, DOC, "fetching", "fetched", W1, 1))
    return history


def test_a_lapse_while_no_call_was_in_flight_is_a_stalled_process_not_judged():
    history = [job(1.0, DOC, "pending", "fetching", W1, 1, old_token=0, claims=1,
                   lease_until=3.0), job(3.5, DOC, "fetching", "fetched", W1, 1)]
    assert run(check_lease_kept, history).status == "pass"


def test_a_lease_renewed_before_it_runs_out_is_kept():
    verdict = run(check_lease_kept, held((2.0, 4.0), (3.0, 5.0)))
    assert verdict.status == "pass", verdict.reason
    assert verdict.checked == 1


@pytest.mark.parametrize("history", [held((3.5, 5.5), done=4.0), held()],
                         ids=["renewed-too-late", "never-renewed"])
def test_a_lease_that_runs_out_under_its_live_worker_fails(history):
    verdict = run(check_lease_kept, history)
    assert verdict.by_type == {"lease-lapsed": 1}, verdict.reason
    assert "ran out at +" in verdict.failures[0].message


def stall(t, seconds, pid=101):
    return {"t": t, "src": "process", "type": "stall", "pid": pid, "seconds": seconds,
            "waited": seconds, "cause": "run-queue"}


@pytest.mark.parametrize("extra, status", [
    ([stall(1.1, 1.7)], "pass"),             # unrun for all but a beat of its lease
    ([stall(2.4, 0.3)], "fail"),             # a short stall leaves it time to renew
    ([stall(1.1, 1.7, pid=102)], "fail"),    # another process's stall excuses nothing
    ([stall(3.1, 0.3)], "fail"),             # after the lapse: not its cause
    ([{**stall(1.1, 1.7), "waited": 0.5}], "fail"),  # ready but mostly run: not unrun
], ids=["unrun-all-but-a-beat", "a-short-stall", "another-process-stalled",
        "a-stall-after-the-lapse", "a-thin-stall"])
def test_a_lapse_is_excused_only_by_its_holder_left_unrun_while_renewal_was_due(extra, status):
    # W1 (pid 101) never renews its lease to 3.0 and writes at 3.5; a beat is lease/3.
    verdict = run(check_lease_kept, held() + extra)
    assert verdict.status == status, verdict.reason


@pytest.mark.parametrize("granted, status", [(0.5, "fail"), (1.8, "fail"), (2.2, "pass")],
                         ids=["already-over", "a-fifth-of-the-lease", "a-little-short"])
def test_a_claim_that_grants_less_than_half_a_lease_fails(granted, status):
    history = held(done=2.0)
    history[0] = {**history[0], "lease_until": granted}
    verdict = run(check_lease_kept, history)
    assert verdict.status == status, verdict.reason
    if status == "fail":
        assert verdict.by_type == {"claim-lease-short": 1}


def test_a_claim_that_grants_more_than_a_lease_fails():
    history = held(done=2.0)
    history[0] = {**history[0], "lease_until": 1.0 + 2.0 + 0.5}
    assert run(check_lease_kept, history).by_type == {"claim-lease-long": 1}


@pytest.mark.parametrize("granted, kind", [(1.2, "claim-lease-short"), (2.6, "claim-lease-long"),
                                           (1.95, None)],
                         ids=["a-fifth-of-the-outbox-lease", "past-the-outbox-lease", "whole"])
def test_a_senders_claim_grants_its_row_the_outbox_lease(granted, kind):
    # Judged with heartbeat off too: a claim's lease is the claim's, not the heartbeat's.
    claimed = outbox(1.0, 1, DOC, "charge", S1, 1, old_token=0, attempts=1, lease_until=granted)
    sent = outbox(1.1, 1, DOC, "charge", S1, 1, attempts=1, sent_at=1.1, lease_until=0.0)
    settings = {**snapshot()["settings"], "outbox_lease": 1.0, "heartbeat": False}
    verdict = run(check_lease_kept, held(done=2.0) + [claimed, sent], settings=settings)
    assert verdict.by_type == ({kind: 1} if kind else {}), verdict.reason


def test_a_worker_that_claims_while_holding_a_live_lease_abandoned_it():
    """W1 claims DOC (lease to 3.0) and, without finishing or failing it, claims doc-2."""
    history = [job(1.0, DOC, "pending", "fetching", W1, 1, old_token=0, claims=1,
                   lease_until=3.0),
               job(1.5, "doc-2", "pending", "fetching", W1, 1, old_token=0, claims=1,
                   lease_until=3.5)]
    verdict = run(check_lease_kept, history)
    assert verdict.by_type == {"lease-abandoned": 1}, verdict.reason
    assert verdict.failures[0].events == history


def test_a_claim_in_the_commit_that_finishes_the_last_job_is_not_abandonment():
    """Real provider-outage seed 1, a false alarm: W1 finished doc-2's last steps and claimed
    DOC in the same commit, all stamped the same millisecond; DOC's holdings were read first (an
    earlier claim of it by W2), so W1's claim of DOC looked older than its claim of doc-2."""
    history = [job(0.5, DOC, "pending", "fetching", W2, 1, old_token=0, claims=1,
                   lease_until=2.5),
               job(0.6, DOC, "fetching", "pending", W2, 1, next_run_at=0.7),
               job(1.5, "doc-2", "pending", "fetching", W1, 1, old_token=0, claims=1,
                   lease_until=3.5),
               job(2.0, "doc-2", "fetching", "fetched", W1, 1),
               job(2.0, "doc-2", "fetched", "extracting", W1, 1, claims=1, lease_until=4.0),
               job(2.0, "doc-2", "extracting", "extracted", W1, 1),
               job(2.0, DOC, "pending", "fetching", W1, 2, old_token=1, claims=1,
                   lease_until=4.0)]
    verdict = run(check_lease_kept, history)
    assert "lease-abandoned" not in verdict.by_type, verdict.reason


@pytest.mark.parametrize("between", [
    [job(1.2, DOC, "fetching", "fetched", W1, 1)],                       # finished it
    [job(1.2, DOC, "fetching", "fetching", W2, 2, claims=2, lease_until=4.0)],  # taken over
    [nemesis(1.2, "expire", leases=1),
     job(1.2, DOC, "fetching", "fetching", "nemesis", 1, lease_until=1.199)],   # cut short
], ids=["finished", "taken-over", "expired-by-the-harness"])
def test_a_claim_after_the_last_lease_ended_is_not_abandonment(between):
    history = [job(1.0, DOC, "pending", "fetching", W1, 1, old_token=0, claims=1,
                   lease_until=3.0)] + between + [
        job(1.5, "doc-2", "pending", "fetching", W1, 1, old_token=0, claims=1,
            lease_until=3.5)]
    verdict = run(check_lease_kept, history)
    assert "lease-abandoned" not in verdict.by_type, verdict.reason


def test_a_renewal_past_one_lease_ahead_fails():
    verdict = run(check_lease_kept, held((2.0, 6.0)))
    assert verdict.by_type == {"lease-overextended": 1}


@pytest.mark.parametrize("fault", [
    [nemesis(2.5, "expire", leases=1)],
    [nemesis(2.0, "pause", pid=101), nemesis(3.2, "resume", pid=101)],
    [nemesis(2.8, "contention", seconds=0.6), nemesis(3.4, "contention_end")],
], ids=["expired-by-the-nemesis", "holder-paused", "write-lock-held"])
def test_a_lease_the_harness_took_on_purpose_is_not_judged(fault):
    verdict = run(check_lease_kept, held((3.5, 5.5), done=4.0) + fault)
    assert verdict.status == "pass", verdict.reason


def test_lease_kept_is_unknown_without_heartbeat():
    settings = {**snapshot()["settings"], "heartbeat": False}
    assert run(check_lease_kept, held(), settings=settings).status == "unknown"


# -- fenced-writes: calls while working on the step ---------------------------------------

def taken_over_then(call_at):
    """W1 claims DOC's fetch (lease to 2.0); the lease lapses and W2 claims at 2.5; W1
    calls the provider for fetch at `call_at`, its step not yet ended by its own write."""
    return [job(1.0, DOC, "pending", "fetching", W1, 1, old_token=0, claims=1, lease_until=2.0),
            job(2.5, DOC, "fetching", "fetching", W2, 2, old_token=1, claims=2,
                lease_until=4.5),
            call(call_at, call_at + 0.01, DOC, "fetch", W1),
            call(2.6, 2.61, DOC, "fetch", W2), job(2.7, DOC, "fetching", "fetched", W2, 2)]


@pytest.mark.parametrize("call_at", [1.5, 2.2, 2.9], ids=[
    "under-its-lease", "after-its-lease-ran-out", "after-another-worker-took-it"])
def test_a_call_while_the_worker_works_on_its_claimed_step_passes(call_at):
    # A lease taken from it is not the worker's to know until it writes: fenced-writes
    # judges that write.
    verdict = run(check_fenced_writes, taken_over_then(call_at))
    assert "call-without-lease" not in verdict.by_type, verdict.reason
    assert verdict.metrics["calls_judged"] == 2


def test_a_call_for_a_step_the_worker_never_claimed_fails():
    # W1 finished fetch, its move on to extract was fenced out, and it calls for extract.
    history = [job(1.0, DOC, "pending", "fetching", W1, 1, old_token=0, claims=1,
                   lease_until=3.0), call(1.1, 1.2, DOC, "fetch", W1),
               job(1.3, DOC, "fetching", "fetched", W1, 1), call(1.4, 1.5, DOC, "extract", W1)]
    verdict = run(check_fenced_writes, history)
    assert verdict.by_type == {"call-without-lease": 1}
    assert "never claimed that step" in verdict.failures[0].message


def test_a_call_after_the_workers_own_write_ended_the_step_fails():
    history = [job(1.0, DOC, "pending", "fetching", W1, 1, old_token=0, claims=1,
                   lease_until=3.0), call(1.1, 1.2, DOC, "fetch", W1),
               job(1.3, DOC, "fetching", "pending", W1, 1, attempts=1, next_run_at=5.0,
                   last_error="fetch: RetryableError"), call(1.4, 1.5, DOC, "fetch", W1)]
    verdict = run(check_fenced_writes, history)
    assert verdict.by_type == {"call-without-lease": 1}
    assert "its own write" in verdict.failures[0].message


def test_a_claim_the_harness_paused_before_its_commit_may_come_out_short():
    # The sender read its clock at 1.0, was paused 1.1-2.4, and committed at 2.45.
    pid = int(S1.split(":")[2])
    claimed = outbox(2.45, 1, DOC, "charge", S1, 1, old_token=0, attempts=1, lease_until=2.0)
    sent = outbox(2.5, 1, DOC, "charge", S1, 1, attempts=1, sent_at=2.5, lease_until=0.0)
    settings = {**snapshot()["settings"], "outbox_lease": 1.0}
    history = held(done=2.0) + [claimed, sent]
    assert run(check_lease_kept, history, settings=settings).by_type == {
        "claim-lease-short": 1}
    paused = [nemesis(1.1, "pause", pid=pid), nemesis(2.4, "resume", pid=pid)]
    verdict = run(check_lease_kept, history + paused, settings=settings)
    assert verdict.status == "pass", verdict.reason


def test_a_claim_that_waited_on_a_paused_lock_holder_may_come_out_short():
    """Real everything seed 6 under load: a worker paused (SIGSTOP) inside its transaction
    held the write lock; a sender's outbox claim, its clock read before the wait, committed
    when the worker resumed, with less than half its lease left."""
    pid = int(W2.split(":")[2])
    claimed = outbox(2.45, 1, DOC, "charge", S1, 1, old_token=0, attempts=1, lease_until=2.0)
    sent = outbox(2.5, 1, DOC, "charge", S1, 1, attempts=1, sent_at=2.5, lease_until=0.0)
    settings = {**snapshot()["settings"], "outbox_lease": 1.0}
    history = held(done=1.05) + [claimed, sent]
    paused = [nemesis(1.1, "pause", pid=pid), nemesis(2.4, "resume", pid=pid)]
    verdict = run(check_lease_kept, history + paused, settings=settings)
    assert verdict.status == "pass", verdict.reason
    # A pause during which others went on committing held no lock.
    busy = [job(1.5, "doc-9", None, "pending", "submit", 0, op="insert")]
    verdict = run(check_lease_kept, history + paused + busy, settings=settings)
    assert verdict.by_type == {"claim-lease-short": 1}


# -- an engine whose leases run from their write ---------------------------------------------

FROM_WRITE = {**snapshot()["settings"], "lease_from_write": True}
LOCK_HELD = [nemesis(0.5, "contention", seconds=0.6), nemesis(1.1, "contention_end")]


@pytest.mark.parametrize("granted, faults, status", [
    (3.0, [], "pass"),
    (2.9, [], "pass"),                   # within the simulation's slack (0.15 s)
    (2.8, [], "fail"),
    (2.8, LOCK_HELD, "fail"),            # it ages its clock by the lock wait: no excuse
    (2.8, [nemesis(0.9, "pause", pid=101), nemesis(1.0, "resume", pid=101)], "pass"),
    (2.8, [stall(0.8, 0.2)], "pass"),    # unrun between its clock read (0.8) and commit
    (2.8, [{**stall(0.8, 0.2), "waited": 0.02}], "fail"),  # mostly run: no excuse
    (0.5, [stall(0.8, 0.2)], "fail"),    # a lease ending before the claim: no stall that long
], ids=["whole", "within-slack", "short", "short-after-a-lock-wait", "claimant-paused",
        "claimant-unrun", "claimant-thinly-stalled", "a-lease-in-the-past"])
def test_a_claim_of_an_engine_whose_leases_run_from_their_write_grants_a_whole_lease(
        granted, faults, status):
    history = held(done=2.0)
    history[0] = {**history[0], "lease_until": granted}
    verdict = run(check_lease_kept, history + faults, settings=FROM_WRITE, clock="virtual")
    assert verdict.status == status, verdict.reason
    if status == "fail":
        assert verdict.by_type == {"claim-lease-short": 1}
    # Without the promise, only half a lease is expected.
    if granted >= 1.0 + 1.0:
        assert run(check_lease_kept, history + faults, clock="virtual").status == "pass"


def test_a_renewal_of_an_engine_whose_leases_run_from_their_write_renews_a_whole_lease():
    short = held((2.0, 3.5), done=2.5)
    verdict = run(check_lease_kept, short, settings=FROM_WRITE, clock="virtual")
    assert verdict.by_type == {"renewal-short": 1}, verdict.reason
    assert verdict.failures[0].events == [short[1]]
    assert run(check_lease_kept, held((2.0, 3.95), done=2.5), settings=FROM_WRITE,
               clock="virtual").status == "pass"
    # A real run allows the machine a second.
    assert run(check_lease_kept, short, settings=FROM_WRITE).status == "pass"
    # The harness's own writes to a lease (a forced expiry) are not renewals.
    expired = held(done=2.5) + [nemesis(2.0, "expire", leases=1),
                                job(2.0, DOC, "fetching", "fetching", "nemesis", 1,
                                    lease_until=1.999)]
    assert "renewal-short" not in run(check_lease_kept, expired, settings=FROM_WRITE,
                                      clock="virtual").by_type


# -- fenced-writes: a call begun after the lease ended ---------------------------------------

def begun_at(started: float, *renewals) -> list:
    """W1 claims DOC at 1.0 (lease to 3.0) and records a call of fetch begun at `started`."""
    history = [job(1.0, DOC, "pending", "fetching", W1, 1, old_token=0, claims=1,
                   lease_until=3.0)]
    history += [job(t, DOC, "fetching", "fetching", W1, 1, claims=1, lease_until=until)
                for t, until in renewals]
    history += [call(started + 0.01, started + 0.05, DOC, "fetch", W1),
                spend(started + 0.06, DOC, "fetch", W1, 1, started=started),
                job(started + 0.06, DOC, "fetching", "fetched", W1, 1)]
    return history


@pytest.mark.parametrize("started, renewals, status", [
    (2.9, (), "pass"),
    (3.2, (), "fail"),                  # paused before the call, and called all the same
    (3.2, ((2.0, 4.0),), "pass"),       # a renewal had moved the lease on
], ids=["inside", "after-the-lease", "after-a-renewal"])
def test_a_worker_begins_no_call_after_its_lease_ended(started, renewals, status):
    history = begun_at(started, *renewals)
    verdict = run(check_fenced_writes, history)
    assert verdict.status == status, verdict.reason
    if status == "fail":
        assert verdict.by_type == {"call-after-lease": 1}
        assert verdict.failures[0].events == [history[0], history[-2]]


@pytest.mark.parametrize("claimed_at, status", [(2.6, "pass"), (2.4, "fail")],
                         ids=["within-the-slack", "before-the-slack"])
def test_a_worker_that_gave_its_write_up_within_its_slack_did_not_abandon_the_lease(
        claimed_at, status):
    """The engine gives a write the lock keeps out up at most finish_retry_slack (0.5 s)
    before the lease ends; claiming the next job then is not walking away from the first."""
    history = [job(1.0, DOC, "pending", "fetching", W1, 1, old_token=0, claims=1,
                   lease_until=3.0),
               job(claimed_at, "doc-2", "pending", "fetching", W1, 1, old_token=0, claims=1,
                   lease_until=claimed_at + 2.0)]
    settings = {**snapshot()["settings"], "finish_retry_slack": 0.5}
    verdict = run(check_lease_kept, history, settings=settings)
    assert ("lease-abandoned" in verdict.by_type) == (status == "fail"), verdict.reason
