"""Checkers of money and memos: a committed step is never billed again (no-rebill-after-commit),
memos are single and complete (memo-consistent), and every billed cent is either committed or
attributed to a cause (cost-accounted).

Also owns the shared reading of the provider ledger against the engine's operations: calls per (job, step),
memo lifetimes, which call a memo came from, which spend record a call got.
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any

from chaos.history import Event
from chaos.engines.schema import reads
from chaos.checkers.calls import Key, memoized_call, needs_ledger
from chaos.checkers.index import readings
from chaos.checkers.memos import Memos
from chaos.checkers.ops import (TOL, capable, ends_an_operation, is_engine, is_job, is_operator,
                                is_worker, machine_slack, takes_lease)
from chaos.checkers.tokens import fenced_out, token_order
from chaos.checkers.transitions import JobIndex, clock_of, is_update, job_ops
from chaos.checkers.verdict import Verdict

COST_TOLERANCE = 1e-9
#: The run-queue watch's sampling period (chaos.run.runqueue.INTERVAL): a stall it records may
#: begin or end up to one sample from when the process was in fact left unrun.
STALL_SAMPLE = 0.05


# -- no-rebill-after-commit -----------------------------------------------------------------

def check_no_rebill_after_commit(history: list[Event], snapshot: dict[str, Any]) -> Verdict:
    """No provider call for (job, step) starts after that step's memo committed.

    A call violates when memo.t + TOL < call.t_start < (operator's memo delete).t - TOL. A call
    that started before the memo committed and ended after it is duplicate spend, not a
    re-bill: counted as overlapping_duplicate_calls and left to lease-exclusive/cost-accounted.

    One race is the engine's to lose, not to prevent: a worker fenced out of the job commits
    its memo (first writer wins) just after the current owner, which claimed before that
    memo existed, last looked for it. A call starting within RACE_WINDOW of such a memo, by
    a worker whose claim came before the memo and fenced the memo's writer out, is counted
    as zombie_memo_races (duplicate spend), not failed (opaque tokens: `tokens.fenced_out`;
    a memo whose token no claim carried leaves its call unjudged). And a call by a worker
    whose lease had been taken over when the call started (a zombie, paused past its lease) is
    the lease's failure, not the memo's: counted as zombie_calls and left to lease-exclusive
    and cost-accounted (lost-lease waste).
    """
    verdict = Verdict("no-rebill-after-commit")
    shared = readings(history)
    calls = shared.calls
    why = needs_ledger(history, calls)
    if why:
        return verdict.unknown(why)
    memos, index, at = shared.memos, shared.jobs, clock_of(history)
    spends, order = shared.spends, token_order(snapshot)
    after, billed_after, overlapping, stale_reads, races, zombies, untold = 0, 0.0, 0, 0, 0, 0, 0
    for key, group in calls.items():
        periods = memos.periods.get(key, ())
        for call in group:
            verdict.checked += 1
            # The worker's own start (its spend record) when it has one: a loaded provider
            # stamps t_start when it gets to the request, which can be well after it was sent.
            spend = spends.get(id(call))
            began = min(call["t_start"], spend["started"]) if spend else call["t_start"]
            for insert, delete in periods:
                committed, ends = memos.committed(insert), delete["t"] if delete else math.inf
                if committed + TOL < began < ends - TOL:
                    claim = index.claim_of(call["worker"], key[0], call["t_start"])
                    stale = claim is not None and claim["t"] < committed
                    race = stale and _zombie_race(insert, committed, claim, began,
                                                  index.bumps.get(key[0], []), order)
                    if race or race is None:  # None: a race or a re-bill, untold
                        races, untold = races + bool(race), untold + (race is None)
                        break
                    if claim is not None and index.taken_from(call["worker"], claim,
                                                              call["t_start"]):
                        zombies += 1  # a fenced-out worker's call: lost-lease waste
                        break
                    after += 1
                    billed_after += call["billed"] or 0.0
                    stale_reads += stale
                    _rebilled(verdict, at, call, insert, committed, claim if stale else None)
                    break
                if call["t_start"] <= committed + TOL < call["t_end"]:
                    overlapping += 1
                    break
    verdict.metrics = {"calls": verdict.checked, "calls_after_commit": after,
                       "billed_after_commit": round(billed_after, 9),
                       "calls_after_commit_claimed_before": stale_reads,
                       "overlapping_duplicate_calls": overlapping,
                       "zombie_memo_races": races, "zombie_calls": zombies}
    if untold and verdict.valid is True:
        verdict.unknown(f"{untold} call(s) began within {RACE_WINDOW} s of a memo under an "
                        "opaque token no claim carried: a zombie's race or a re-bill, untold")
    return verdict


RACE_WINDOW = 0.1  # seconds between an owner's last look for the memo and its call's start


def _zombie_race(memo: Event, committed: float, claim: Event, began: float,
                 claims: list[Event], order: str) -> bool | None:
    """The memo's writer was fenced out by the caller's claim (`claims`: the job's claims
    in commit order), and the call began so soon after the memo committed that the caller's
    last look could not have seen it; None when the writer's claim cannot be placed."""
    if began - committed >= RACE_WINDOW:
        return False
    return fenced_out(memo.get("token"), claim, claims, order)


def _rebilled(verdict: Verdict, at, call: Event, memo: Event, committed: float,
              stale_claim: Event | None) -> None:
    message = (f"job {call['job']}: provider call for {call['step']!r} by {call['worker']} "
               f"started at {at(call['t_start'])}, after the step's memo committed at "
               f"{at(committed)} (by {memo['worker']}); billed {call['billed']}")
    if stale_claim is not None:
        message += (f"; its claim at {at(stale_claim['t'])} came before the memo: the worker "
                    "acted on the memos it read when it claimed")
    witnesses = [memo, call] + ([stale_claim] if stale_claim else [])
    verdict.fail("rebilled-after-commit", message, *witnesses)


# -- memo-consistent ------------------------------------------------------------------------

def check_memo_consistent(history: list[Event], snapshot: dict[str, Any]) -> Verdict:
    """One live memo per (job, step); a job's state implies its earlier steps' memos; a memo
    hit never calls the provider.

    - an audit memo insert while that (job, step) has a live memo (no delete since) fails;
      a memo is deleted only by an operator (see `deleted_by`);
    - in the snapshot, a job in step i's ready, working or parked state has the memos of steps
      0..i-1; in step i's done state (or the last step's, e.g. delivered) those of 0..i;
    - when worker W enters step S (a claim, or a kept job moving on) holding a claim taken
      after (J, S)'s memo committed, W makes no provider call for (J, S) between entering
      and its next job write for J.
    """
    verdict = Verdict("memo-consistent")
    memos, at = readings(history).memos, clock_of(history)
    if not memos.count and snapshot["memos"]:
        return verdict.unknown("no memo operations, yet the snapshot has memos")
    verdict.checked = memos.count
    for live, second in memos.conflicts:
        verdict.fail("second-memo", f"job {second['job']}: a second memo for "
                     f"{second['step']!r} was inserted at {at(second['t'])} by "
                     f"{second['worker']} while the one from {at(live['t'])} by "
                     f"{live['worker']} was live", live, second)
    for delete, by in deleted_by(history):
        if by is None or not is_operator(by):
            verdict.fail("memo-deleted-without-operator", f"job {delete['job']}: memo for "
                         f"{delete['step']!r} deleted at {at(delete['t'])}, and the job's next "
                         f"write is {'none' if by is None else 'by ' + str(by['worker'])}, not an "
                         "operator's resolve", *[e for e in (delete, by) if e])
    jobs = job_ops(history)
    _check_implied_memos(verdict, snapshot, jobs)
    hits = _check_memo_hits(verdict, at, snapshot, jobs, memos, readings(history).calls)
    verdict.metrics = {"memo_events": memos.count, "second_memos": len(memos.conflicts),
                       "snapshot_jobs": len(snapshot["jobs"]), "memo_hit_entries": hits}
    return verdict


def deleted_by(history: list[Event]) -> list[tuple[Event, Event | None]]:
    """(memo delete, the job's next job write or None) for every memo delete.

    An observer may not know who deleted a row (a trigger sees the row's writer, not its
    deleter), so a delete is attributed to the job write that follows it: an operator's
    resolve deletes the memo and moves the job in one transaction.
    """
    pending: dict[str, list[Event]] = defaultdict(list)
    found = []
    for e in history:
        if is_engine(e, "memo") and e["op"] == "delete":
            pending[e["job"]].append(e)
        elif is_job(e) and pending.get(e["job"]):
            found += [(d, e) for d in pending.pop(e["job"])]
    return found + [(d, None) for ds in pending.values() for d in ds]


def required_memos(pipeline: dict) -> dict[str, list[str]]:
    """state -> the steps whose memos a job in that state must have: the steps before it
    that the pipeline says record one."""
    steps = pipeline["steps"]
    needed: dict[str, list[str]] = {}
    for i, step in enumerate(steps):
        before = [s["name"] for s in steps[:i] if s.get("memo", True)]
        for state in (step["ready"], step["working"], step["parked"], step.get("alternate")):
            if state and state not in needed:
                needed[state] = before
        needed[step["done"]] = before + ([step["name"]] if step.get("memo", True) else [])
    return needed


def _check_implied_memos(verdict: Verdict, snapshot: dict, jobs: list[Event]) -> None:
    needed = required_memos(snapshot["pipeline"])
    have = {(m["job"], m["step"]) for m in snapshot["memos"]}
    last = {e["job"]: e for e in jobs}
    for job, row in sorted(snapshot["jobs"].items()):
        verdict.checked += 1
        missing = [s for s in needed.get(row["state"], ()) if (job, s) not in have]
        if missing:
            witness = [last[job]] if job in last else []
            verdict.fail("missing-memo", f"job {job}: is {row['state']!r} but has no memo for "
                         f"{', '.join(repr(s) for s in missing)}", *witness)


def _check_memo_hits(verdict: Verdict, at, snapshot: dict, jobs: list[Event], memos: Memos,
                     calls: dict[Key, list[Event]]) -> int:
    """Fail calls made for a step whose memo the worker held at its claim; return entries."""
    step_of = {s["working"]: s["name"] for s in snapshot["pipeline"]["steps"]}
    by_writer: dict[tuple, list[Event]] = defaultdict(list)
    for e in jobs:
        if is_update(e) and is_worker(e):
            by_writer[(e["job"], e["worker"])].append(e)
    entries = 0
    for (job, worker), events in by_writer.items():
        claimed = None
        for i, e in enumerate(events):
            if takes_lease(e):
                claimed = e
            moved = e is claimed or e["from"] != e["to"]
            if e["to"] not in step_of or claimed is None or not moved:
                continue  # not entering a step (a heartbeat, a park, a write before any claim)
            step = step_of[e["to"]]
            memo = memos.live_at((job, step), claimed["t"])
            if memo is None:
                continue
            entries += 1
            until = events[i + 1]["t"] if i + 1 < len(events) else math.inf
            for call in calls.get((job, step), ()):
                if call["worker"] == worker and e["t"] - TOL <= call["t_start"] <= until + TOL:
                    verdict.fail("memo-hit-called", f"job {job}: {worker} entered {step!r} at "
                                 f"{at(e['t'])} holding the memo committed at {at(memo['t'])}, "
                                 f"yet called the provider at {at(call['t_start'])}",
                                 memo, e, call)
    return entries


# -- cost-accounted -------------------------------------------------------------------------

WASTE_CAUSES = ("timeout", "crash-before-commit", "lost-lease", "retry", "operator-discarded",
                "duplicate")


def check_cost_accounted(history: list[Event], snapshot: dict[str, Any]) -> Verdict:
    """Committed cost equals the billed cost of the memoized calls; the rest is attributed.

    For each memo a worker wrote, its call (see `memoized_call`) was billed exactly the memo's
    cost (1e-9), and a memo with a cost has a call. Every billed call the engine lived to
    record has a spend record (`match_spends`): one of a worker that was not killed before
    its next write for the job, or that went on to write for other jobs. A good answer is
    not given up while its lease holds ("result-discarded", see `_KeptResults`), and each
    spend record says what the provider did (`_check_spend_record`). Waste = billed -
    committed, by cause of each other call.
    """
    verdict = Verdict("cost-accounted")
    shared = readings(history)
    calls = shared.calls
    why = needs_ledger(history, calls)
    if why:
        return verdict.unknown(why)
    at = clock_of(history)
    memoized = _check_memo_costs(verdict, at, shared.memos, calls)
    waste: Counter[str] = Counter()
    counted: Counter[str] = Counter()
    spends, index = shared.spends, shared.jobs
    records = capable(snapshot, "spend_records")
    # The shortest call timeout any worker ran with (a worker without heartbeat may have its own).
    timeout = min([t for t in (snapshot["settings"].get("call_timeout"),
                               *shared.timeline(snapshot["pipeline"]).call_timeouts)
                   if t is not None], default=None)
    kept = _KeptResults(history, snapshot, shared, timeout)
    slack = machine_slack(snapshot.get("clock"))
    # A worker id runs one job at a time with one slot, or where each slot has an id of its
    # own: its write for another job then proves it had given the call up.
    one_at_a_time = int(snapshot["settings"].get("slots") or 1) == 1 or bool(
        snapshot["settings"].get("id_per_slot"))
    for call in (c for group in calls.values() for c in group):
        verdict.checked += 1
        spend = spends.get(id(call))
        if spend is None and (call["billed"] or 0) > 0 and call["worker"] and records and \
                index.lived_on(call["worker"], call["job"], call["t_start"], call.get("pid"),
                               sequential=one_at_a_time):
            verdict.fail("spend-unrecorded", f"job {call['job']}: the provider billed "
                         f"{call['billed']} for {call['step']!r} to {call['worker']} (call at "
                         f"{at(call['t_start'])}), and the engine recorded no spend though "
                         "the worker lived on", call)
        if spend is not None:
            _check_spend_record(verdict, at, call, spend, timeout, slack, shared)
            if id(call) not in memoized:
                kept.judge(verdict, at, call, spend)
        cause = memoized.get(id(call)) or waste_cause(call, spend, index)
        if cause != "committed":
            waste[cause] += call["billed"] or 0.0
            counted[cause] += 1
    billed = sum(c["billed"] or 0.0 for group in calls.values() for c in group)
    committed = sum(m.get("cost") or 0.0 for m in snapshot["memos"])
    if not capable(snapshot, "spend_records") and verdict.valid is not False:
        verdict.unknown(f"the engine keeps no per-call spend record: {verdict.checked} memo "
                        "costs and calls checked against the ledger, unrecorded spend not "
                        "judged")
    verdict.metrics = {"billed": round(billed, 9), "committed": round(committed, 9),
                       "waste": round(billed - committed, 9),
                       "waste_by_cause": {c: round(waste[c], 9) for c in WASTE_CAUSES
                                          if c in waste},
                       "calls_by_cause": dict(counted), "calls": sum(map(len, calls.values())),
                       "calls_with_spend": len(spends)}
    return verdict


def _check_memo_costs(verdict: Verdict, at, memos: Memos,
                      calls: dict[Key, list[Event]]) -> dict[int, str]:
    """Each worker memo's cost is its call's billed (a memo whose cost the engine does not
    keep is matched to its call, not judged); returns id(call) -> "committed", or
    "operator-discarded" for a memo an operator deleted since."""
    memoized: dict[int, str] = {}
    for memo, delete in memos.worker_inserts():
        if memo.get("worker") is None:
            continue  # nobody to match a call to: the observer could not say who wrote it
        call = memoized_call(memo, calls.get((memo["job"], memo["step"]), ()))
        if call is not None:
            memoized[id(call)] = "committed" if delete is None else "operator-discarded"
        if memo.get("cost") is None:
            continue  # the engine keeps no cost (a field it does not keep is None)
        verdict.checked += 1
        billed = (call["billed"] if call else 0.0) or 0.0
        if abs(billed - memo["cost"]) > COST_TOLERANCE:
            _mismatch(verdict, at, memo, call)
    return memoized


def _check_spend_record(verdict: Verdict, at, call: Event, spend: Event,
                        timeout: float | None, slack: float, shared) -> None:
    """A spend record says what the provider did with the call: no "timeout" for an answer
    (or a reset connection) the fake gave well within the call timeout (by more than the
    machine's slack and the time the caller could not run meanwhile: a client frozen by the
    harness may find its deadline passed when it resumes), and, for an answer the engine had
    in time (status 200, billed), the cost the fake billed."""
    if timeout is None:
        return
    client = call.get("pid") or shared.jobs.pids.get(call.get("worker"))
    frozen = sum(shared.held_still(client, call["t_start"], call["t_start"] + timeout))
    in_time = call["t_end"] - call["t_start"] + slack + frozen < timeout
    where = (f"job {call['job']}: {call['worker']}'s spend record of its {call['step']!r} call "
             f"at {at(call['t_start'])}")
    answered = call.get("status") is not None or call.get("outcome") == "reset"
    if not in_time or not answered:
        return  # no answer, or one the client may have given up on
    if spend.get("outcome") == "timeout":
        what = (f"answered {call['status']}" if call.get("status") is not None
                else "reset the connection")
        verdict.fail("spend-outcome-mismatch", f"{where} says it timed out, but the provider "
                     f"{what} after {call['t_end'] - call['t_start']:.3f} s, well within the "
                     f"{timeout:g} s call timeout", call, spend)
    elif call["status"] == 200 and (call.get("billed") or 0) > 0 and \
            abs((spend.get("cost") or 0.0) - call["billed"]) > COST_TOLERANCE:
        verdict.fail("spend-cost-mismatch", f"{where} records cost {spend.get('cost')}, but "
                     f"the provider billed {call['billed']} for the answer it gave", call, spend)


class _KeptResults:
    """A good answer is not thrown away while its lease holds ("result-discarded").

    A worker whose finishing write the database's write lock keeps out goes on trying until
    its lease ends, less the engine's declared `finish_retry_slack`: giving up sooner throws
    away a result that was paid for and that nobody else could have taken yet. The evidence
    of a give-up is a spend record the worker wrote on its own, with no memo or state change
    of the step before it. Judged for answers the provider gave in time (status ok, within
    call_timeout) to a live worker on the true clock whose lease nobody took first, against
    the lease its claim and its own renewals gave it."""

    def __init__(self, history: list[Event], snapshot: dict[str, Any], shared,
                 timeout: float | None) -> None:
        self.slack, self.timeout = snapshot["settings"].get("finish_retry_slack"), timeout
        self.shared, self.timeline = shared, shared.timeline(snapshot["pipeline"])
        self.steps: dict[tuple, list[float]] = defaultdict(list)   # writes other than spend
        for e in history:
            if e["src"] == "engine" and e.get("job") is not None and e["type"] != "billed" \
                    and ends_an_operation(e):
                self.steps[(e["job"], e.get("worker"))].append(e["t"])

    def judge(self, verdict: Verdict, at, call: Event, spend: Event) -> None:
        worker, job = call["worker"], call["job"]
        if self.slack is None or not worker or call["outcome"] != "ok" or \
                self.timeline.is_skewed(worker) or (self.timeout is not None and (
                    call["t_end"] > call["t_start"] + self.timeout or self._late_for(call))):
            return
        if any(call["t_start"] < t <= spend["t"] + TOL for t in self.steps.get((job, worker), ())):
            return  # the step's own write carried the spend (or came first): not a give-up
        lease = self.shared.lease_held(job, worker, spend.get("token"), spend["t"])
        if lease is None or self.shared.jobs.taken_from(worker, lease[0], spend["t"]):
            return
        claim, held = lease
        if spend["t"] < held - self.slack - TOL:
            verdict.fail("result-discarded", f"job {job}: {worker} got a good answer for "
                         f"{call['step']!r} at {at(call['t_end'])} and gave it up (its spend "
                         f"recorded alone at {at(spend['t'])}) while its lease held until "
                         f"{at(held)}: more than finish_retry_slack={self.slack:g} s early",
                         call, spend, claim)


    def _late_for(self, call: Event) -> bool:
        """Whether the answer came too late for its caller however soon the provider gave
        it: the harness paused the caller, or the machine left it unrun (chaos.run.runqueue),
        from the answer's arrival to the end of its call timeout (which ran from no later
        than the call's arrival), but for one sample of the run-queue watch; it could not
        read the answer in time."""
        pid = call.get("pid") or self.shared.jobs.pids.get(call["worker"])
        deadline = call["t_start"] + self.timeout
        return pid is not None and deadline > call["t_end"] and sum(self.shared.held_still(
            pid, call["t_end"], deadline)) >= deadline - call["t_end"] - STALL_SAMPLE - TOL


def waste_cause(call: Event, spend: Event | None, index: JobIndex) -> str:
    """Why a call's result was not the one committed (see WASTE_CAUSES, in that order)."""
    worker, job = call["worker"], call["job"]
    if call["outcome"] == "hang" or (spend is not None and spend["outcome"] == "timeout"):
        return "timeout"
    if worker and index.died_before_writing(worker, job, call["t_start"], call.get("pid")):
        return "crash-before-commit"
    claim = index.claim_of(worker, job, call["t_start"]) if worker else None
    if claim is not None:
        until = index.next_write(worker, job, call["t_start"])
        if index.taken_from(worker, claim, math.inf if until is None else until):
            return "lost-lease"
    # A failed attempt, by the engine's record or, with none, by the answer the caller got.
    if (spend["outcome"] in ("retryable", "poison") if spend is not None
            else call.get("completion") == "fail"):
        return "retry"
    return "duplicate"


def _mismatch(verdict: Verdict, at, memo: Event, call: Event | None) -> None:
    where = (f"job {memo['job']}: the memo for {memo['step']!r} by {memo['worker']} at "
             f"{at(memo['t'])}")
    if call is None:
        verdict.fail("cost-mismatch", f"{where} records cost {memo['cost']}, but the provider "
                     "billed no call of that worker for it", memo)
    else:
        verdict.fail("cost-mismatch", f"{where} records cost {memo['cost']}, but its call at "
                     f"{at(call['t_start'])} was billed {call['billed']}", memo, call)


CHECKS = {
    "no-rebill-after-commit": check_no_rebill_after_commit,
    "memo-consistent": check_memo_consistent,
    "cost-accounted": check_cost_accounted,
}

#: the engine fields each check reads (chaos.engines.schema): an evidence field an engine leaves out
#: makes exactly these checks unknown, naming it
READS = {
    "cost-accounted": reads(
        submitted="actor job pid worker",
        claimed="actor continued job pid step token worker",
        state="actor from heartbeat job lease_until pid to token took_lease worker",
        memo="actor cost job op pid step token worker",
        effect_queued="actor job pid token worker",
        effect_claimed="actor job pid token worker",
        effect_sent="actor job pid token worker",
        effect_state="actor job pid token worker",
        billed="actor cost job outcome pid step token worker"),
    "memo-consistent": reads(
        submitted="actor job",
        claimed="actor continued from job to token worker",
        state="actor from job to token took_lease worker",
        memo="actor job op pid step token worker",
        effect_queued="actor job token worker",
        effect_claimed="actor job token worker",
        effect_sent="actor job token worker",
        effect_state="actor job token worker",
        billed="actor job token worker"),
    "no-rebill-after-commit": reads(
        submitted="actor job pid worker",
        claimed="actor continued job pid token worker",
        state="actor from heartbeat job lease_until pid to token took_lease worker",
        memo="actor job op pid step token worker",
        effect_queued="actor job pid token worker",
        effect_claimed="actor job pid token worker",
        effect_sent="actor job pid token worker",
        effect_state="actor job pid token worker",
        billed="actor job pid started step token worker"),
}
