"""The explorer's corpus on disk, as Hypothesis keeps its example database: one file per kept
schedule, replayed first by the next exploration of the same scenario and engine.

Each file is a saved schedule (chaos.sim.shrink's format, so `ninelives sim --replay FILE`
runs it) with an `explore` section: the features the schedule reached first. A failure the
explorer found is kept too, and replayed before anything else next time. A file the explorer
cannot read is skipped with a warning, never fatal: the corpus is a cache of good starting
points, not a record that must be complete.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass

from chaos.sim.shrink import SCHEDULE_FORMAT, schedule_json
from chaos.sim.spec import SimResult

#: Where corpora go unless --corpus says otherwise (one folder per scenario and engine).
DEFAULT_ROOT = os.path.join(".ninelives", "corpus")


def default_dir(scenario: str, profile: str, engine_spec: str, swarm: bool) -> str:
    """The corpus folder of one exploration: `.ninelives/corpus/<scenario>-<profile>-<engine>`
    (and `-plain` without swarm testing: its seeds mean other schedules)."""
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{scenario}-{profile}-{engine_spec}")
    return os.path.join(DEFAULT_ROOT, slug + ("" if swarm else "-plain"))


@dataclass(frozen=True)
class Entry:
    """A schedule read from the corpus: its seed, its choices, whether it was a swarm seed,
    and whether it failed when it was kept."""

    path: str
    seed: int
    choices: tuple[int, ...]
    swarm: bool
    failed: bool


class Corpus:
    """The corpus folder `folder` (made when the first schedule is kept)."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.warnings: list[str] = []

    def entries(self) -> list[Entry]:
        """Every readable schedule, failures first, then in the order of their names."""
        if not os.path.isdir(self.folder):
            return []
        found = []
        for name in sorted(os.listdir(self.folder)):
            if name.endswith(".json"):
                entry = self._read(os.path.join(self.folder, name))
                if entry is not None:
                    found.append(entry)
        return sorted(found, key=lambda e: not e.failed)

    def _read(self, path: str) -> Entry | None:
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
            if data.get("format") != SCHEDULE_FORMAT:
                raise ValueError(f"not a saved schedule (format {SCHEDULE_FORMAT!r})")
            return Entry(path, int(data["seed"]), tuple(int(c) for c in data["choices"]),
                         data.get("swarm") is not None, bool(data.get("fails")))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self.warnings.append(f"{path}: skipped ({type(exc).__name__}: {str(exc)[:80]})")
            return None

    def keep(self, result: SimResult, new: list[str], *,
             target: tuple[str, str] | None = None) -> str:
        """Write `result` as a schedule file named by its seed and choices (the same
        schedule kept twice is one file); returns its path."""
        os.makedirs(self.folder, exist_ok=True)
        digest = hashlib.blake2b(json.dumps([result.spec.seed, result.choices]).encode(),
                                 digest_size=8).hexdigest()
        path = os.path.join(self.folder, f"{digest}.json")
        data = schedule_json(result, target, explore={"new": sorted(new)})
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(data, fh, separators=(",", ":"), sort_keys=True)
        os.replace(tmp, path)  # a run stopped mid-write leaves no half file
        return path

    def __len__(self) -> int:
        if not os.path.isdir(self.folder):
            return 0
        return sum(name.endswith(".json") for name in os.listdir(self.folder))
