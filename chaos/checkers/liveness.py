"""Liveness invariants: jobs settle, retries keep their discipline, work per step is bounded.

The checks share one reading of the job operations, *holdings* (chaos.checkers.timeline).
"""
from __future__ import annotations

from collections import Counter
from typing import Any

from chaos.history import Event
from chaos.engines.schema import reads
from chaos.checkers.index import readings
from chaos.checkers.lost import LostJobs, unsettled_jobs
from chaos.checkers.ops import TOL, capable, disturbed, is_effect, is_operator
from chaos.checkers.timeline import Holding, Timeline, counts_every_claim, unknown_without_audit
from chaos.checkers.verdict import Verdict


# -- all-jobs-settle ---------------------------------------------------------------------

def check_all_jobs_settle(history: list[Event], snapshot: dict[str, Any]) -> Verdict:
    """After heal and drain every job is terminal or parked and no outbox row is pending."""
    verdict = Verdict("all-jobs-settle")
    jobs, pipeline = snapshot["jobs"], snapshot["pipeline"]
    if not jobs and snapshot.get("submitted"):
        return verdict.unknown(f"the snapshot has no job although {len(snapshot['submitted'])} "
                               "were submitted")
    settled = set(pipeline["terminal"]) | set(pipeline["parked"])
    pending = [r for r in snapshot["outbox"]
               if r.get("sent_at") is None and r.get("dead_at") is None]
    phases = snapshot.get("phases", {})
    drain = None
    if phases.get("drain_end") is not None and phases.get("drain_start") is not None:
        drain = round(phases["drain_end"] - phases["drain_start"], 3)
    verdict.checked = len(jobs) + len(snapshot["outbox"])
    verdict.metrics = {"settle_time": drain, "drained": phases.get("drained"),
                       "states": dict(sorted(Counter(r["state"] for r in jobs.values()).items())),
                       "unsettled": sum(r["state"] not in settled for r in jobs.values()),
                       "outbox_pending": len(pending)}
    if not snapshot["plan"].get("expect", {}).get("settle", True):
        verdict.reason = "the scenario does not expect jobs to settle: metrics only"
        return verdict
    last_row = _last_rows(history)
    note = "" if phases.get("drained", True) else "; the drain gave up at its deadline"
    lost = LostJobs(history, set(pipeline["working"]))
    for job_id in unsettled_jobs(snapshot):
        row = jobs[job_id]
        why, events = lost.explain(job_id)
        verdict.fail("job-not-settled",
                     f"job {job_id} is still {row['state']!r} after the drain: {why} (its row: "
                     f"attempts {row.get('attempts')}, claims {row.get('claims')}, last error "
                     f"{row.get('last_error')!r}{note})", *events)
    for row in pending:
        last = last_row.get((row["job"], row["kind"]))
        verdict.fail("outbox-pending",
                     f"outbox row {row.get('row')} (job {row['job']} {row['kind']!r}) is neither "
                     f"sent nor dead-lettered after the drain (attempts {row.get('attempts')}, "
                     f"last error {row.get('last_error')!r}{note})", *([last] if last else []))
    return verdict


def _last_rows(history: list[Event]) -> dict:
    """(job, kind) -> the last write of that outbox row."""
    return {(e["job"], e["kind"]): e for e in history
            if is_effect(e) and e.get("kind") is not None and e.get("row") is not None}


# -- retry-discipline --------------------------------------------------------------------


# -- bounded-work ------------------------------------------------------------------------

def check_bounded_work(history: list[Event], snapshot: dict[str, Any]) -> Verdict:
    """Claims of one step in a row stay within max_claims; crash-looping jobs end parked,
    and a park for a crash loop follows claims that crashed. Where max_claims counts every
    claim (`counts_every_claim`), so do these: all claims of the step since the job entered
    it, whether a failure or a crash ended each."""
    verdict = Verdict("bounded-work")
    if unknown_without_audit(verdict, history, snapshot):
        return verdict
    tl = readings(history).timeline(snapshot["pipeline"])
    # Without a declared cap, only the end of crash loops is judged: they must end parked.
    cap = snapshot["settings"].get("max_claims") if capable(snapshot, "crash_loop_cap") \
        else None
    every = counts_every_claim(snapshot["settings"])
    longest: Counter = Counter()
    runs: Counter = Counter()
    for holds in tl.holdings.values():
        first: dict[str, Holding] = {}
        for h in holds:
            name, n = h.step["name"], h.claims if every else h.run
            if n == 1:
                first[name] = h
            longest[name] = max(longest[name], n)
            if cap is not None and n == cap + 1:
                how = "since it entered the step, failed or crashed" if every else \
                    "without finishing"
                verdict.fail("too-many-claims",
                             f"job {h.job}: step {name!r} was claimed {n} times {how} "
                             f"(max_claims={cap}): first by {first[name].worker} at "
                             f"{tl.at(first[name].start['t'])}, claim {n} by {h.worker} at "
                             f"{tl.at(h.start['t'])}", first[name].start, h.start)
        runs.update(_run_lengths(holds))
    # a planned crash loop crashes nothing in an engine whose processes arm no probe: the
    # fault is not applicable there, and its jobs are ordinary ones
    looping = snapshot["plan"].get("crash_loop", []) if capable(snapshot, "crash_points") else []
    for job in looping:
        _check_crash_loop(verdict, tl, snapshot, job)
    shared = readings(history)
    for job, holds in tl.holdings.items():
        _check_crash_loop_park(verdict, tl, shared, job, holds, cap, every)
    verdict.checked = sum(len(h) for h in tl.holdings.values())
    if cap is None and verdict.valid is not False and not looping:
        verdict.unknown("the engine declares no crash-loop cap and the run had no crash-loop "
                        "job: claims per step were measured, not judged")
    verdict.metrics = {"holdings": verdict.checked, "max_claims": cap,
                       "max_claims_per_step": dict(sorted(longest.items())),
                       "claims_histogram": dict(sorted(runs.items())),
                       "crash_loop_jobs": len(looping)}
    return verdict


