"""Where a simulation's decisions come from: a seed, a saved list, or Hypothesis.

Every decision the simulation makes that is not fixed by the fault plan (which actor runs
next, whether a crash lands here, which jobs, workers and faults take part) is one call
`choose(n, sample, shape=...)` returning an integer in [0, n); `shape` marks the decisions
about the schedule's shape (which jobs, slots and faults take part), all made before the
first turn. All sources record the values they return, so any run can be replayed exactly
from its record, and Hypothesis can shrink it: its shrinker drives values towards 0, and 0
always means the simpler option (let the same actor go on, no crash, leave this job or
fault out).
"""
from __future__ import annotations

import random
from typing import Any, Callable

#: How a seeded source picks a value in [0, n): a function of its random source.
Sample = Callable[[random.Random], int]


class ReplayDiverged(ValueError):
    """A saved schedule asked for a choice it cannot make: the run went another way."""


class Choices:
    """The protocol: `choose(n, sample=None, shape=False) -> int` in [0, n), recorded in
    `record` (choices with n <= 1 are no choice: 0, not recorded)."""

    record: list[int]

    def choose(self, n: int, sample: Sample | None = None, shape: bool = False) -> int:
        raise NotImplementedError


class SeededChoices(Choices):
    """Decisions drawn from a random source seeded with the run's seed. `sample` says how
    (uniform over [0, n) by default)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(f"ninelives.sim:{seed}")
        self.record = []

    def choose(self, n: int, sample: Sample | None = None, shape: bool = False) -> int:
        if n <= 1:
            return 0
        value = sample(self.rng) if sample is not None else self.rng.randrange(n)
        self.record.append(value)
        return value


class ReplayChoices(Choices):
    """Decisions read back from a saved record; past its end every choice is 0."""

    def __init__(self, values: list[int]) -> None:
        self.values, self.i = list(values), 0
        self.record = []

    def choose(self, n: int, sample: Sample | None = None, shape: bool = False) -> int:
        if n <= 1:
            return 0
        value = self.values[self.i] if self.i < len(self.values) else 0
        if not 0 <= value < n:
            raise ReplayDiverged(f"choice {self.i} of the saved schedule is {value}, but the "
                                 f"run offers only {n} options there")
        self.i += 1
        self.record.append(value)
        return value


class DrawnChoices(Choices):
    """Decisions drawn by Hypothesis (`draw` from a composite strategy or `st.data()`), so
    that its shrinker can minimise them."""

    def __init__(self, draw: Callable[[Any], int]) -> None:
        from hypothesis import strategies as st
        self._st, self._draw, self._cache = st, draw, {}
        self.record = []

    def choose(self, n: int, sample: Sample | None = None, shape: bool = False) -> int:
        if n <= 1:
            return 0
        strategy = self._cache.get(n)
        if strategy is None:
            strategy = self._cache[n] = self._st.integers(0, n - 1)
        value = self._draw(strategy)
        self.record.append(value)
        return value


class ShapeDrawnChoices(Choices):
    """Hypothesis draws the schedule's shape; every turn is decided by the seed, as in the
    seeded run. Shrinking the shape this way leaves out jobs, slots and faults first, each
    try a whole seeded schedule, before the turns themselves are shrunk."""

    def __init__(self, draw: Callable[[Any], int], seed: int,
                 turns: Choices | None = None) -> None:
        # `turns`: where the turns come from instead of the seed (a run that was not its
        # seed's own, as an explored schedule, replays its own turns)
        self.drawn = DrawnChoices(draw)
        self.seeded = turns if turns is not None else SeededChoices(seed)
        self.record = []

    def choose(self, n: int, sample: Sample | None = None, shape: bool = False) -> int:
        value = (self.drawn if shape else self.seeded).choose(n, sample)
        if n > 1:
            self.record.append(value)
        return value


def everything(n: int) -> Sample:
    """A seeded sample that always takes the last option: "keep all" for structural
    choices, so a seeded run is the whole scenario and shrinking can only leave things out."""
    return lambda rng: n - 1
