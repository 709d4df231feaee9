"""Checkers of the job table's life: every state change walks the state table
(legal-transitions) and submissions are idempotent on the caller's id (submissions-idempotent).

Also owns the reading of who holds a job when (`JobIndex`: lease-taking writes, each worker's
writes, process exits), which the billing and lease checkers build on.
"""
from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from typing import Any

from chaos.history import Event
from chaos.engines.schema import reads
from chaos.checkers.ops import (TOL, ends_an_operation, is_job, is_operator, pids_by_worker,
                                takes_lease, worker_processes)
from chaos.checkers.verdict import Verdict



def clock_of(history: list[Event]):
    """A formatter of times relative to the history's first event ("+3.412 s")."""
    t0 = history[0]["t"] if history else 0.0
    return lambda t: "?" if t is None else f"+{t - t0:.3f} s"


def job_ops(history: list[Event]) -> list[Event]:
    return [e for e in history if is_job(e)]


def is_update(e: Event) -> bool:
    return e["type"] in ("claimed", "state")


class JobIndex:
    """Who held each job when, what each worker wrote for it, and when processes died.

    bumps[job]: the job's lease-taking writes (and its submission) in commit order;
    writes[(job, worker)]: the times of the worker's writes that end an operation on the job
    (state changes, claims, memos, billed calls, effects queued; not heartbeats);
    by_worker[worker]: the same, for every job;
    exits[pid]: its process exits; pids[worker]: the (last) process of each worker id;
    processes[worker]: all of them (a worker id that names a slot outlives its processes).
    """

    def __init__(self, history: list[Event]) -> None:
        self.bumps: dict[str, list[Event]] = defaultdict(list)
        self.writes: dict[tuple[str, str], list[float]] = defaultdict(list)
        self.exits: dict[int, list[Event]] = defaultdict(list)
        self.by_worker: dict[str, list[float]] = defaultdict(list)
        self.pids = pids_by_worker(history)
        self.processes = worker_processes(history)
        for e in history:
            src, type_ = e["src"], e["type"]
            if src == "engine":
                if is_job(e) and (type_ == "submitted" or takes_lease(e)):
                    self.bumps[e["job"]].append(e)
                if ends_an_operation(e) and e.get("job") is not None:
                    self.writes[(e["job"], e.get("worker"))].append(e["t"])
                    self.by_worker[e.get("worker")].append(e["t"])
            elif src == "process" and type_ == "exit":
                self.exits[e["pid"]].append(e)

    def claim_of(self, worker: str, job: str, t: float) -> Event | None:
        """The worker's latest lease-taking write on the job at (or within TOL after) t."""
        found = None
        for bump in self.bumps.get(job, ()):
            if bump["t"] > t + TOL:
                break
            if bump.get("worker") == worker:
                found = bump
        return found

    def taken_from(self, worker: str, claim: Event, until: float) -> Event | None:
        """The first lease-taking write on claim's job by someone else after `claim`."""
        for bump in self.bumps.get(claim["job"], ()):
            if bump["t"] > until:
                break
            if bump["t"] > claim["t"] and bump.get("worker") != worker:
                return bump
        return None

    def next_write(self, worker: str, job: str, t: float) -> float | None:
        """The time of the worker's first write for the job strictly after t (heartbeats
        aside). No tolerance: a worker is sequential, it writes nothing for a job while its
        call for that job runs, and its claim committed before the call started."""
        times = self.writes.get((job, worker), [])
        i = bisect.bisect_right(times, t)
        return times[i] if i < len(times) else None

    def exits_of(self, worker: str, pid: int | None = None) -> list[Event]:
        """The exits of process `pid`, or (None) of every process of the worker, in order."""
        pids = {pid} if pid is not None else self.processes.get(worker, ())
        return sorted((x for p in pids for x in self.exits.get(p, ())), key=lambda x: x["t"])

    def exit_after(self, worker: str, t: float, pid: int | None = None) -> Event | None:
        """The first exit of the worker's process (or of `pid`) at or after t (within TOL:
        the supervisor stamps exits with another clock than the provider's ledger)."""
        return next((x for x in self.exits_of(worker, pid) if x["t"] >= t - TOL), None)

    def died_before_writing(self, worker: str, job: str, t: float,
                            pid: int | None = None) -> Event | None:
        """The worker's process exit after t if it came before any write of the worker for
        the job after t: the operation the worker had open at t never finished. `pid`: the
        process known to have had it open (a call the fakes tied to its caller)."""
        exit_ = self.exit_after(worker, t, pid)
        if exit_ is None:
            # A request already on its way when its worker died reaches the provider later;
            # the ledger stamps it then, after the exit. A dead worker makes no new calls.
            # (Of a worker id that outlives its processes, only the one that called can say.)
            if pid is None and len(self.processes.get(worker, ())) > 1:
                return None
            return self.exit_before(worker, t, pid)
        written = self.next_write(worker, job, t)
        return exit_ if written is None or written > exit_["t"] else None

    def lived_on(self, worker: str, job: str, t: float, pid: int | None = None,
                 sequential: bool = True) -> bool:
        """Whether the worker went on after its operation on the job open at t: it did not
        die before its next write for the job, or (`sequential`: a worker that runs one job
        at a time, an engine with one job slot per process) it wrote for another job after t
        before it died, so it had given that operation up. With several job slots a write
        for another job may be another slot's, under the same worker id: it proves
        nothing of this one."""
        exit_ = self.died_before_writing(worker, job, t, pid)
        if exit_ is None:
            return True
        if not sequential:
            return False
        times = self.by_worker.get(worker, [])
        i = bisect.bisect_right(times, t)
        return i < len(times) and times[i] < exit_["t"]

    def exit_before(self, worker: str, t: float, pid: int | None = None) -> Event | None:
        """The last exit of the worker's process (or of `pid`) before t, if any."""
        return next((x for x in reversed(self.exits_of(worker, pid)) if x["t"] < t), None)


