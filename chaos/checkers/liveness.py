"""Liveness invariants: jobs settle, retries keep their discipline, work per step is bounded.

The checks share one reading of the job operations, *holdings*: a worker's hold on one step
of a job, from the `claimed` operation that gave it the step (a claim, or moving on from the
previous step under the same lease) to its own next write to the job that is not a
heartbeat (complete, retry, park). A holding with no such write ended in a crash or was
fenced out.
"""
from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from ..history import Event
from ..schema import reads
from .index import readings
from .lost import LostJobs, unsettled_jobs
from .ops import (TOL, capable, disturbed, is_effect, is_engine, is_heartbeat, is_job,
                  is_operator, is_worker, pids_by_worker)
from .verdict import Verdict
POISON_OUTCOMES = frozenset({"bad_content", "schema", "garbage"})
SYNC_SPAN = 0.020      # retries starting within this span are "at once"
SYNC_MIN_RETRIES = 8   # fewer retries after an outage say nothing about synchronization
# Full jitter over less than ~10 spans puts half the retries in one span by chance alone.
SYNC_MIN_BASE = 10 * SYNC_SPAN
#: The jitter spread test (see `spread_test`) fails a run that holds the engine's claim with
#: probability at most this (the Dvoretzky-Kiefer-Wolfowitz bound, exact for every n).
JITTER_ALPHA = 1e-6
#: Fewer waits judge no spread: their band is the whole range, so nothing could leave it. From
#: this count on the test can fail, if only waits as far off as all of them at one end (a
#: sender that retries at once, every wait 0): 8 at 1e-6. A higher floor (it was 20) let 18
#: failed sends, each retried at once, pass unjudged.
JITTER_MIN_WAITS = math.floor(math.log(2 / JITTER_ALPHA) / 2) + 1


@dataclass
class Holding:
    """One worker's hold on one step of one job (see the module docstring)."""

    job: str
    step: dict
    worker: str
    token: int
    start: Event
    start_pos: int          # position in the history
    segment: int            # operator actions on the job before it
    run: int                # claims of the step since the job entered it (resumes add one)
    claims: int = 1         # every claim of the step since the job entered it (retries too)
    write: Event | None = None
    write_pos: int = -1
    calls: list[tuple[int, Event]] = field(default_factory=list)


@dataclass
class Timeline:
    """The history read once: holdings, provider calls and interventions, per job."""

    t0: float = 0.0
    holdings: dict[str, list[Holding]] = field(default_factory=lambda: defaultdict(list))
    # (job, step) -> [(position, segment, call, holding)]
    calls: dict[tuple, list[tuple]] = field(default_factory=lambda: defaultdict(list))
    spends: list[tuple[int, Event]] = field(default_factory=list)
    job_events: dict[str, list[tuple[int, Event]]] = field(
        default_factory=lambda: defaultdict(list))
    interventions: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    segment: Counter = field(default_factory=Counter)
    outages: list[list[Event | None]] = field(default_factory=list)
    skewed_slots: dict[int, float] = field(default_factory=dict)  # slot -> seconds ahead
    skewed: set[int] = field(default_factory=set)          # pids of workers on a skewed clock
    skew: dict[int, float] = field(default_factory=dict)   # pid -> seconds its clock is ahead
    call_timeouts: list[float] = field(default_factory=list)  # per-slot overrides
    pids: dict[str, int] = field(default_factory=dict)        # worker id -> process id

    def at(self, t: float) -> str:
        return f"+{t - self.t0:.3f} s"

    def is_skewed(self, worker: str | None) -> bool:
        return self.pids.get(worker) in self.skewed

    def skew_of(self, worker: str | None) -> float:
        """Seconds `worker`'s clock runs ahead of the true one (0.0 when not skewed)."""
        return self.skew.get(self.pids.get(worker), 0.0)


def read_timeline(history: list[Event], pipeline: dict[str, Any]) -> Timeline:
    """One pass over the history (see Timeline)."""
    steps = pipeline["steps"]
    tl = Timeline(t0=history[0]["t"] if history else 0.0, pids=pids_by_worker(history))
    reader = _JobReader(tl, steps)
    current, spawned = reader.current, []
    for pos, e in enumerate(history):
        src, type_ = e.get("src"), e.get("type")
        if is_job(e):
            reader.read(pos, e)
        elif src == "provider" and type_ == "call":
            job, step = e.get("job"), e.get("step")
            holding = current.get((job, e.get("worker")))
            if holding is not None and holding.step["name"] != step:
                holding = None
            if holding is not None:
                holding.calls.append((pos, e))
            tl.calls[(job, step)].append((pos, tl.segment[job], e, holding))
        elif is_engine(e, "billed"):
            tl.spends.append((pos, e, current.get((e.get("job"), e.get("worker")))))
        elif src == "nemesis":
            _read_nemesis(tl, e)
        elif src == "process" and type_ == "spawn":
            spawned.append(e)
        elif src == "process" and type_ == "exit":
            reader.died(e["pid"])
    # The runner records a skew per worker slot before spawning it: process names are
    # "worker-SLOT.N", which ties the slot to the pids that ran with that clock.
    for e in spawned:
        if _slot(e.get("name")) in tl.skewed_slots:
            tl.skewed.add(e["pid"])
            tl.skew[e["pid"]] = tl.skewed_slots[_slot(e.get("name"))]
    return tl


