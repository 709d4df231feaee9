"""The catalog's machinery: the registry of situations and their recognisers, what one run
reached of each (`Reached`), and the context a recogniser reads (the history, the snapshot
and the checkers' shared readings)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from chaos.checkers.index import readings
from chaos.checkers.ops import TOL, is_engine, is_worker
from chaos.history import Event

MAX_EXAMPLES = 3

CATALOG: dict[str, str] = {}
RECOGNISERS: dict[str, Callable[["Context"], Any]] = {}

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
    "retry-discipline": ("retry-after-honoured", "ambiguous-send-retried",
                         "failed-send-retried"),
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
        RECOGNISERS[name] = fn
        return fn
    return register


class Context:
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


def attributed(ctx: Context) -> str | None:
    if any(is_engine(e) and is_worker(e) for e in ctx.history) and not any(
            is_engine(e) and is_worker(e) and e.get("worker") for e in ctx.history):
        return "the engine's operations do not say which worker wrote them"
    return None
