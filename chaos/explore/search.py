"""The exploration loop: run schedules, keep those that reach something new, mutate the kept
ones, stop at the first failure or when the budget is spent.

Each round runs one candidate: a fresh seed (with swarm testing, its own mix of faults) or a
mutation of a kept schedule, picked with odds that favour schedules reaching rare features
and schedules not mutated often yet (a plain form of the power schedules of AFL and
libFuzzer). The corpus on disk is replayed first, failures first. Time is read from the
`clock` passed in; what happens is told to a `Listener`.
"""
from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from chaos.spec.scenario import Scenario
from chaos.sim.run import simulate
from chaos.sim.spec import SimResult, SimSpec
from chaos.sim.swarm import swarm_spec
from chaos.run.shards import WHOLE, Shard
from chaos.explore.corpus import Corpus
from chaos.explore.coverage import Coverage, measure
from chaos.explore.schedules import Candidate, Kept, mutate

#: The share of rounds that run a fresh seed once the corpus holds schedules.
FRESH_SHARE = 0.35


class Listener:
    """Hears what the explorer does (every method optional; the command line prints them)."""

    def replaying(self, count: int, folder: str) -> None: ...
    def reached(self, explorer: "Explorer", new: list[str], candidate: Candidate) -> None: ...
    def ran(self, explorer: "Explorer", result: SimResult) -> None: ...
    def checker_crashed(self, explorer: "Explorer", result: SimResult) -> None: ...


@dataclass
class Outcome:
    """How an exploration ended: the failing run (None: the budget was spent with none),
    the candidate that made it, and what was reached on the way."""

    failure: SimResult | None
    candidate: Candidate | None
    runs: int
    seconds: float
    replayed: int
    first_reached: dict[str, tuple[float, int]]   # situation -> (seconds, runs) when first
    schedules_reaching: Counter                   # situation -> runs that reached it
    features: int
    kept: int
    crashed: int = 0
    unobservable: dict[str, str] = field(default_factory=dict)  # situation -> why


@dataclass
class Explorer:
    """Explores `scenario` on `engine` (an adapter with in_process). `seed`: the explorer's
    own randomness; `swarm`: each fresh seed its own mix of faults; `corpus`: where kept
    schedules go and are replayed from (None: kept in memory only); `shard`: the seeds this
    explorer draws, replays and mutates are its shard's alone (chaos.run.shards)."""

    scenario: Scenario
    engine: Any
    engine_spec: str
    seed: int = 0
    swarm: bool = True
    corpus: Corpus | None = None
    clock: Callable[[], float] = time.monotonic
    listener: Listener = field(default_factory=Listener)
    shard: Shard = WHOLE

    def __post_init__(self) -> None:
        self.rng = random.Random(f"ninelives.explore:{self.seed}" + (
            "" if self.shard == WHOLE else f":shard {self.shard}"))
        self.kept: list[Kept] = []
        self.hits: Counter = Counter()            # feature -> runs that reached it
        self.reaching: Counter = Counter()        # situation -> runs that reached it
        self.first: dict[str, tuple[float, int]] = {}
        self.unobservable: dict[str, str] = {}
        self.runs = self.crashed = 0
        self.started = self.clock()

    @property
    def elapsed(self) -> float:
        return self.clock() - self.started

    def spec(self, seed: int, swarm: bool) -> SimSpec:
        spec = SimSpec(self.scenario, seed, self.engine, self.engine_spec)
        return swarm_spec(spec) if swarm else spec

    def explore(self, budget: float, max_runs: int | None = None) -> Outcome:
        """Run until a schedule fails, `budget` seconds have passed or `max_runs` schedules
        have run; replays the corpus first."""
        self.started = self.clock()
        spent = lambda: self.elapsed >= budget or (  # noqa: E731
            max_runs is not None and self.runs >= max_runs)
        replayed = 0
        entries = [e for e in (self.corpus.entries() if self.corpus is not None else [])
                   if self.shard.owns(e.seed)]
        if entries:
            self.listener.replaying(len(entries), self.corpus.folder)
        for entry in entries:
            if spent():
                break
            replayed += 1
            candidate = Candidate(entry.seed, entry.choices, 0, "corpus")
            failed = self._round(candidate, entry.swarm, path=entry.path)
            if failed is not None:
                return self._outcome(failed, candidate, replayed)
        while not spent():
            candidate = self._next()
            failed = self._round(candidate, self.swarm)
            if failed is not None:
                return self._outcome(failed, candidate, replayed)
        return self._outcome(None, None, replayed)

    def _next(self) -> Candidate:
        if not self.kept or self.rng.random() < FRESH_SHARE:
            return Candidate(self.shard.draw(self.rng))
        weights = [sum(1.0 / self.hits[f] for f in k.features) / (1 + k.picked) ** 0.5
                   for k in self.kept]
        parent = self.rng.choices(self.kept, weights)[0]
        parent.picked += 1
        kin = [k for k in self.kept if k.seed == parent.seed and k is not parent]
        return mutate(parent, self.rng.choice(kin) if kin else None, self.rng)

    def _round(self, candidate: Candidate, swarm: bool,
               path: str | None = None) -> SimResult | None:
        """Run `candidate`; keep it when it reached something new; the result if it failed."""
        result = simulate(self.spec(candidate.seed, swarm), candidate.choices())
        self.runs += 1
        if result.exit_code == 2 and not result.failed:
            self.crashed += 1
            self.listener.checker_crashed(self, result)
        if result.failed:
            return result
        coverage = measure(result.history, result.snapshot)
        new = sorted(f for f in coverage.features if f not in self.hits)
        self._count(coverage)
        if new:
            kept = Kept(candidate.seed, tuple(result.choices), result.shape_choices,
                        coverage.features, tuple(new), path=path)
            if path is None and self.corpus is not None:
                kept.path = self.corpus.keep(result, new)
            self.kept.append(kept)
            self.listener.reached(self, new, candidate)
        self.listener.ran(self, result)
        return None

    def _count(self, coverage: Coverage) -> None:
        self.hits.update(coverage.features)
        self.reaching.update(coverage.situations.keys())
        self.unobservable.update(coverage.unobservable)
        for name in coverage.situations:
            self.first.setdefault(name, (self.elapsed, self.runs))

    def _outcome(self, failure: SimResult | None, candidate: Candidate | None,
                 replayed: int) -> Outcome:
        return Outcome(failure, candidate, self.runs, self.elapsed, replayed, dict(self.first),
                       Counter(self.reaching), len(self.hits), len(self.kept), self.crashed,
                       {n: why for n, why in self.unobservable.items() if n not in self.first})
