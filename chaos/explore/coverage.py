"""What a simulated run reached, as the features the explorer steers by.

Coverage is the catalog of dangerous situations (chaos.situations): a situation the run
reached is a feature, refined by the point that preceded it where the history shows one (a
situation reached right after a crash at `worker.after_call` is not the one reached after a
crash at `worker.before_commit`), and by how often it was reached, in powers of two (a run
that reaches a zombie write eight times holds denser interleavings than one that reaches it
once). A run that reaches a feature no run reached before is kept.
"""
from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

#: Counts of one situation that make features of their own (2 or more, 4 or more, ...).
COUNT_STEPS = (2, 4, 8, 16)


@dataclass(frozen=True)
class Coverage:
    """What one run reached: the situations (name -> count), the features (situations,
    situation@point pairs and situation*count steps), and the situations this engine's
    history cannot show (name -> why)."""

    situations: dict[str, int]
    features: frozenset[str]
    unobservable: dict[str, str]


def catalog() -> dict[str, str]:
    """The situations there are to reach: name -> what it is."""
    from chaos import situations  # read when exploring, not when the command line is built
    return dict(situations.CATALOG)


def measure(history: list[dict], snapshot: dict[str, Any]) -> Coverage:
    """The situations `history` reached and the features they make (see the module
    docstring). A situation this engine's history cannot show counts as not reached."""
    from chaos import situations
    reached = situations.recognise(history, snapshot)
    counts = {name: r.count for name, r in reached.items() if r.observable and r.count}
    features = set(counts)
    for name, count in counts.items():
        features.update(f"{name}*{step}" for step in COUNT_STEPS if count >= step)
    preceding = _Points(history)
    for name in counts:
        r = reached[name]
        lines = list(r.lines) + [None] * (len(r.examples) - len(r.lines))
        for example, line in zip(r.examples, lines):
            point = preceding.before(example, line)
            if point is not None:
                features.add(f"{name}@{point}")
    hidden = {name: r.why for name, r in reached.items() if not r.observable}
    return Coverage(counts, frozenset(features), hidden)


def situation_of(feature: str) -> str:
    """The situation a feature refines (a situation is its own)."""
    return feature.split("@", 1)[0].split("*", 1)[0]


class _Points:
    """The history's events that name a point (a crash point that fired, an aimed fault at a
    point), by job, to find the one that preceded an event of the same job."""

    def __init__(self, history: list[dict]) -> None:
        self.history = history
        self.position = {id(e): i for i, e in enumerate(history)}
        self.by_job: dict[Any, tuple[list[int], list[str]]] = defaultdict(lambda: ([], []))
        for i, e in enumerate(history):
            if isinstance(e.get("point"), str):
                positions, names = self.by_job[e.get("job")]
                positions.append(i)
                names.append(e["point"])

    def before(self, example: dict, line: int | None) -> str | None:
        """The point of the last such event of `example`'s job before it (None: none)."""
        at = self.position.get(id(example))
        if at is None and isinstance(line, int):
            at = line - 1  # the example's line in history.jsonl, 1-based
        if at is None or example.get("job") not in self.by_job:
            return None
        positions, names = self.by_job[example.get("job")]
        i = bisect.bisect_left(positions, at)
        return names[i - 1] if i else None