def _slot(name: str | None) -> int | None:
    try:
        return int(name.split("-", 1)[1].split(".")[0]) if name else None
    except (IndexError, ValueError):
        return None


def _read_nemesis(tl: Timeline, e: Event) -> None:
    if e["type"] == "outage" and e.get("target") not in ("receiver", "sender"):
        tl.outages.append([e, None])
    elif e["type"] == "outage_end" and tl.outages and tl.outages[-1][1] is None:
        tl.outages[-1][1] = e
    elif e["type"] == "skew":
        if e.get("pid") is not None:
            tl.skewed.add(e["pid"])
            tl.skew[e["pid"]] = e.get("seconds") or 0.0
        if e.get("slot") is not None:
            tl.skewed_slots[e["slot"]] = e.get("seconds") or 0.0
    elif e["type"] == "heartbeat_off" and e.get("call_timeout") is not None:
        tl.call_timeouts.append(e["call_timeout"])


class _JobReader:
    """Turns job operations into holdings, runs of claims and interventions."""

    def __init__(self, tl: Timeline, steps: list[dict]) -> None:
        self.tl = tl
        self.by_name = {s["name"]: s for s in steps}
        self.current: dict[tuple[str, str], Holding] = {}   # (job, worker) -> latest holding
        self.runs: Counter = Counter()                       # (job, step) -> claims in the run
        self.claims: Counter = Counter()                     # (job, step) -> claims since entered

    def read(self, pos: int, e: Event) -> None:
        tl, job, writer = self.tl, e["job"], e.get("worker") or ""
        tl.job_events[job].append((pos, e))
        if is_operator(e):
            tl.segment[job] += 1
            tl.interventions[job].append(pos)
            for key in [k for k in self.runs if k[0] == job]:
                del self.runs[key]
            for key in [k for k in self.claims if k[0] == job]:
                del self.claims[key]
            return
        if e.get("actor") == "harness":
            tl.interventions[job].append(pos)
            return
        if e["type"] == "claimed" and e.get("step") in self.by_name:
            self._enter(pos, e, self.by_name[e["step"]], writer)
            return
        if e["type"] != "state" or is_heartbeat(e) or not is_worker(e):
            return
        holding = self.current.get((job, writer))
        if holding is not None and holding.write is None:
            holding.write, holding.write_pos = e, pos

    def died(self, pid: int) -> None:
        """The holdings open in process `pid` end with it, unwritten, every one of them (a
        process with job slots holds several): a later write under the same worker id (one
        that names a slot, not a process) is a successor's, not theirs."""
        for key, h in list(self.current.items()):
            if h.write is None and (h.start.get("pid") == pid
                                    or any(c.get("pid") == pid for _, c in h.calls)
                                    or self.tl.pids.get(h.worker) == pid):
                del self.current[key]

    def _enter(self, pos: int, e: Event, step: dict, writer: str) -> None:
        job, key = e["job"], (e["job"], step["name"])
        held = self.tl.holdings.get(job)
        last = held[-1] if held else None
        # A run of claims: each claim of the step after one that ended without a write.
        resumed = (last is not None and last.step["name"] == step["name"]
                   and last.write is None and self.runs[key] > 0)
        self.runs[key] = self.runs[key] + 1 if resumed else 1
        # Every claim of the step since the job entered it, whatever ended the one before.
        again = last is not None and last.step["name"] == step["name"] and self.claims[key] > 0
        self.claims[key] = self.claims[key] + 1 if again else 1
        holding = Holding(job, step, writer, e.get("token"), e, pos, self.tl.segment[job],
                          self.runs[key], self.claims[key])
        self.tl.holdings[job].append(holding)
        self.current[(job, writer)] = holding


def counts_every_claim(settings: dict) -> bool:
    """Whether max_claims counts every claim of a step, failed attempts and crashes alike
    (`cap_counts` "claims": one counter, a queue's receive count), not crashes in a row."""
    return settings.get("cap_counts") == "claims"


def _unknown_without_audit(verdict: Verdict, history: list[Event], snapshot: dict) -> bool:
    if snapshot["jobs"] and not any(is_job(e) for e in history):
        verdict.unknown("the snapshot has jobs but the history has no job operation")
        return True
    return False


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

