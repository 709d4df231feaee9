"""Schedules the explorer runs: a seed and a choice prefix, and the mutations that make new
ones from kept ones.

A simulated run is fixed by its spec (scenario, engine, seed: with swarm testing, the seed's
own mix of faults) and its choice sequence (chaos.sim.choices). The explorer keeps the
sequences of runs that reached something new and makes new sequences from them: change a
few choices, cut one short and let the rest be drawn afresh, or join the start of one to the
end of another. A mutated sequence is only a prefix: where it no longer fits the run (a
value past the options offered, since the run took another way) the value wraps around, and
past its end the choices are drawn as a seeded run draws them. The run records every value
it used, so a kept run replays exactly from its record (`ninelives sim --replay`).
"""
from __future__ import annotations

import random
from dataclasses import dataclass

from chaos.sim.choices import Choices, Sample

#: A prefix value that draws afresh, as a seeded run would (mostly "run", rarely a crash).
DRAW = -1
#: A prefix value that draws uniformly over every option (a crash or a stall as likely as a
#: run): how a mutation lands a fault where the seeded odds almost never would.
ANY = -2


class PrefixChoices(Choices):
    """Decisions read from `prefix` (DRAW and ANY drawn from `rng`, a value out of range
    taken modulo the options offered), then drawn from `rng` as SeededChoices draws them. With
    an empty prefix and `rng` seeded as SeededChoices(seed) seeds its own, the run is that
    seed's seeded run."""

    def __init__(self, prefix: list[int] | tuple[int, ...], rng: random.Random) -> None:
        self.prefix, self.rng, self.i = prefix, rng, 0
        self.record = []

    def choose(self, n: int, sample: Sample | None = None, shape: bool = False) -> int:
        if n <= 1:
            return 0
        value = self.prefix[self.i] if self.i < len(self.prefix) else DRAW
        self.i += 1
        if value == ANY:
            value = self.rng.randrange(n)
        elif value < 0:
            value = sample(self.rng) if sample is not None else self.rng.randrange(n)
        else:
            value %= n
        self.record.append(value)
        return value


def seeded_rng(seed: int) -> random.Random:
    """The random source SeededChoices(seed) uses: a fresh candidate is that seed's run."""
    return random.Random(f"ninelives.sim:{seed}")


@dataclass(frozen=True)
class Candidate:
    """One schedule to run: the seed (of the plan and, with swarm, of the faults' mix), the
    choice prefix, the seed of the fresh draws past it (None: the seed's own, as a seeded
    run), and how it was made (for the progress lines and the corpus)."""

    seed: int
    prefix: tuple[int, ...] = ()
    draws: int | None = None
    origin: str = "fresh"

    def choices(self) -> PrefixChoices:
        rng = seeded_rng(self.seed) if self.draws is None else random.Random(self.draws)
        return PrefixChoices(self.prefix, rng)


def mutate(parent: "Kept", other: "Kept | None", rng: random.Random) -> Candidate:
    """A new candidate from `parent` (and `other`, for a splice): one mutation, picked at
    random among changing a few choices, cutting the sequence short to be drawn afresh, and
    joining `parent`'s start to `other`'s end (when `other` has the same seed)."""
    ops = [change, cut] + ([splice] if other is not None and other.seed == parent.seed
                           and other is not parent else [])
    op = rng.choice(ops)
    prefix = op(parent, other, rng) if op is splice else op(parent, rng)
    return Candidate(parent.seed, tuple(prefix), rng.getrandbits(62), op.__name__)


def change(parent: "Kept", rng: random.Random) -> list[int]:
    """The parent's choices with one to four changed: each redrawn from the seeded odds,
    drawn uniformly (a crash or stall likely), or set to 0 (the same thread goes on, or a
    job or fault left out). One change in five lands in the schedule's shape."""
    prefix = list(parent.choices)
    if not prefix:
        return [ANY]
    for _ in range(1 + min(3, int(rng.expovariate(1.0)))):
        shape = parent.shape_choices and rng.random() < 0.2
        low = 0 if shape else min(parent.shape_choices, len(prefix) - 1)
        high = parent.shape_choices if shape else len(prefix)
        prefix[rng.randrange(low, high)] = rng.choice((DRAW, ANY, ANY, 0))
    return prefix


def cut(parent: "Kept", rng: random.Random) -> list[int]:
    """The parent's choices up to a point past its shape; the rest drawn afresh."""
    prefix = list(parent.choices)
    low = min(parent.shape_choices, len(prefix))
    return prefix[:rng.randint(low, len(prefix))]


def splice(parent: "Kept", other: "Kept", rng: random.Random) -> list[int]:
    """The parent's choices up to a point, then `other`'s from the same point on."""
    at = rng.randint(min(parent.shape_choices, len(parent.choices)), len(parent.choices))
    return list(parent.choices[:at]) + list(other.choices[at:])


@dataclass
class Kept:
    """A schedule the explorer keeps: the run's exact record, what it reached, and how often
    it was picked to be mutated."""

    seed: int
    choices: tuple[int, ...]
    shape_choices: int
    features: frozenset[str]
    new: tuple[str, ...] = ()
    picked: int = 0
    path: str | None = None
