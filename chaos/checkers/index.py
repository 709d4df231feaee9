"""The readings of a history the checkers share, built once per history: the provider's
calls per (job, step), memo lifetimes, who held each job when (JobIndex), the engine's spend
record of each call, the holdings timeline, and the outbox's requests and rows. Checkers
stay pure functions of (history, snapshot); they only stop reading the same history five
times over."""
from __future__ import annotations

from collections import defaultdict
from functools import cached_property
from typing import Any

from chaos.history import Event


class Readings:
    """Every shared reading of one history, each built the first time it is asked for."""

    def __init__(self, history: list[Event]) -> None:
        self.history = history
        self._timelines: dict[str, Any] = {}

    @cached_property
    def calls(self):
        from chaos.checkers.calls import provider_calls
        return provider_calls(self.history)

    @cached_property
    def memos(self):
        from chaos.checkers.memos import Memos
        return Memos(self.history)

    @cached_property
    def jobs(self):
        from chaos.checkers.transitions import JobIndex
        return JobIndex(self.history)

    @cached_property
    def spends(self):
        from chaos.checkers.calls import match_spends
        return match_spends(self.history, self.calls)

    @cached_property
    def windows(self):
        from chaos.checkers.ops import harness_windows
        return harness_windows(self.history)

    @cached_property
    def stalls(self) -> list[tuple]:
        """(pid, from, to) of every stall the simulation gave a process (its scheduler did
        not run it: the machine's hiccup, as a pause is the harness's)."""
        return [(e.get("pid"), e["t"], e["t"] + float(e.get("seconds") or 0.0))
                for e in self.history if e.get("src") == "process" and e.get("type") == "stall"]

    def stalled(self, pid: int | None, start: float, end: float) -> float:
        """How long process `pid` was ready to run and not run within [start, end]: each of
        its stalls counts for its overlap, weighed by the share of it the process waited
        (a run-queue stall records that; the simulation's stop the process whole)."""
        total = 0.0
        for e in self._stall_events.get(pid, ()):
            a, seconds = e["t"], float(e.get("seconds") or 0.0)
            overlap = min(end, a + seconds) - max(start, a)
            if overlap > 0 and seconds > 0:
                share = min(1.0, float(e.get("waited", seconds)) / seconds)
                total += overlap * share
        return total

    def held_still(self, pid: int | None, start: float, end: float) -> tuple[float, float]:
        """How long process `pid` could not run within [start, end], as (frozen, stalled):
        the time the harness held it paused (its pause windows, overlaps merged), and,
        outside those, the time the machine left it unrun (`stalled`), so that no second
        counts twice. (0, 0) for an unknown process."""
        if pid is None:
            return 0.0, 0.0
        spans = sorted((max(a, start), min(b, end)) for p, a, b in self.windows["pauses"]
                       if p == pid and a < end and b > start)
        frozen = stalled = 0.0
        since = start  # the end of the pauses counted so far
        for a, b in spans:
            if b > since:
                stalled += self.stalled(pid, since, max(a, since))
                frozen += b - max(a, since)
                since = b
        return frozen, stalled + self.stalled(pid, since, end)

    @cached_property
    def _stall_events(self) -> dict[int | None, list[Event]]:
        out: dict[int | None, list[Event]] = defaultdict(list)
        for e in self.history:
            if e.get("src") == "process" and e.get("type") == "stall":
                out[e.get("pid")].append(e)
        return out

    @cached_property
    def own_leases(self) -> dict[tuple, list[Event]]:
        """(job, worker, token) -> the worker's own writes of its lease under that token (its
        claims and renewals), in commit order."""
        from chaos.checkers.ops import is_heartbeat, is_worker
        out: dict[tuple, list[Event]] = defaultdict(list)
        for e in self.history:
            if e.get("src") == "engine" and is_worker(e) and e.get("lease_until") is not None \
                    and (e["type"] == "claimed" or is_heartbeat(e)):
                out[(e.get("job"), e.get("worker"), e.get("token"))].append(e)
        return out

    def lease_held(self, job: str, worker: str, token: Any, t: float
                   ) -> tuple[Event, float] | None:
        """The worker's last claim of the job under `token` at `t` (within TOL), and the end
        of the lease that claim and the worker's renewals since had written by then: what the
        worker knew of its lease. None without such a claim."""
        from chaos.checkers.ops import TOL
        held = [w for w in self.own_leases.get((job, worker, token), ()) if w["t"] <= t + TOL]
        claims = [w for w in held if w["type"] == "claimed"]
        if not claims:
            return None
        claim = claims[-1]
        return claim, max(w["lease_until"] for w in held if w["t"] >= claim["t"])

    @cached_property
    def paused_holds(self):
        from chaos.checkers.ops import paused_holds
        return paused_holds(self.history, self.windows)

    @cached_property
    def outbox(self):
        from chaos.checkers.effects import read_outbox
        return read_outbox(self.history)

    def timeline(self, pipeline: dict[str, Any]):
        from chaos.checkers.timeline import read_timeline
        key = repr(pipeline.get("steps"))
        if key not in self._timelines:
            self._timelines[key] = read_timeline(self.history, pipeline)
        return self._timelines[key]


_last: tuple[list[Event], int, Readings] | None = None


def readings(history: list[Event]) -> Readings:
    """The shared readings of `history` (the same object for the same, unchanged list)."""
    global _last
    if _last is not None and _last[0] is history and _last[1] == len(history):
        return _last[2]
    _last = (history, len(history), Readings(history))
    return _last[2]