def check_retry_discipline(history: list[Event], snapshot: dict[str, Any]) -> Verdict:
    """Poison parks at once, retries stay within the cap, waits honour Retry-After and full
    jitter, and retries after an outage are spread."""
    verdict = Verdict("retry-discipline")
    plan = snapshot["plan"]
    has_calls = any(e.get("src") == "provider" and e.get("type") == "call" for e in history)
    # No call at all is evidence only when the harness kept the provider's ledger.
    if not has_calls and "provider" not in snapshot.get("ledgers", ()) and (
            snapshot.get("spend") or plan.get("poison")):
        return verdict.unknown("the engine recorded provider spend (or the plan poisons jobs) "
                               "but the history has no provider call (provider ledger missing)")
    if _unknown_without_audit(verdict, history, snapshot):
        return verdict
    tl = readings(history).timeline(snapshot["pipeline"])
    settings = snapshot["settings"]
    _check_poison(verdict, tl)
    _check_poison_in_hand(verdict, tl, settings)
    parks = _check_give_up(verdict, tl, settings)
    _check_caps(verdict, tl, settings)
    waits = _check_waits(verdict, tl, settings)
    waits["outbox"] = _check_outbox_waits(verdict, readings(history).outbox, settings)
    outages = [_check_outage(verdict, tl, settings, snapshot, window) for window in tl.outages]
    jobs = snapshot["jobs"]
    poisoned = plan.get("poison", {})
    calls = sum(len(v) for v in tl.calls.values())
    verdict.checked = calls + parks + waits["retry_writes"] + waits["outbox"]["retry_writes"]
    verdict.metrics = {
        "calls": calls,
        "poison_calls": sum(_is_poison(c) for v in tl.calls.values() for _, _, c, _ in v),
        "poison_planned": len(poisoned),
        "poison_parked": sum(jobs.get(j, {}).get("state") in snapshot["pipeline"]["parked"]
                             for j in poisoned),
        "max_calls_per_step": max((len(v) for v in tl.calls.values()), default=0),
        **waits, "outages": outages,
    }
    retryable = sum(_is_retryable(c) for v in tl.calls.values() for _, _, c, _ in v)
    repeated = sum(len(v) > 1 for v in tl.calls.values())
    if verdict.valid is True and retryable and not waits["retry_writes"] and not repeated:
        verdict.unknown(f"0 retries observed while {retryable} retryable failures (429, 5xx, "
                        "hang, reset) were answered: the engine's retry writes were not "
                        "recognised, so waits and caps went unjudged")
    return verdict


def _is_retryable(call: Event) -> bool:
    status = call.get("status")
    return call.get("outcome") in ("hang", "reset") or status == 429 or (
        status is not None and status >= 500)


def _is_poison(call: Event) -> bool:
    status = call.get("status")
    return call.get("outcome") in POISON_OUTCOMES or (
        status is not None and 400 <= status <= 499 and status != 429)


def _check_poison(verdict: Verdict, tl: Timeline) -> None:
    """After a worker observed poison and committed the failure, no later claim calls again."""
    # Observed: answered definitely (the ledger's completion "fail", as _check_poison_in_hand
    # reads it). A poison answer the fake finished after its caller had hung up ("info": on
    # a loaded machine, after the caller's timeout) was never seen, and retrying is right.
    observed = [(pos, c, h) for entries in tl.calls.values() for pos, _, c, h in entries
                if _is_poison(c) and c.get("completion", "fail") == "fail"]
    observed += [(pos, s, holding) for pos, s, holding in tl.spends
                 if s.get("outcome") == "poison"]
    judged = set()
    for pos, event, holding in sorted(observed, key=lambda o: o[0]):
        if holding is None or holding.write is None or \
                holding.write["t"] + TOL < event.get("t_start", event["t"]):
            continue  # the worker died or was fenced out: the engine never knew
        write, step = holding.write, holding.step
        key = (holding.job, step["name"], holding.segment)
        if write["to"] == step["done"] or key in judged:
            continue
        judged.add(key)
        later = next((c for _, seg, c, h in tl.calls.get((holding.job, step["name"]), [])
                      if seg == holding.segment and (h.start_pos > holding.write_pos if h
                                                     else c["t_start"] > write["t"] + TOL)),
                     None)
        if later is None:
            continue
        parked = write["to"] == step["parked"]
        verdict.fail(
            "call-after-poison-parked" if parked else "poison-retried",
            f"job {holding.job}: step {step['name']!r} got a poison answer "
            f"({event.get('status')} {event.get('outcome')}) for {holding.worker}, which "
            f"{'parked the job' if parked else 'scheduled a retry'} at {tl.at(write['t'])}; "
            f"{later.get('worker')} called the provider again at {tl.at(later['t_start'])}",
            event, write, later)


