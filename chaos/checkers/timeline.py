"""The holdings timeline the liveness checks share: a worker's hold on one step of a job, from
the `claimed` operation that gave it the step (a claim, or moving on from the previous step
under the same lease) to its own next write to the job that is not a heartbeat (complete,
retry, park). A holding with no such write ended in a crash or was fenced out."""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

from chaos.history import Event
from chaos.checkers.verdict import Verdict
from chaos.checkers.ops import (is_engine, is_heartbeat, is_job, is_operator, is_worker,
                                pids_by_worker)


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


def unknown_without_audit(verdict: Verdict, history: list[Event], snapshot: dict) -> bool:
    if snapshot["jobs"] and not any(is_job(e) for e in history):
        verdict.unknown("the snapshot has jobs but the history has no job operation")
        return True
    return False