# -- legal-transitions ------------------------------------------------------------------

def check_legal_transitions(history: list[Event], snapshot: dict[str, Any]) -> Verdict:
    """Every audited state change is an edge of the state table.

    Worker writes may take `edges`; operator writes may take edges ∪ operator_edges.
    A job insert starts in the first step's ready state; terminal states are never left
    (whoever writes); parked states are left only by operator writes; jobs are never deleted.
    """
    verdict = Verdict("legal-transitions")
    pipeline = snapshot["pipeline"]
    initial = pipeline["steps"][0]["ready"]
    at = clock_of(history)
    events = job_ops(history)
    if not events and (snapshot["jobs"] or snapshot["submitted"]):
        return verdict.unknown("no engine job operations, yet the run had jobs: "
                               "was the observer installed?")
    per_edge: Counter[str] = Counter()
    for e in events:
        job, frm, to, writer = e["job"], e["from"], e["to"], e.get("worker")
        if is_update(e) and frm == to:
            continue  # a lease or bookkeeping write, not a state change
        verdict.checked += 1
        per_edge[f"{frm or '(new)'}->{'(deleted)' if e['type'] == 'removed' else to}"] += 1
        if e["type"] == "submitted" and to != initial:
            verdict.fail("bad-initial-state", f"job {job}: inserted in state {to!r} at "
                         f"{at(e['t'])} by {writer}; jobs start in {initial!r}", e)
        elif e["type"] == "removed":
            verdict.fail("job-deleted", f"job {job}: deleted in state {frm!r} at {at(e['t'])} "
                         f"by {writer}; jobs are kept", e)
        elif is_update(e):
            _judge_change(verdict, pipeline, e, f"job {job}: {frm} -> {to} by {writer} at "
                          f"{at(e['t'])}")
    verdict.metrics = {"transitions": verdict.checked, "per_edge": dict(sorted(per_edge.items()))}
    return verdict


def _judge_change(verdict: Verdict, pipeline: dict, e: Event, where: str) -> None:
    frm, to, operator = e["from"], e["to"], is_operator(e)
    allowed = list(pipeline["edges"].get(frm, ()))
    if operator:
        allowed += pipeline["operator_edges"].get(frm, ())
    if frm in pipeline["terminal"]:
        verdict.fail("terminal-left", f"{where}: {frm!r} is terminal", e)
    elif frm in pipeline["parked"] and not operator:
        verdict.fail("parked-left-by-worker",
                     f"{where}: {frm!r} is parked and only an operator may move it", e)
    elif to not in allowed:
        known = frm in pipeline["edges"] or frm in pipeline["operator_edges"]
        why = f"allowed: {', '.join(allowed) or 'none'}" if known else f"unknown state {frm!r}"
        verdict.fail("illegal-edge", f"{where}: not an edge of the state table ({why})", e)


# -- submissions-idempotent ---------------------------------------------------------------