def _check_poison_in_hand(verdict: Verdict, tl: Timeline, settings: dict) -> None:
    """Within one holding, no call follows a poison answer the worker received: an engine
    that retries in memory, writing nothing between its attempts, still calls once.

    Received: the fake answered the poison definitely (`completion` "fail", or a ledger too
    old to say) within the call timeout, so the caller had it before it could have given
    the call up as a timeout."""
    timeout = settings.get("call_timeout")
    for holds in tl.holdings.values():
        for h in holds:
            for i, (_, c) in enumerate(h.calls):
                if not _is_poison(c) or c.get("completion", "fail") != "fail" or (
                        timeout is not None and c["t_end"] - c["t_start"] > timeout - TOL):
                    continue
                # Before the holding's own write: a call after it is _check_poison's.
                until = h.write["t"] + TOL if h.write is not None else math.inf
                later = next((d for _, d in h.calls[i + 1:]
                              if c["t_end"] < d["t_start"] <= until), None)
                if later is not None:
                    verdict.fail(
                        "poison-retried", f"job {h.job}: step {h.step['name']!r} got a poison "
                        f"answer ({c.get('status')} {c.get('outcome')}) at {tl.at(c['t_end'])} "
                        f"for {h.worker}, which called the provider again at "
                        f"{tl.at(later['t_start'])} under the same claim, writing nothing "
                        "between", h.start, c, later)
                    break


def _check_give_up(verdict: Verdict, tl: Timeline, settings: dict) -> int:
    """A job is parked only when the engine's rules say so, and the provider's ledger shows
    why: as poison after a poison answer (a 4xx other than 429, garbage, unusable content),
    never after one worth retrying (429, 5xx, a timeout, a dropped connection), nor with no
    refusal at all; for its attempts only once it has failed max_attempts of them, each a
    call the provider received. Where max_claims counts every claim, one counter bounds the
    attempts too: a park for its attempts is also due once the step's claims since the job
    entered it reached max_claims, whatever mix of failures and crashes made them (without
    max_attempts, only then). Returns how many parks it judged."""
    claim_cap = settings.get("max_claims") if counts_every_claim(settings) else None
    cap = settings.get("max_attempts") if settings.get("max_attempts") is not None else claim_cap
    cap_name = "max_attempts" if settings.get("max_attempts") is not None else "max_claims"
    judged = 0
    for holds in tl.holdings.values():
        for h in holds:
            w = h.write
            if w is None or w["to"] != h.step["parked"] or not is_worker(w):
                continue
            judged += 1
            before = [c for _, c in h.calls if c["t_start"] <= w["t"] + TOL]
            call = before[-1] if before else None
            # Every call of this step since the job's last operator move, whichever holding
            # made it: a park's evidence need not lie in the holding that wrote it.
            received = [c for _, seg, c, _ in tl.calls.get((h.job, h.step["name"]), [])
                        if seg == h.segment and c["t_start"] <= w["t"] + TOL]
            where = f"job {h.job}: {h.worker} parked step {h.step['name']!r}"
            if claim_cap is not None and w.get("cause") == "attempts":
                if h.claims >= claim_cap:
                    continue  # the shared cap reached: due, whatever its attempts say
                where += f" with {h.claims} of max_claims={claim_cap} claims"
            if w.get("cause") == "poison" and call is not None and _is_retryable(call):
                verdict.fail("retryable-parked-as-poison",
                             f"{where} as poison at {tl.at(w['t'])} after a "
                             f"{call.get('status')} {call.get('outcome')} answer, which is "
                             "worth retrying", call, w)
            elif w.get("cause") == "poison" and not any(_is_poison(c) for c in received):
                verdict.fail("parked-without-refusal",
                             f"{where} as poison at {tl.at(w['t'])}, but the provider refused "
                             f"none of the step's {len(received)} call(s) (no 4xx, garbage or "
                             f"unusable answer); last error {w.get('last_error')!r}",
                             w, *received[-1:])
            elif (w.get("cause") == "attempts" and cap is not None
                  and w.get("attempts") is not None and w["attempts"] < cap):
                verdict.fail("parked-before-cap",
                             f"{where} for its attempts at {tl.at(w['t'])} after "
                             f"{w['attempts']} failed attempt(s), fewer than {cap_name}={cap}",
                             w)
            # a step that calls no model (a delivery) makes its attempts elsewhere: the
            # provider's ledger is no evidence of how many it made
            elif (w.get("cause") == "attempts" and cap is not None and h.step.get("model", True)
                  and len(received) < cap):
                verdict.fail("parked-before-cap",
                             f"{where} for its attempts at {tl.at(w['t'])}, but the provider "
                             f"received only {len(received)} call(s) of the step, fewer than "
                             f"{cap_name}={cap}; last error {w.get('last_error')!r}",
                             w, *received[-1:])
    return judged


