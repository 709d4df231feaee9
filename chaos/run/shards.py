"""Shards: one campaign of seeds spread over a CI system's parallel jobs (`--shard I/N`).

Which shard a seed belongs to is a fixed function of the seed and the first seed of the
campaign's range, never of the order seeds ran in or of the machine:

    seed s of --seeds A..B belongs to shard I of N  when  (s - A) % N == I - 1

so `--seeds 1..6 --shard 2/3` runs seeds 2 and 5, and a failing seed is rerun from the seed
alone (`--seed 5`), whatever shard found it. `ninelives explore` draws its fresh seeds the
same way with A = 1 (each shard draws only seeds of its own residue), replays only the
corpus schedules of its own seeds, mutates only those, and spends 1/N of the budget: N shards
do the work of one exploration of the whole budget without repeating each other's seeds.
"""
from __future__ import annotations

import argparse
import random
import re
from dataclasses import dataclass
from typing import Sequence

SHARD_HELP = ("I/N: run only shard I of N (1 <= I <= N): seed s of --seeds A..B when "
              "(s - A) %% N == I - 1; `ninelives merge` combines the N shards' folders")


@dataclass(frozen=True)
class Shard:
    """Shard `index` (1-based) of `count`."""

    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def owns(self, seed: int, first: int = 1) -> bool:
        """Whether `seed` of a range starting at `first` is this shard's."""
        return (seed - first) % self.count == self.index - 1

    def seeds(self, chosen: Sequence[int]) -> list[int]:
        """This shard's seeds of the consecutive range `chosen`, in order. Raises ValueError
        naming --shard when it holds none (more shards than seeds)."""
        mine = [s for s in chosen if self.owns(s, chosen[0])]
        if not mine:
            raise ValueError(f"--shard {self}: seeds {chosen[0]}..{chosen[-1]} hold "
                             f"{len(chosen)} seed(s), none of them shard {self.index}'s; "
                             f"use at most {len(chosen)} shards")
        return mine

    def draw(self, rng: random.Random, below: int = 1 << 31) -> int:
        """A fresh seed in [1, below) that this shard owns (first seed 1), drawn from `rng`."""
        slots = (below - self.index) // self.count
        return self.index + self.count * rng.randrange(slots)

    def to_json(self) -> dict:
        return {"index": self.index, "count": self.count}


WHOLE = Shard(1, 1)


def parse_shard(text: str) -> Shard:
    """`I/N` with 1 <= I <= N (N at most 10,000). Raises ValueError saying what it expected."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
    if not match:
        raise ValueError(f"must be I/N (shard I of N, e.g. 2/4), got {text[:40]!r}")
    index, count = int(match.group(1)), int(match.group(2))
    if count < 1 or count > 10_000:
        raise ValueError(f"{text.strip()}: N must be 1 to 10,000 shards, got {count}")
    if not 1 <= index <= count:
        raise ValueError(f"{text.strip()}: I must be 1 to {count} (shards count from 1), "
                         f"got {index}")
    return Shard(index, count)


def shard(text: str) -> Shard:
    """An argparse type for --shard (a bad value exits 2 naming the flag): see parse_shard."""
    try:
        return parse_shard(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