def check_submissions_idempotent(history: list[Event], snapshot: dict[str, Any]) -> Verdict:
    """Every submitted id exists once; duplicates changed nothing; mismatches were rejected.

    - every id in snapshot.submitted has exactly one `submitted` operation (or, lacking it,
      a row in snapshot.jobs); no job exists that was never submitted;
    - after it, no job operation has actor "submitter" (a duplicate changed the job) and
      none carries another payload_hash than the submission's;
    - runner submits of a known id: same payload_hash as the first submit -> result
      "exists"; another payload_hash -> "rejected", and the stored job (snapshot.jobs)
      keeps the first submit's payload_hash (where the engine keeps one: a stored
      payload_hash of None is no evidence, counted in metrics.original_unjudged);
    - a duplicate submit never raises (the harness logs an error for one that did).
    """
    verdict = Verdict("submissions-idempotent")
    at = clock_of(history)
    submitted, stored = list(snapshot["submitted"]), snapshot["jobs"]
    submits = [e for e in history if e["src"] == "runner" and e["type"] == "submit"]
    inserts = _check_inserts(verdict, at, job_ops(history))
    if submitted and not submits and not inserts:
        return verdict.unknown("no runner submit events and no submitted operations in the "
                               "history")
    original = _check_submit_results(verdict, at, submits)
    for e in history:  # a resubmission answers exists or rejected; it never raises
        if e.get("src") == "nemesis" and e.get("type") == "error" \
                and e.get("fault") == "duplicate_submit":
            verdict.checked += 1
            verdict.fail("submit-raised", f"a duplicate submit at {at(e['t'])} raised instead "
                         f"of answering exists or rejected: {e.get('error')}", e)
    unjudged = 0
    for job, first in original.items():
        row = stored.get(job)
        if row is not None and row.get("payload_hash") is None:
            unjudged += 1  # the engine keeps no hash ("may be None"): no evidence either way
        elif row is not None and row.get("payload_hash") != first["payload_hash"]:
            verdict.fail("original-overwritten", f"job {job}: the stored payload hash is "
                         f"{row.get('payload_hash')!r}, the first submit's was "
                         f"{first['payload_hash']!r}", first)
    for job in submitted:
        verdict.checked += 1
        if not inserts.get(job) and job not in stored:
            verdict.fail("missing-job", f"job {job}: submitted but never created",
                         *[e for e in submits if e["job"] == job][:3])
    for job in sorted((set(inserts) | set(stored)) - set(submitted)):
        verdict.fail("unsubmitted-job", f"job {job}: exists but was never submitted",
                     *inserts.get(job, [])[:1])
    verdict.metrics = {
        "submitted": len(submitted), "submit_events": len(submits),
        "results": dict(Counter(e["result"] for e in submits)),
        "duplicates": sum(1 for e in submits if e.get("duplicate")),
        "jobs_inserted": len(inserts),
        # jobs whose stored payload could not be compared with the first submit's
        "original_unjudged": unjudged,
    }
    return verdict


def _check_inserts(verdict: Verdict, at, jobs: list[Event]) -> dict[str, list[Event]]:
    """One insert per job, and nothing a submit or a payload change did after it."""
    inserts: dict[str, list[Event]] = defaultdict(list)
    for e in jobs:
        job, first = e["job"], (inserts.get(e["job"]) or [None])[0]
        if e["type"] == "submitted":
            inserts[job].append(e)
            if first is not None:
                verdict.fail("duplicate-insert", f"job {job}: inserted again at {at(e['t'])} "
                             f"by {e.get('worker')} (first insert at {at(first['t'])})", first, e)
        elif first is None or e["type"] == "removed":
            continue
        elif e.get("actor") == "submitter":
            verdict.fail("duplicate-changed-job", f"job {job}: a submit changed the existing "
                         f"job at {at(e['t'])} ({e['from']} -> {e['to']})", first, e)
        elif e.get("payload_hash") is not None and e["payload_hash"] != first.get("payload_hash"):
            verdict.fail("payload-changed", f"job {job}: payload hash became "
                         f"{e.get('payload_hash')!r} at {at(e['t'])} by {e.get('worker')}, was "
                         f"{first.get('payload_hash')!r}", first, e)
    return inserts


def _check_submit_results(verdict: Verdict, at, submits: list[Event]) -> dict[str, Event]:
    """Each duplicate got the answer its payload calls for; returns each id's first submit."""
    original: dict[str, Event] = {}
    for e in submits:
        verdict.checked += 1
        first = original.setdefault(e["job"], e)
        if first is e:
            if e["result"] == "rejected":
                verdict.fail("first-submit-rejected", f"job {e['job']}: its first submit at "
                             f"{at(e['t'])} was rejected", e)
            continue
        same = e["payload_hash"] == first["payload_hash"]
        if same and e["result"] != "exists":
            verdict.fail("duplicate-not-idempotent", f"job {e['job']}: a duplicate with the "
                         f"same payload at {at(e['t'])} returned {e['result']!r}, not 'exists'",
                         first, e)
        elif not same and e["result"] != "rejected":
            verdict.fail("mismatch-accepted", f"job {e['job']}: a duplicate with another "
                         f"payload ({e['payload_hash']!r}, first {first['payload_hash']!r}) at "
                         f"{at(e['t'])} returned {e['result']!r}, not 'rejected'", first, e)
    return original


CHECKS = {
    "legal-transitions": check_legal_transitions,
    "submissions-idempotent": check_submissions_idempotent,
}

#: the engine fields each check reads (chaos.engines.schema): an evidence field an engine leaves out
#: makes exactly these checks unknown, naming it
READS = {
    "legal-transitions": reads(
        submitted="from job to worker",
        claimed="actor from job to worker",
        state="actor from job to worker"),
    "submissions-idempotent": reads(
        submitted="job payload_hash",
        claimed="actor job payload_hash",
        state="actor job payload_hash"),
}