def _check_caps(verdict: Verdict, tl: Timeline, settings: dict) -> None:
    """attempts <= max_attempts; calls per run of a step <= max_attempts + unwritten holdings.
    Where max_claims counts every claim, it bounds the attempts as well (the lower cap)."""
    caps = {"max_attempts": settings.get("max_attempts"),
            "max_claims": settings.get("max_claims") if counts_every_claim(settings) else None}
    if all(c is None for c in caps.values()):
        return
    name, cap = min(((n, c) for n, c in caps.items() if c is not None), key=lambda nc: nc[1])
    for job, events in tl.job_events.items():
        over = next((e for _, e in events if (e.get("attempts") or 0) > cap
                     and not is_operator(e)), None)
        if over is not None:
            verdict.fail("attempts-over-cap",
                         f"job {job}: {over.get('worker')} recorded attempt {over['attempts']} of "
                         f"state {over['from']!r} at {tl.at(over['t'])}, past {name}={cap}",
                         over)
    unwritten = Counter((h.job, h.step["name"], h.segment)
                        for holds in tl.holdings.values() for h in holds if h.write is None)
    for (job, step), entries in tl.calls.items():
        by_segment: dict[int, list[Event]] = defaultdict(list)
        for _, seg, call, _ in entries:
            by_segment[seg].append(call)
        for seg, calls in by_segment.items():
            allowed = cap + unwritten[(job, step, seg)]
            if len(calls) > allowed:
                verdict.fail("calls-over-cap",
                             f"job {job}: {len(calls)} provider calls for step {step!r}, but "
                             f"{name}={cap} plus {allowed - cap} claim(s) that ended "
                             f"without a write allow {allowed}; call {allowed + 1} by "
                             f"{calls[allowed].get('worker')} at "
                             f"{tl.at(calls[allowed]['t_start'])}", calls[0], calls[allowed])


def _check_waits(verdict: Verdict, tl: Timeline, settings: dict) -> dict:
    """Retry-After honoured, backoff within full-jitter bounds, jitter present."""
    # The shortest call timeout any worker ran with bounds when a hung call was given up.
    timeout = min([t for t in (settings.get("call_timeout"), *tl.call_timeouts)
                   if t is not None], default=None)
    stats = Counter()
    samples: dict[int, list[tuple[float, Event]]] = defaultdict(list)
    spread: list[tuple[tuple[float, float], float, float, Event]] = []
    for holds in tl.holdings.values():
        for h in holds:
            w = h.write
            if w is None or w["to"] != h.step["ready"] or w.get("next_run_at") is None:
                continue
            stats["retry_writes"] += 1
            if tl.is_skewed(h.worker):
                stats["skipped_skewed"] += 1  # its next_run_at is on another clock
                continue
            before = [(p, c) for p, c in h.calls if c["t_start"] <= w["t"] + TOL]
            call_pos, call = before[-1] if before else (None, None)
            retry_after = call.get("retry_after") if call else None
            # An HTTP date asks for the wait up to it, up to a second more than its seconds.
            asked = (max(retry_after, call["retry_at"] - call["t_end"])
                     if retry_after is not None and call.get("retry_at") is not None
                     else retry_after)
            # An answer that came after the client could have given up (a loaded fake that
            # took the request late) may never have reached it: its Retry-After is not judged.
            unseen = (retry_after is not None and timeout is not None and call["t_end"]
                      > min(call["t_start"], h.start["t"]) + timeout - TOL)
            stats["retry_after_unseen"] += unseen
            if retry_after is not None and not unseen and call.get("status") in (429, 503):
                stats["retry_after_checked"] += 1
                if _retry_after_ignored(verdict, tl, h, call_pos, call, retry_after):
                    continue
            bounds = backoff(settings, w.get("attempts") or 1)
            if bounds is None:
                stats["skipped_undeclared"] += 1  # the engine declares no backoff bounds
                continue
            low, ceiling = bounds
            _check_backoff(verdict, tl, h, call, low, max(ceiling, asked or 0.0), timeout)
            if retry_after is None:
                samples[w.get("attempts") or 0].append((w["next_run_at"] - w["t"], w))
                if ceiling - low > TOL:
                    spread.append((_wait_range(h, call, timeout), low, ceiling, w))
    for attempts, got in sorted(samples.items()):
        low, ceiling = backoff(settings, attempts)
        delays = [d for d, _ in got]
        # Equal waits, or all of them at the very top of the range: jitter over [low, high]
        # puts each wait in its top tenth with probability 0.1, all n of them with 0.1^n.
        equal = max(delays) - min(delays) <= max(0.001, 0.01 * ceiling)
        at_top = min(delays) >= low + 0.9 * (ceiling - low)
        if len(got) >= SYNC_MIN_RETRIES and (equal or at_top):
            verdict.fail("no-jitter",
                         f"{len(got)} retries after failed attempt {attempts} all wait "
                         f"{statistics.mean(delays):.3f} s (spread {max(delays) - min(delays):.4f}"
                         f" s): jitter would spread them over [{low:.3f}, {ceiling:.3f}] s",
                         *[w for _, w in got[:4]])
    return {"retry_writes": stats["retry_writes"], "skipped_skewed": stats["skipped_skewed"],
            "retry_after_checked": stats["retry_after_checked"],
            "retry_after_unseen": stats["retry_after_unseen"],
            "skipped_undeclared": stats["skipped_undeclared"],
            "jitter_spread": _check_spread(verdict, spread)}


