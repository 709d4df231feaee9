"""claims-prompt on hand-made histories: claims take the oldest due job first, and a free
worker does not leave due work waiting past the engine's claim latency."""
from __future__ import annotations

import pytest
from builders import (S1, W1, W2, call, job, memo, nemesis, outbox, process,
                      snapshot_with_effects)

from chaos.checkers.ops import RUN_SLACK, SIM_SLACK
from chaos.checkers.promptness import check_claims_prompt

LATENCY = 0.03


def declared(history, **overrides):
    snap = snapshot_with_effects(history)
    snap["settings"] = {**snap["settings"], "claim_order": "due", "claim_latency": LATENCY,
                        **overrides.pop("settings", {})}
    snap.update(overrides)
    return check_claims_prompt(history, snap)


def submitted(t, job_id):
    return job(t, job_id, None, "pending", "submitter", 0, op="insert", next_run_at=t)


def claim(t, worker, job_id, token=1, lease=2.0):
    return job(t, job_id, "pending", "fetching", worker, token, old_token=token - 1, claims=1,
               lease_until=t + lease)


def done(t, worker, job_id, token=1):
    return job(t, job_id, "fetching", "delivered", worker, token)


def retry(t, worker, job_id, wait, token=1):
    """The worker lets the job go with a backoff: due again at t + wait."""
    return job(t, job_id, "fetching", "pending", worker, token, attempts=1, next_run_at=t + wait,
               last_error="fetch: RetryableError")


# -- claim order ---------------------------------------------------------------------------

def two_due_jobs():
    """Job a is due from 1.0, job b from 2.0; W1 claims at 3.0."""
    return [submitted(1.0, "a"), submitted(2.0, "b")]


def test_a_claim_of_the_oldest_due_job_passes():
    history = two_due_jobs() + [claim(3.0, W1, "a"), claim(3.01, W2, "b"), done(3.1, W1, "a"),
                                done(3.2, W2, "b")]
    verdict = declared(history)
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["jobs"]["order_checked"] == 2


def test_a_claim_that_skips_an_older_due_job_fails():
    history = two_due_jobs() + [claim(3.0, W1, "b")]
    verdict = declared(history)
    assert verdict.by_type["claimed-out-of-order"] == 1
    assert "job a" in verdict.failures[0].message and verdict.failures[0].events == [history[-1]]


def test_a_job_whose_backoff_has_not_run_out_does_not_count_as_skipped():
    # a's retry is due at 3.5: at 3.0 only b is due, whatever a's history.
    history = [submitted(1.0, "a"), claim(1.1, W1, "a"), retry(1.2, W1, "a", 2.3),
               submitted(2.0, "b"), claim(3.0, W2, "b"), claim(3.5, W1, "a", token=2),
               done(3.6, W1, "a", token=2), done(3.7, W2, "b")]
    assert declared(history).status == "pass"


def test_a_lapsed_lease_is_due_work_too():
    # W1 died holding a (lease to 2.0); at 4.0 W2 claims the newer b first.
    history = [submitted(0.5, "a"), claim(1.0, W1, "a", lease=1.0), submitted(3.0, "b"),
               claim(4.0, W2, "b")]
    verdict = declared(history)
    assert verdict.by_type == {"claimed-out-of-order": 1}


# -- claim order where a claim skips rows other transactions hold (FOR UPDATE SKIP LOCKED) --

def skip_locked(history):
    return declared(sorted(history, key=lambda e: e["t"]),
                    settings={"claim_order": "due-unless-locked"})


W3 = "worker:host:103:eeee"


def lapsed_then_skipped(claimed_at=3.0):
    """W3 claimed job a at 0.5 with a 1 s lease and lapsed; b is due from 2.0; W1 claims b at
    `claimed_at`, passing over a."""
    return [submitted(0.4, "a"), claim(0.5, W3, "a", lease=1.0), submitted(2.0, "b"),
            claim(claimed_at, W1, "b")]


