"""The kinds of value the harness's flags take, one parser each, shared by every command:
seeds (`N` is seeds 1..N, `A..B` seeds A to B), whole numbers with a floor and a ceiling,
finite seconds up to a day (the ceilings are chaos.spec.limits').

Each is an argparse `type`: a bad value exits 2 with argparse's message, which names the flag.
"""
from __future__ import annotations

import argparse
import math
from typing import Sequence

from chaos.spec.limits import MAX_COUNT, MAX_SECONDS

SEEDS_HELP = "N (seeds 1..N) or A..B (seeds A to B, inclusive)"


def parse_seeds(text: str) -> range:
    """`N` (seeds 1..N, N >= 1) or `A..B` (seeds A to B inclusive, A <= B). Raises
    ValueError saying what it expected."""
    try:
        if ".." in text:
            first, last = (int(x) for x in text.split("..", 1))
        else:
            first, last = 1, int(text)
    except ValueError:
        raise ValueError(f"must be N or A..B, got {text!r}") from None
    if last < first:
        raise ValueError(f"{text} names no seed" + (
            " (N is seeds 1..N: it must be >= 1)" if ".." not in text else
            ": the range is empty"))
    if last - first + 1 > MAX_COUNT:
        raise ValueError(f"{text} names {last - first + 1:,} seeds, more than the "
                         f"{MAX_COUNT:,} a command runs")
    return range(first, last + 1)


def seeds(text: str) -> range:
    """An argparse type for --seeds: see `parse_seeds`."""
    try:
        return parse_seeds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def seeds_text(chosen: Sequence[int]) -> str:
    """The --seeds argument that gives `chosen` (consecutive seeds, as parsed) back."""
    return f"{chosen[0]}..{chosen[-1]}"


def at_least(low: int, most: int = MAX_COUNT):
    """An argparse type for a whole number in [`low`, `most`]: a count past `most` would
    sit silent for hours, so it is refused as a bad value is."""
    def whole(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be a whole number, got "
                                             f"{text[:40]!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {value}")
        if value > most:
            raise argparse.ArgumentTypeError(f"must be at most {most:,}, got {value:,}")
        return value
    whole.__name__ = f"whole number in [{low}, {most}]"
    return whole


def parse_seconds(text: str) -> float:
    """A number of seconds above 0 and at most MAX_SECONDS (a day). Raises ValueError
    saying what it expected, quoting at most 40 characters of `text`."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"must be a finite number of seconds > 0, got {text[:40]!r}")
    if value > MAX_SECONDS:
        raise ValueError(f"must be at most {MAX_SECONDS:g} seconds (a day), got {value:g}")
    return value


def seconds(text: str) -> float:
    """An argparse type for seconds: see `parse_seconds`."""
    try:
        return parse_seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