def _wait_range(h: "Holding", call: Event | None, timeout: float | None) -> tuple[float, float]:
    """The wait the engine chose lies between these two: it read its clock between the
    failing answer (or the claim) and the audit write (see _check_backoff)."""
    w = h.write
    since = answered(call, timeout, h.start["t"]) if call else h.start["t"]
    return w["next_run_at"] - w["t"], w["next_run_at"] - since


def spread_test(ranges: list[tuple[float, float]], alpha: float = JITTER_ALPHA
                ) -> tuple[float, float, float]:
    """Whether waits known only within ranges [a, b] of [0, 1] (a wait over its declared
    backoff range) can come from the uniform spread the engine claims. Returns (too_low,
    too_high, band): too_low is how far the empirical CDF of the b's rises above the
    uniform's, too_high how far that of the a's falls below it; a value over `band` rejects
    the claim. The true waits' CDF lies between those two, so a claim that holds is
    rejected with probability at most `alpha`: band = sqrt(ln(2 / alpha) / 2n)
    (Dvoretzky-Kiefer-Wolfowitz, with Massart's constant)."""
    n = len(ranges)
    lows = sorted(min(max(a, 0.0), 1.0) for a, _ in ranges)
    highs = sorted(min(max(b, 0.0), 1.0) for _, b in ranges)
    too_low = max((i + 1) / n - x for i, x in enumerate(highs))
    too_high = max(x - i / n for i, x in enumerate(lows))
    return too_low, too_high, math.sqrt(math.log(2 / alpha) / (2 * n))


def _check_spread(verdict: Verdict, spread: list) -> dict:
    """Full jitter (or the engine's declared [low, high]) spreads waits uniformly over their
    range: every retry wait without a Retry-After, pooled over attempts (each scaled to its
    own range), against the uniform distribution."""
    ranges = [((a - low) / (high - low), (b - low) / (high - low))
              for (a, b), low, high, _ in spread]
    report = {"waits": len(ranges), "alpha": JITTER_ALPHA}
    if len(ranges) < JITTER_MIN_WAITS:
        return report
    too_low, too_high, band = spread_test(ranges)
    report.update(too_low=round(too_low, 4), too_high=round(too_high, 4), band=round(band, 4))
    if max(too_low, too_high) > band:
        how = "short" if too_low > band else "long"
        scaled = sorted((((b + a) / 2, w) for (a, b), (_, _, _, w) in zip(ranges, spread)),
                        key=lambda pair: pair[0])
        verdict.fail("jitter-not-spread",
                     f"{len(ranges)} retry waits are not spread over their backoff ranges, "
                     f"they are too {how}: their distribution is {max(too_low, too_high):.2f} "
                     f"off the uniform one the engine declares (allowed {band:.2f} at a "
                     f"false-alarm rate of {JITTER_ALPHA:g}); the median wait is at "
                     f"{statistics.median(m for m, _ in scaled):.2f} of its range",
                     *[w for _, w in scaled[:2] + scaled[-2:]])
    return report


def _check_outbox_waits(verdict: Verdict, idx, settings: dict) -> dict:
    """A failed send is retried after a wait within the sender's declared backoff bounds
    (outbox_backoff_bounds), and those waits are spread as the bounds' jitter says."""
    stats = Counter()
    spread: list = []
    for effect, rows in idx.rows.items():
        requests = idx.requests.get(effect, [])
        for e in rows:
            if not (e["type"] == "effect_state" and e.get("actor") == "sender"
                    and e.get("next_run_at") is not None and e.get("sent_at") is None
                    and e.get("dead_at") is None and e.get("last_error")):
                continue
            stats["retry_writes"] += 1
            # (the sender's next claim and request can follow its write within a millisecond)
            sent = [r for r in requests if r.get("worker") == e.get("worker")
                    and r["t_start"] < e["t"]]
            if sent and _refused_for_good(sent[-1]):
                verdict.fail("refusal-retried",
                             f"job {e['job']} {e['kind']!r}: the receiver refused "
                             f"{e.get('worker')}'s send for good (status "
                             f"{sent[-1].get('status')}), and the sender scheduled a retry "
                             "instead of dead-lettering the row", sent[-1], e)
                continue
            bounds = backoff(settings, e.get("attempts") or 1, "outbox_backoff_bounds")
            if bounds is None:
                stats["skipped_undeclared"] += 1
                continue
            low, high = bounds
            since = _send_ended(e, sent[-1] if sent else None, rows, settings)
            shortest, longest = e["next_run_at"] - e["t"], e["next_run_at"] - since
            if shortest > high + TOL or longest < low - TOL:
                verdict.fail("outbox-backoff-out-of-bounds",
                             f"job {e['job']} {e['kind']!r}: after failed send attempt "
                             f"{e.get('attempts')}, {e.get('worker')} waits {shortest:.3f} s "
                             f"before the retry; the sender's backoff allows [{low:.3f}, "
                             f"{high:.3f}] s", *sent[-1:], e)
            elif high - low > TOL:
                spread.append(((shortest, longest), low, high, e))
    return {"retry_writes": stats["retry_writes"],
            "skipped_undeclared": stats["skipped_undeclared"],
            "jitter_spread": _check_spread(verdict, spread)}