WROTE, HELD = "another writer wrote it then", "a process that could not go on may have held it"


@pytest.mark.parametrize("near, reason", [
    ([claim(3.02, W2, "a", token=2)], WROTE),               # another claimer took it at once
    ([memo(2.9, "a", "fetch", W3, 1)], WROTE),              # its holder's memo: a share lock
    ([nemesis(2.5, "pause", pid=103), nemesis(3.5, "resume", pid=103)], HELD),
    ([process(3.1, "exit", "worker-3", 103, signal="SIGKILL")], HELD),  # died in a transaction
    ([{"t": 2.9, "src": "process", "type": "stall", "pid": 103, "seconds": 0.5}], HELD),
    ([nemesis(2.0, "row_lock", table="job", row="a"),
      nemesis(3.5, "row_lock_end", table="job", row="a")], "the harness held its row locked"),
], ids=["claimed-by-another", "written-by-its-holder", "a-process-paused", "a-process-died",
        "a-process-stalled", "the-harness-row-lock"])
def test_a_job_passed_over_where_a_lock_could_have_held_it_is_excused(near, reason):
    verdict = skip_locked(lapsed_then_skipped() + near)
    assert verdict.status == "pass", verdict.reason
    assert verdict.metrics["jobs"]["order_excused_for_a_lock"] == 1
    assert verdict.metrics["jobs"]["order_excuses"] == {reason: 1}


@pytest.mark.parametrize("far", [
    [],
    [memo(3.01, "a", "fetch", W1, 1)],                      # the claimer's own write
    [claim(3.5, W2, "a", token=2)],                         # a write well after the claim
    [memo(2.5, "a", "fetch", W3, 1)],                       # a write well before it
    [nemesis(0.6, "pause", pid=103), nemesis(2.0, "resume", pid=103)],  # over before it
    [{"t": 2.0, "src": "process", "type": "stall", "pid": 103, "seconds": 0.5}],
    [process(2.0, "exit", "worker-3", 103, signal="SIGKILL")],          # dead long before
    [nemesis(0.5, "row_lock", table="job", row="x"),
     nemesis(3.5, "row_lock_end", table="job", row="x")],   # another row's lock
], ids=["nothing", "its-own-write", "a-write-after", "a-write-before", "a-pause-over",
        "a-stall-over", "a-death-long-before", "another-rows-lock"])
def test_what_could_not_have_held_the_job_locked_excuses_nothing(far):
    verdict = skip_locked(lapsed_then_skipped() + far)
    assert verdict.by_type.get("claimed-out-of-order") == 1, verdict.reason
    assert "nothing names it locked, and processes that could not go on may have held 0" \
        in verdict.failures[0].message


@pytest.mark.parametrize("slots, status", [(1, "fail"), (2, "pass")])
def test_a_stopped_process_excuses_as_many_jobs_as_it_has_slots(slots, status):
    # a and c are due before b; one process is paused across the claim of b.
    history = lapsed_then_skipped() + [submitted(1.5, "c"), nemesis(2.5, "pause", pid=103),
                                       nemesis(3.5, "resume", pid=103)]
    verdict = declared(sorted(history, key=lambda e: e["t"]),
                       settings={"claim_order": "due-unless-locked", "slots": slots})
    assert verdict.status == status, verdict.reason
    if status == "fail":
        assert "(2 due earlier in all; nothing names it locked, and processes that could " \
               "not go on may have held 1 row(s) then)" in verdict.failures[0].message


def test_an_unknown_claim_order_is_refused_naming_the_setting():
    from chaos.contract import EngineSettings
    with pytest.raises(ValueError, match="claim_order must be 'due', 'due-unless-locked' or "
                                         "None, got 'oldest'"):
        EngineSettings(lease=1.0, claim_order="oldest")


# -- claim latency -------------------------------------------------------------------------