def _run_lengths(holds: list[Holding]) -> list[int]:
    """The length of every run of claims of a step (each run starts at run == 1)."""
    lengths, last = [], {}
    for h in holds:
        if h.run == 1 and h.step["name"] in last:
            lengths.append(last[h.step["name"]])
        last[h.step["name"]] = h.run
    return lengths + list(last.values())


def _check_crash_loop_park(verdict: Verdict, tl: Timeline, shared, job: str,
                           holds: list[Holding], cap: int | None, every: bool) -> None:
    """A park for a crash loop needs the crashes: of the claims of the step in the run that
    the park ended, at least half ended with their holder dead, paused or its lease taken
    by the harness. Claims that ended with a live, undisturbed holder walking away are a
    worker that does not do the work, not a job that kills its workers. And it needs the
    cap: a job is parked for its claims once max_claims of them ran, not before. Where the
    cap counts every claim (`every`), the run is every claim since the job entered the
    step, and a claim its holder ended by writing (a failed attempt) counts as a crash."""
    parks = [e for _, e in tl.job_events.get(job, []) if e.get("type") == "state"
             and e.get("cause") == "crash_loop"]
    for park in parks:
        run = [h for h in holds if h.start["t"] <= park["t"] + TOL
               and h.step["parked"] == park["to"]]
        if not run:
            continue
        run = run[-(run[-1].claims if every else run[-1].run):]  # since it entered the step
        if cap is not None and len(run) < cap:
            verdict.fail("parked-before-claim-cap",
                         f"job {job}: parked for a crash loop at {tl.at(park['t'])} after "
                         f"{len(run)} claim(s) of step {run[-1].step['name']!r}, fewer than "
                         f"max_claims={cap}", run[0].start, park)
            continue
        crashed = sum((every and h.write is not None) or _crashed(h, run, shared, park)
                      for h in run)
        if crashed * 2 < len(run):
            verdict.fail("crash-loop-without-crashes",
                         f"job {job}: parked for a crash loop at {tl.at(park['t'])} after "
                         f"{len(run)} claims of step {run[-1].step['name']!r}, but only "
                         f"{crashed} of them ended with the worker dead, paused or its lease "
                         "taken by the harness" + (" or a failure it wrote" if every else ""),
                         run[0].start, park)


def _crashed(h: Holding, run: list[Holding], shared, park: Event) -> bool:
    """Whether holding `h` ended by its holder's death or a harness disturbance before the
    next claim of the run (or the park)."""
    later = [x.start["t"] for x in run if x.start["t"] > h.start["t"]]
    end = min(later) if later else park["t"]
    died = shared.jobs.exit_after(h.worker, h.start["t"])
    if died is not None and died["t"] <= end + TOL:
        return True
    return disturbed(shared.windows, shared.jobs.pids.get(h.worker), h.start["t"], end, h.job)


def _check_crash_loop(verdict: Verdict, tl: Timeline, snapshot: dict, job: str) -> None:
    """A job that kills every worker that runs it ends parked (for the crash loop, where
    the engine says why it parks; or for its attempts, where one counter bounds both and
    so cannot tell them apart), unless an operator took it over."""
    row = snapshot["jobs"].get(job)
    holds = tl.holdings.get(job, [])
    events = [e for _, e in tl.job_events.get(job, [])]
    parked = holds[-1].step["parked"] if holds else None
    says_why = capable(snapshot, "crash_loop_cap")
    causes = ("crash_loop", "attempts") if counts_every_claim(snapshot["settings"]) \
        else ("crash_loop",)
    if row and row["state"] == parked and (not says_why or row.get("cause") in causes):
        return
    if any(is_operator(e) for e in events):
        return  # an operator acted on the job: what happens to it next is theirs
    state = row["state"] if row else "missing from the snapshot"
    claims = sum(h.step["working"] == holds[-1].step["working"] for h in holds) if holds else 0
    verdict.fail("crash-loop-not-parked",
                 f"job {job} crashes its workers every time but ended {state!r} (last error "
                 f"{(row or {}).get('last_error')!r}) after {claims} claims; it should be "
                 f"parked in {parked!r}" + (" for the crash loop" if says_why else ""),
                 *events[-1:])


CHECKS = {"all-jobs-settle": check_all_jobs_settle, "bounded-work": check_bounded_work}

#: the engine fields each check reads (chaos.engines.schema): an evidence field an engine leaves out
#: makes exactly these checks unknown, naming it
READS = {
    "all-jobs-settle": reads(
        submitted="actor job pid worker",
        claimed="actor job pid worker",
        state="actor job pid to worker",
        removed="actor job pid to worker",
        memo="pid worker",
        effect_queued="job kind pid row worker",
        effect_claimed="job kind pid row worker",
        effect_sent="job kind pid row worker",
        effect_state="job kind pid row worker",
        billed="pid worker"),
    "bounded-work": reads(
        submitted="actor job pid worker",
        claimed="actor continued job pid step token worker",
        state="actor cause from heartbeat job lease_until pid to took_lease worker",
        memo="job op pid worker",
        effect_queued="job pid worker",
        effect_claimed="pid worker",
        effect_sent="pid worker",
        effect_state="pid worker",
        billed="job pid worker"),
}
