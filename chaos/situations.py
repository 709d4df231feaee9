"""Dangerous situations a run reached ("sometimes" coverage), recognised from the history.

An invariant says what must always hold; a situation is a place worth reaching, where a
wrong engine would break one: a zombie's write after its lease was taken over, a step
finished from a memo left by a crashed worker, an outbox row taken from a sender still
alive. A pass means something only if the run reached the situations that could have broken
the invariant; one that reached none is reported as "pass, not exercised".

Everything here is engine-neutral and pure: a recogniser reads the history's vocabulary
(docs/history.md) and the final snapshot, and the checkers' shared readings
(chaos.checkers.index), never a process or a database.

The API (also used to steer exploration toward situations not reached yet):

  CATALOG     situation name -> one sentence: what it is and why it is dangerous
  EXERCISES   invariant name -> the situation names that exercise it (an invariant not
              listed guarantees something of every run, not of a dangerous situation: it
              is judged as before, and never "not exercised")
  recognise(history, snapshot) -> {name: Reached}, one per CATALOG entry:
              Reached.name, .count (how many times it was reached), .examples (up to
              MAX_EXAMPLES events, each the history's operation that shows one occurrence),
              .notes (a sentence per example), .lines (each example's line in
              history.jsonl, 1-based), .observable (False: this engine's evidence cannot
              show the situation) and .why (the reason, when not observable)
  exercise(verdicts, reached)  marks each passing verdict of an invariant in EXERCISES
              with `exercised` (whether any of its situations was reached) and
              `situations` ({name: count}, None for one not observable)
  summary_line(reached)  "situations reached: name x3, ...; not reached: ...; unobservable: ..."

A situation this engine's history cannot show is "unobservable" with the reason (no
provider ledger, no outbox leases, no heartbeat...), never a silent 0.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Callable

from .checkers.index import readings
from .checkers.ops import (LOCK_WINDOWS, TOL, capable, is_engine, is_heartbeat, is_worker,
                           takes_lease)
from .history import Event

MAX_EXAMPLES = 3

CATALOG: dict[str, str] = {}
_RECOGNISERS: dict[str, Callable[["_Context"], Any]] = {}

#: invariant -> the situations that exercise it (see the module docstring)
EXERCISES: dict[str, tuple[str, ...]] = {
    "fenced-writes": ("zombie-write-after-takeover", "heartbeat-after-lease-lost",
                      "call-answered-after-takeover", "outbox-takeover-from-live-sender"),
    "lease-exclusive": ("zombie-write-after-takeover", "call-answered-after-takeover",
                        "lock-wait-past-lease", "commit-after-lease-lapse"),
    "lease-kept": ("heartbeat-after-lease-lost", "lock-wait-past-lease",
                   "commit-after-lease-lapse"),
    "no-rebill-after-commit": ("memo-resume", "memo-resume-with-effects",
                               "crash-between-call-and-commit",
                               "call-answered-after-takeover"),
    "memo-consistent": ("memo-resume", "memo-resume-with-effects",
                        "zombie-write-after-takeover"),
    "cost-accounted": ("crash-between-call-and-commit", "call-answered-after-takeover"),
    "outbox-bounded": ("ambiguous-send-retried", "outbox-takeover-from-live-sender",
                       "crash-between-commit-and-effect"),
    "effects-complete": ("crash-between-commit-and-effect", "memo-resume-with-effects",
                         "ambiguous-send-retried"),
    "retry-discipline": ("retry-after-honoured", "ambiguous-send-retried"),
    "operator-moves": ("operator-move-on-worked-job",),
    "submissions-idempotent": ("duplicate-submit",),
    "bounded-work": ("kill-mid-step", "crash-between-call-and-commit"),
}


@dataclass
class Reached:
    """How often one situation was reached in a run, with examples."""

    name: str
    count: int = 0
    examples: list[Event] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)
    observable: bool = True
    why: str = ""

    @property
    def description(self) -> str:
        return CATALOG.get(self.name, "")

    def to_json(self) -> dict:
        return {"name": self.name, "description": self.description, "count": self.count,
                "observable": self.observable, "why": self.why,
                "examples": [{"t": e.get("t"), "job": e.get("job"),
                              "worker": e.get("worker") or e.get("target"),
                              "line": line, "note": note, "event": e}
                             for e, note, line in zip(self.examples, self.notes, self.lines)]}

    @classmethod
    def from_json(cls, data: dict) -> "Reached":
        examples = data.get("examples", [])
        return cls(data["name"], data.get("count", 0), [x.get("event", {}) for x in examples],
                   [x.get("note", "") for x in examples], [x.get("line") for x in examples],
                   data.get("observable", True), data.get("why", ""))


def situation(name: str, description: str):
    """Register a recogniser: ctx -> [(event, note)] of each occurrence, or a string (the
    reason this engine's history cannot show the situation)."""
    def register(fn):
        CATALOG[name] = description
        _RECOGNISERS[name] = fn
        return fn
    return register


class _Context:
    """The history and snapshot with the shared readings a recogniser needs."""

    def __init__(self, history: list[Event], snapshot: dict[str, Any]) -> None:
        self.history = history
        self.snapshot = snapshot
        self.shared = readings(history)
        self.jobs = self.shared.jobs
        self.pos = {id(e): i for i, e in enumerate(history)}
        t0 = history[0]["t"] if history else 0.0
        self.at = lambda t: "?" if t is None else f"+{t - t0:.3f} s"
        self._tl = None

    @property
    def timeline(self):
        if self._tl is None:
            self._tl = self.shared.timeline(self.snapshot.get("pipeline") or {"steps": []})
        return self._tl

    def ledger(self, name: str) -> bool:
        """Whether the fake's ledger `name` was kept (an empty one is then evidence)."""
        kept = self.snapshot.get("ledgers")
        if kept is not None:
            return name in kept
        return any(e.get("src") == name for e in self.history)

    def pid_of(self, e: Event) -> int | None:
        return e.get("pid") if e.get("pid") is not None else self.jobs.pids.get(e.get("worker"))

    def died(self, x: Event | None) -> bool:
        """Whether exit `x` is a death during the run, not the harness's orderly stop of
        every process once the run was over (after the drain)."""
        phases = self.snapshot.get("phases") or {}
        over = phases.get("drain_end") or phases.get("check_start")
        return x is not None and (over is None or x["t"] < over)

    def exit_between(self, pid: int | None, start: float, end: float) -> Event | None:
        """The first death (see `died`) of process `pid` within [start - TOL, end]."""
        for x in self.jobs.exits.get(pid, ()) if pid is not None else ():
            if start - TOL <= x["t"] <= end and self.died(x):
                return x
        return None

    def takeover(self, worker: str, job: str, after: Event, before_pos: int,
                 workers_only: bool = True) -> Event | None:
        """The first lease-taking write on `job` by someone else than `worker` committed
        after `after` and before history position `before_pos`."""
        start = self.pos[id(after)]
        for b in self.jobs.bumps.get(job, ()):
            p = self.pos[id(b)]
            if p <= start or b.get("worker") == worker:
                continue
            if p >= before_pos:
                return None
            if is_worker(b) or not workers_only:
                return b
        return None

    def worker_ids_match_calls(self) -> str | None:
        """None when the provider's calls name the engine's workers; else why not."""
        if not self.ledger("provider"):
            return "the provider's ledger was not kept"
        calls = [e for e in self.history if e.get("src") == "provider" and e["type"] == "call"]
        workers = {e.get("worker") for e in self.history if is_engine(e) and is_worker(e)}
        if calls and workers and not any(c.get("worker") in workers for c in calls):
            return "the provider's calls name no worker the engine's writes name"
        return None


def _attributed(ctx: _Context) -> str | None:
    if any(is_engine(e) and is_worker(e) for e in ctx.history) and not any(
            is_engine(e) and is_worker(e) and e.get("worker") for e in ctx.history):
        return "the engine's operations do not say which worker wrote them"
    return None


# -- leases ---------------------------------------------------------------------------------

@situation("zombie-write-after-takeover",
           "A worker wrote (or tried to: a memo or spend record kept from a refused "
           "completion) for a job after another worker took the job's lease: only the fence "
           "stops a zombie's write from overwriting the new holder's work.")
def _zombie_write(ctx: _Context):
    why = _attributed(ctx)
    if why:
        return why
    found, seen = [], set()
    for pos, e in enumerate(ctx.history):
        if not is_engine(e, "state", "memo", "billed", "effect_queued") or not is_worker(e):
            continue
        if takes_lease(e) or is_heartbeat(e) or (e["type"] == "memo" and e.get("op") == "delete"):
            continue
        worker, job = e.get("worker"), e.get("job")
        claim = ctx.jobs.claim_of(worker, job, e["t"]) if worker else None
        if claim is None or (worker, id(claim)) in seen:
            continue
        other = ctx.takeover(worker, job, claim, pos)
        if other is not None:
            seen.add((worker, id(claim)))
            found.append((e, f"job {job}: {worker} wrote a {e['type']} at {ctx.at(e['t'])} "
                              f"after {other.get('worker')} took the lease at "
                              f"{ctx.at(other['t'])}"))
    return found


@situation("call-answered-after-takeover",
           "A provider call's answer reached its caller after another worker had taken the "
           "caller's lease (or the harness had cut it short): the caller holds a paid result "
           "it may no longer commit.")
def _call_after_takeover(ctx: _Context):
    why = ctx.worker_ids_match_calls() or _attributed(ctx)
    if why:
        return why
    found, cuts = [], {}
    for e in ctx.history:   # the harness's writes that cut a job's lease short (expiry)
        if is_engine(e, "state") and e.get("actor") == "harness" and \
                (e.get("lease_until") or 0.0) <= e["t"] + TOL:
            cuts.setdefault(e["job"], []).append(e)
    for e in ctx.history:
        if e.get("src") != "provider" or e["type"] != "call" or e.get("completion") == "info":
            continue
        worker, job, end = e.get("worker"), e.get("job"), e.get("t_end")
        claim = ctx.jobs.claim_of(worker, job, e["t_start"]) if worker else None
        if claim is None or end is None:
            continue
        takers = [b for b in ctx.jobs.bumps.get(job, ()) if is_worker(b)
                  and b.get("worker") != worker] + cuts.get(job, [])
        for b in sorted(takers, key=lambda b: ctx.pos[id(b)]):
            if ctx.pos[id(b)] > ctx.pos[id(claim)] and b["t"] < end - TOL:
                who = "the harness cut" if b.get("actor") == "harness" \
                    else f"{b.get('worker')} took"
                found.append((e, f"job {job}: {worker}'s call for {e.get('step')!r} was "
                                 f"answered at {ctx.at(end)}, after {who} the lease at "
                                 f"{ctx.at(b['t'])}"))
                break
    return found


def _interval(settings: dict) -> float:
    every = settings.get("heartbeat_interval")
    return float(every) if every is not None else float(settings.get("lease") or 0.0) / 3


@situation("heartbeat-after-lease-lost",
           "A worker renewed (or, alive and unpaused past its renewal interval, was due to "
           "renew) a lease another worker had taken: a renewal unfenced extends the new "
           "holder's lease for the zombie.")
def _heartbeat_lost(ctx: _Context):
    settings = ctx.snapshot.get("settings") or {}
    if not capable(ctx.snapshot, "heartbeat") or settings.get("heartbeat") is False:
        return "the engine does not renew leases (no heartbeat)"
    why = _attributed(ctx)
    if why:
        return why
    found, seen = [], set()
    for pos, e in enumerate(ctx.history):   # a renewal committed after the takeover
        if is_engine(e, "state") and is_heartbeat(e) and is_worker(e) and e.get("worker"):
            claim = ctx.jobs.claim_of(e["worker"], e["job"], e["t"])
            if claim is not None and id(claim) not in seen and \
                    ctx.takeover(e["worker"], e["job"], claim, pos) is not None:
                seen.add(id(claim))
                found.append((e, f"job {e['job']}: {e['worker']} renewed at "
                                 f"{ctx.at(e['t'])} a lease taken over"))
    every, off = _interval(settings), ctx.shared.windows["no-heartbeat"]
    end_of_run = ctx.history[-1]["t"]
    for job, holdings in ctx.timeline.holdings.items():
        for h in holdings:
            if id(h.start) in seen:
                continue
            other = ctx.takeover(h.worker, job, h.start,
                                 h.write_pos if h.write is not None else len(ctx.history))
            pid = ctx.pid_of(h.start)
            if other is None or pid in off:
                continue
            dead = ctx.exit_between(pid, h.start["t"], end_of_run)
            if dead is not None and dead["t"] <= other["t"] + TOL:
                continue   # dead before the takeover: no renewal was due
            # A worker's next write of any job after the takeover: it had left the step.
            times = ctx.jobs.by_worker.get(h.worker, [])
            i = bisect.bisect_right(times, other["t"])
            moved = times[i] if i < len(times) else end_of_run
            until = min([x["t"] for x in (h.write, dead) if x is not None] + [end_of_run, moved])
            frozen, _ = ctx.shared.held_still(pid, other["t"], until)
            if until - other["t"] - frozen > every + TOL:
                seen.add(id(h.start))
                found.append((other, f"job {job}: {h.worker} was alive with its renewal due "
                                     f"for {until - other['t'] - frozen:.2f} s after "
                                     f"{other.get('worker')} took its lease at "
                                     f"{ctx.at(other['t'])}"))
    return found


def _has_leases(ctx: _Context) -> str | None:
    if not ctx.shared.own_leases:
        return "the engine's claims carry no lease end (lease_until)"
    return None


@situation("commit-after-lease-lapse",
           "A worker committed a step's end after its own lease had run out, nobody having "
           "taken the job meanwhile: an engine that fences by time alone refuses good work, "
           "one that does not fence lets a lapsed holder race a new one.")
def _commit_after_lapse(ctx: _Context):
    why = _has_leases(ctx) or _attributed(ctx)
    if why:
        return why
    found = []
    for job, holdings in ctx.timeline.holdings.items():
        for h in holdings:
            w = h.write
            if w is None or w["to"] != h.step.get("done"):
                continue
            held = ctx.shared.lease_held(job, h.worker, w.get("token"), w["t"])
            if held is None or w["t"] <= held[1] + TOL:
                continue
            if ctx.takeover(h.worker, job, held[0], h.write_pos, workers_only=False) is None:
                found.append((w, f"job {job}: {h.worker} committed {w['from']} -> {w['to']} "
                                 f"at {ctx.at(w['t'])}, its lease having ended at "
                                 f"{ctx.at(held[1])}"))
    return found


@situation("lock-wait-past-lease",
           "The store's write lock (or the job's row) was held past the end of a worker's "
           "lease on a job it was working on: its next write waits behind the lock while its "
           "lease runs out and another worker may claim the job.")
def _lock_wait(ctx: _Context):
    why = _has_leases(ctx)
    if why:
        return why
    windows = ctx.shared.windows
    spans = [(a, b, None) for a, b in windows["locks"]]
    spans += [(a, b, row) for table, row, a, b in windows.get("row_locks", ()) if table == "job"]
    starts = {e["t"]: e for e in ctx.history if e.get("src") == "nemesis"
              and e["type"] in LOCK_WINDOWS + ("row_lock",)}
    found = []
    for a, b, only in spans:
        for job, holdings in ctx.timeline.holdings.items():
            if only is not None and job != only:
                continue
            for h in holdings:
                if h.start["t"] > a or (h.write is not None and h.write["t"] < a):
                    continue
                held = ctx.shared.lease_held(job, h.worker, h.start.get("token"), a)
                if held is not None and a <= held[1] < b:
                    shown = starts.get(a, h.start)
                    found.append((shown, f"job {job}: {h.worker}'s lease ended at "
                                         f"{ctx.at(held[1])} while the lock held since "
                                         f"{ctx.at(a)} ({'until the end' if b == float('inf') else ctx.at(b)})"))
    return found



from . import situations_work  # noqa: E402,F401  (registers the rest)  # pyflakes: ignore


# -- the API --------------------------------------------------------------------------------

def recognise(history: list[Event], snapshot: dict[str, Any]) -> dict[str, Reached]:
    """Every situation of CATALOG, as reached (or not, or unobservable) in this run."""
    out: dict[str, Reached] = {}
    if not history:
        return {name: Reached(name, observable=False, why="the history is empty")
                for name in CATALOG}
    ctx = _Context(history, snapshot)
    for name, recogniser in _RECOGNISERS.items():
        reached = out[name] = Reached(name)
        try:
            found = recogniser(ctx)
        except Exception as exc:  # a broken recogniser must not abort a report
            reached.observable, reached.why = False, f"recogniser crashed: {exc!r}"
            continue
        if isinstance(found, str):
            reached.observable, reached.why = False, found
            continue
        reached.count = len(found)
        for event, note in found[:MAX_EXAMPLES]:
            reached.examples.append(event)
            reached.notes.append(note)
            reached.lines.append(ctx.pos.get(id(event), -1) + 1)
    return out


def exercise(verdicts: list, reached: dict[str, Reached]) -> list:
    """Mark each verdict of an invariant in EXERCISES: `situations` {name: count, None when
    unobservable}, and for a pass `exercised` (False: none of them was reached). Returns
    the verdicts."""
    for v in verdicts:
        needs = EXERCISES.get(v.name)
        if not needs:
            continue
        v.situations = {n: (reached[n].count if reached[n].observable else None)
                        for n in needs if n in reached}
        if v.valid is True:
            v.exercised = any(v.situations.values())
    return verdicts


def not_exercised(verdicts: list) -> list[str]:
    """The invariants that passed without any of their situations reached."""
    return [v.name for v in verdicts if v.valid is True and getattr(v, "exercised", None) is False]


def summary_line(reached: dict[str, Reached]) -> str:
    """One line: the situations reached with counts, those not reached, those unobservable."""
    hit = [f"{r.name} ×{r.count}" for r in reached.values() if r.count]
    missed = [r.name for r in reached.values() if r.observable and not r.count]
    blind = [r.name for r in reached.values() if not r.observable]
    line = "situations reached: " + (", ".join(hit) or "none")
    line += "; not reached: " + (", ".join(missed) or "none")
    if blind:
        line += "; unobservable: " + ", ".join(blind)
    return line