def free_worker_and_waiting_job(claimed_at):
    """W1 finishes job x at 1.0 and has nothing to do; job a is due from 1.0 and is claimed
    (by W2) at `claimed_at`."""
    return [submitted(0.0, "x"), claim(0.1, W1, "x"),
            done(1.0, W1, "x"), submitted(1.0, "a"), claim(claimed_at, W2, "a"),
            done(claimed_at + 0.1, W2, "a")]


def test_due_work_beside_a_free_worker_past_the_latency_fails():
    verdict = declared(free_worker_and_waiting_job(1.0 + LATENCY + RUN_SLACK + 0.5))
    assert verdict.by_type == {"due-job-waited": 1}, verdict.reason
    assert W1 in verdict.failures[0].message


def test_a_claim_within_latency_and_slack_passes():
    verdict = declared(free_worker_and_waiting_job(1.0 + LATENCY + RUN_SLACK - 0.1))
    assert verdict.status == "pass", verdict.reason


def test_the_simulation_allows_only_its_own_slack():
    late = free_worker_and_waiting_job(1.0 + LATENCY + SIM_SLACK + 0.1)
    assert declared(late, clock="virtual").by_type == {"due-job-waited": 1}
    assert declared(late).status == "pass"  # the same wait is within a real machine's slack


@pytest.mark.parametrize("excuse", ["pause", "contention", "stall"])
def test_a_worker_the_harness_stopped_is_not_free(excuse):
    history = free_worker_and_waiting_job(4.0)
    pid = int(W1.split(":")[2])
    if excuse == "pause":
        cut = [nemesis(1.1, "pause", pid=pid), nemesis(3.9, "resume", pid=pid)]
    elif excuse == "contention":
        cut = [nemesis(1.1, "contention"), nemesis(3.9, "contention_end")]
    else:
        cut = [{"t": 1.1, "src": "process", "type": "stall", "pid": pid, "seconds": 2.8}]
    verdict = declared(sorted(history + cut, key=lambda e: e["t"]))
    assert verdict.status == "pass", verdict.reason


@pytest.mark.parametrize("seconds, waited, status", [
    (2.8, 2.8, "pass"),     # unrun nearly all the wait: what is left is within the bound
    (2.8, 1.0, "fail"),     # ready for 2.8 s but run for most of it: it could have claimed
    (0.5, 0.5, "fail"),     # a short stall inside a long wait excuses only itself
], ids=["unrun-throughout", "a-thin-stall", "a-short-stall"])
def test_a_stall_takes_off_only_the_time_it_left_the_worker_unrun(seconds, waited, status):
    # The job waits 1.0..4.0 beside W1; the bound is the latency plus a 1 s slack.
    pid = int(W1.split(":")[2])
    cut = [{"t": 1.1, "src": "process", "type": "stall", "pid": pid, "seconds": seconds,
            "waited": waited, "cause": "run-queue"}]
    history = sorted(free_worker_and_waiting_job(4.0) + cut, key=lambda e: e["t"])
    assert declared(history).status == status


def test_a_worker_on_a_skewed_clock_is_not_counted_free():
    pid = int(W1.split(":")[2])
    history = [nemesis(0.0, "skew", pid=pid)] + free_worker_and_waiting_job(4.0)
    assert declared(history).status == "pass"


def test_a_worker_moving_on_under_its_lease_is_busy():
    # W1 finishes fetch and continues to extract under the same lease: not free.
    history = [submitted(0.0, "x"), claim(0.1, W1, "x"),
               job(1.0, "x", "fetching", "fetched", W1, 1),
               job(1.0, "x", "fetched", "extracting", W1, 1, lease_until=3.0),
               submitted(1.0, "a"), claim(4.0, W2, "a"), done(4.1, W2, "a"),
               job(4.2, "x", "extracting", "delivered", W1, 1)]
    assert declared(history).status == "pass"


def test_an_engine_that_declares_no_claim_rule_is_unknown():
    history = free_worker_and_waiting_job(9.0)
    verdict = declared(history, settings={"claim_order": None, "claim_latency": None})
    assert verdict.status == "unknown" and "declares neither" in verdict.reason