def _refused_for_good(request: Event) -> bool:
    """A definite answer no retry can change: a 4xx other than 408 and 429."""
    status = request.get("status")
    return (request.get("completion") != "info" and status is not None
            and 400 <= status < 500 and status not in (408, 429))


def _send_ended(write: Event, request: Event | None, rows: list[Event],
                settings: dict) -> float:
    """The earliest the sender can have read its clock for the retry `write` schedules:
    after the answer, when its request was answered in time; after its send timeout from
    its claim of the row, when it gave up (it sent after claiming; the fake may log the
    request's arrival later still, on a loaded machine); never after the write."""
    timeout = settings.get("send_timeout")
    # A dropped connection is seen at once; a held request only when the sender gives up.
    if request is not None and request.get("fault") not in ("timeout", "lost") and (
            timeout is None or request["t_end"] - request["t_start"] < timeout - TOL):
        return min(request["t_end"], write["t"])
    claims = [r for r in rows if r["type"] == "effect_claimed"
              and r.get("worker") == write.get("worker") and r["t"] < write["t"]]
    if not claims:
        return write["t"]
    return min(claims[-1]["t"] + (timeout or 0.0), write["t"])


def backoff(settings: dict, attempt: int, name: str = "backoff_bounds"
            ) -> tuple[float, float] | None:
    """The engine's declared (lowest, highest) wait after failed attempt `attempt` (of a
    step, or with name "outbox_backoff_bounds" of a send)."""
    bounds = settings.get(name) or ()
    if not bounds or attempt < 1:
        return None
    low, high = bounds[min(attempt, len(bounds)) - 1]
    return float(low), float(high)


def _retry_after_ignored(verdict: Verdict, tl: Timeline, h: Holding, call_pos: int, call: Event,
                         retry_after: float) -> bool:
    # The engine read its clock after the answer (t_end), so retry_at >= t_end + R; the
    # audit's own t may be later still (waiting for the write lock) and is not the bound.
    # An HTTP date names the instant itself (the call's retry_at): nothing before it.
    retry_at = call.get("retry_at")
    w = h.write
    earliest = call["t_end"] + retry_after if retry_at is None else retry_at
    asked = (f"{retry_after:g} s" if retry_at is None else
             f"{call.get('retry_after_header')!r} (an HTTP date, {tl.at(retry_at)})")
    head = (f"job {h.job}: step {h.step['name']!r} answered {call.get('status')} with "
            f"Retry-After {asked} at {tl.at(call['t_end'])}")
    if w["next_run_at"] < earliest - TOL:
        verdict.fail("retry-after-ignored",
                     f"{head}, but {h.worker} scheduled the retry "
                     f"{w['next_run_at'] - call['t_end']:.3f} s after it", call, w)
        return True
    entries = tl.calls.get((h.job, h.step["name"]), [])
    nxt = next(((p, c) for p, seg, c, h2 in entries if p > call_pos and seg == h.segment
                and (h2 is None or h2.start_pos > h.write_pos)), None)
    if nxt is None or tl.is_skewed(nxt[1].get("worker")) or any(
            h.write_pos < p < nxt[0] for p in tl.interventions.get(h.job, [])):
        return False  # an operator or the nemesis moved the job on, or a skewed clock claimed
    if nxt[1]["t_start"] < earliest - TOL:
        verdict.fail("retry-after-ignored",
                     f"{head}, but {nxt[1].get('worker')} called again "
                     f"{nxt[1]['t_start'] - call['t_end']:.3f} s after it", call, w, nxt[1])
        return True
    return False


def answered(call: Event, timeout: float | None, since: float | None = None) -> float:
    """The earliest the worker can have had its answer: the provider's t_end, or its own
    call timeout if that came first (a hanging provider stamps t_end long after the client
    gave up). The timeout runs from when the worker sent the request, which may be well
    before the loaded provider stamped t_start: `since` (the holding's start) bounds it."""
    if timeout is None:
        return call["t_end"]
    start = call["t_start"] if since is None else min(call["t_start"], since)
    return min(call["t_end"], start + timeout)


def _check_backoff(verdict: Verdict, tl: Timeline, h: Holding, call: Event | None,
                   lower: float, upper: float, timeout: float | None) -> None:
    # The engine's clock read lies between the failing answer (or the claim) and the audit
    # write, so the wait it chose lies in [next_run_at - write t, next_run_at - that start].
    w = h.write
    lowest = w["next_run_at"] - w["t"]
    highest = w["next_run_at"] - (answered(call, timeout, h.start["t"]) if call
                                  else h.start["t"])
    if lowest > upper + TOL or highest < lower - TOL:
        verdict.fail("backoff-out-of-bounds",
                     f"job {h.job}: after failed attempt {w.get('attempts')} of step "
                     f"{h.step['name']!r}, {h.worker} waits {lowest:.3f} s before the retry; the "
                     f"engine's backoff allows [{lower:.3f}, {upper:.3f}] s",
                     *([call] if call else []), w)


def _check_outage(verdict: Verdict, tl: Timeline, settings: dict, snapshot: dict,
                  window: list[Event | None]) -> dict:
    """The first calls after an outage, of the (job, step)s that failed in it, are spread."""
    start, end = window
    t_end = end["t"] if end else snapshot.get("phases", {}).get("heal_start") or math.inf
    retries = []
    for entries in tl.calls.values():
        calls = [c for _, _, c, _ in entries]
        if not any(start["t"] <= c["t_start"] <= t_end and c.get("outcome") != "ok"
                   for c in calls):
            continue
        i = next((i for i, c in enumerate(calls) if c["t_start"] >= t_end), None)
        if i is not None and i > 0:
            retries.append((calls[i], calls[i]["t_start"] - calls[i - 1]["t_end"]))
    report = {"start": tl.at(start["t"]), "retries": len(retries),
              "judged": (backoff(settings, 1) or (0.0, 0.0))[1] >= SYNC_MIN_BASE}
    if not retries:
        return report
    delays = [d for _, d in retries]
    starts = sorted(c["t_start"] for c, _ in retries)
    at_once, j = 0, 0
    for i, t in enumerate(starts):
        while t - starts[j] > SYNC_SPAN:
            j += 1
        at_once = max(at_once, i - j + 1)
    report.update(delay_min=round(min(delays), 4), delay_max=round(max(delays), 4),
                  delay_stdev=round(statistics.pstdev(delays), 4), max_in_20ms=at_once)
    if len(retries) < SYNC_MIN_RETRIES or not report["judged"]:
        return report
    identical = max(delays) - min(delays) <= TOL
    if at_once * 2 > len(retries) or identical:
        why = (f"{at_once} of {len(retries)} start within {SYNC_SPAN * 1000:.0f} ms"
               if at_once * 2 > len(retries) else f"all wait {min(delays):.3f} s (no jitter)")
        clustered = sorted(retries, key=lambda r: r[0]["t_start"])[:8]
        verdict.fail("synchronized-retries",
                     f"after the provider outage {tl.at(start['t'])}..{tl.at(t_end)}, the first "
                     f"retries of {len(retries)} failed steps are synchronized: {why}",
                     *[e for e in (start, end) if e], *[c for c, _ in clustered])
    return report


# -- bounded-work ------------------------------------------------------------------------

def check_bounded_work(history: list[Event], snapshot: dict[str, Any]) -> Verdict:
    """Claims of one step in a row stay within max_claims; crash-looping jobs end parked,
    and a park for a crash loop follows claims that crashed. Where max_claims counts every
    claim (`counts_every_claim`), so do these: all claims of the step since the job entered
    it, whether a failure or a crash ended each."""
    verdict = Verdict("bounded-work")
    if _unknown_without_audit(verdict, history, snapshot):
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


CHECKS = {"all-jobs-settle": check_all_jobs_settle,
          "retry-discipline": check_retry_discipline,
          "bounded-work": check_bounded_work}

#: the engine fields each check reads (chaos.schema): an evidence field an engine leaves out
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
    "retry-discipline": reads(
        submitted="actor attempts job pid worker",
        claimed="actor attempts job pid step token worker",
        state="actor attempts cause heartbeat job next_run_at pid to worker",
        memo="pid worker",
        effect_queued="job key kind pid worker",
        effect_claimed="job kind pid worker",
        effect_sent="job kind pid worker",
        effect_state="actor attempts dead_at job kind last_error next_run_at pid sent_at worker",
        billed="job outcome pid worker"),
}