# -- the outbox: rows and senders --------------------------------------------------------------

S2 = "sender:host:202:dddd"


def queued(t, row, job_id="a"):
    return outbox(t, row, job_id, "charge", W1, 1, op="insert", next_attempt_at=t)


def send_claim(t, sender, row, job_id="a", token=1):
    return outbox(t, row, job_id, "charge", sender, token, old_token=token - 1, attempts=1,
                  lease_until=t + 2.0, next_attempt_at=t + 2.0)


def sent(t, sender, row, job_id="a", token=1):
    return outbox(t, row, job_id, "charge", sender, token, attempts=1, sent_at=t,
                  lease_until=0.0)


def test_a_sender_that_skips_an_older_due_row_fails():
    history = [queued(1.0, 1, "a"), queued(2.0, 2, "b"), send_claim(3.0, S1, 2, "b"),
               sent(3.1, S1, 2, "b"), send_claim(3.2, S1, 1, "a"), sent(3.3, S1, 1, "a")]
    verdict = declared(history, settings={"outbox_lease": 2.0})
    assert verdict.by_type == {"claimed-out-of-order": 1}, verdict.reason
    assert "outbox row 1" in verdict.failures[0].message


def test_a_due_row_beside_a_free_sender_past_the_latency_fails():
    history = [queued(0.0, 1, "x"), send_claim(0.1, S1, 1, "x"), sent(0.2, S1, 1, "x"),
               queued(0.5, 2, "a"), send_claim(3.0, S2, 2, "a"), sent(3.1, S2, 2, "a")]
    verdict = declared(history, settings={"outbox_lease": 2.0})
    assert verdict.by_type == {"due-row-waited": 1}, verdict.reason
    assert S1 in verdict.failures[0].message
    prompt = history[:4] + [send_claim(0.55, S2, 2, "a"), sent(0.6, S2, 2, "a")]
    assert declared(prompt, settings={"outbox_lease": 2.0}).status == "pass"


def test_a_row_queued_by_a_writer_paused_before_its_commit_is_due_from_the_commit():
    # W1 queues row 2 at 0.5 and is paused (SIGSTOP) before it commits; nobody else can write
    # until it resumes at 2.9: S1, free since 0.2, is not to blame.
    pid = int(W1.split(":")[2])
    history = [queued(0.0, 1, "x"), send_claim(0.1, S1, 1, "x"), sent(0.2, S1, 1, "x"),
               queued(0.5, 2, "a"), nemesis(0.55, "pause", pid=pid),
               nemesis(2.9, "resume", pid=pid), send_claim(2.95, S1, 2, "a"),
               sent(3.0, S1, 2, "a")]
    verdict = declared(sorted(history, key=lambda e: e["t"]), settings={"outbox_lease": 2.0})
    assert verdict.status == "pass", verdict.reason
    unpaused = [e for e in history if e.get("src") != "nemesis"]
    assert declared(unpaused, settings={"outbox_lease": 2.0}).by_type == {"due-row-waited": 1}


def test_a_store_held_up_for_every_writer_between_real_processes_frees_no_worker():
    """Real outbox-ambiguous seed 1 on a machine at load 8, a false alarm: nothing committed
    for 1.35 s while a sender that had given up a request waited to write its failure; the
    free sender beside it could not have claimed either. A quiet store alone is no excuse."""
    stalled = free_worker_and_waiting_job(2.53) + [
        claim(0.5, W2, "y"), call(0.9, 1.05, "y", "fetch", W2), done(2.52, W2, "y")]
    stalled = sorted(stalled, key=lambda e: e["t"])
    assert declared(stalled).status == "pass"
    # the same wait in the simulation, where the store has no such stalls, fails
    assert "due-job-waited" in declared(stalled, clock="virtual").by_type
    # and a quiet store with no one waiting to write is not held up
    assert declared(free_worker_and_waiting_job(2.53)).by_type == {"due-job-waited": 1}
