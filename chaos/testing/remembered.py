"""The failing seeds a test suite remembers, as Hypothesis keeps its failing examples: a
seed that failed a check is tried first the next time the same check runs, and forgotten
once it has passed FORGET_AFTER times in a row (the engine was fixed, and stayed fixed).

The database is a folder (`.ninelives/` by default, the pytest plugin's `ninelives_database`)
holding `seeds/<check>/<seed>.json`, one small file per remembered seed, written atomically:
parallel test processes never tear one, and a file that cannot be read is skipped, never
fatal (the database is a cache of good first tries, not a record that must be complete).
A check is named by what it runs: the mode (sim or run), the engine spec, the scenario, the
profile and the engine settings; its folder name is that, readable, with a short digest.
The explorer's corpus (chaos.explore.corpus) lives beside it, in `corpus/`.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import time
from typing import Any

#: Passes in a row after which a remembered failing seed is forgotten.
FORGET_AFTER = 3


def check_key(mode: str, engine_spec: str, scenario: str, profile: str,
              engine_set: dict[str, Any] | None = None, swarm: bool = False) -> dict[str, Any]:
    """What names one check in the database: seeds of another mode, engine, scenario,
    profile or settings mean other runs, so they are remembered apart."""
    return {"mode": mode, "engine": engine_spec, "scenario": scenario, "profile": profile,
            "engine_set": dict(sorted((engine_set or {}).items())), "swarm": swarm}


def slug(key: dict[str, Any]) -> str:
    """The folder name of a check: readable, and unique by its digest."""
    text = json.dumps(key, sort_keys=True, default=str)
    digest = hashlib.blake2b(text.encode(), digest_size=6).hexdigest()
    words = re.sub(r"[^A-Za-z0-9_.-]+", "_",
                   f"{key['mode']}-{key['scenario']}-{key['profile']}-{key['engine']}")
    return f"{words[:80]}-{digest}"


class RememberedSeeds:
    """The remembered failing seeds of one check (`key`, see check_key) under the database
    folder `root`; `root` None remembers nothing (the database is off)."""

    def __init__(self, root: str | None, key: dict[str, Any]) -> None:
        self.key = key
        self.folder = os.path.join(root, "seeds", slug(key)) if root else None
        self.warnings: list[str] = []

    def seeds(self) -> list[int]:
        """The remembered seeds, the most recent failure first."""
        entries = [e for e in (self._read(s) for s in self._names()) if e is not None]
        entries.sort(key=lambda e: (-e.get("failed_at", 0.0), e["seed"]))
        return [e["seed"] for e in entries]

    def failed(self, seed: int, fails: list[tuple[str, str]]) -> None:
        """Remember that `seed` failed (`fails`: invariant and error type of each failure)."""
        self._write(seed, {"key": self.key, "seed": seed, "failed_at": time.time(),
                           "fails": [list(f) for f in fails], "passes": 0})

    def passed(self, seed: int) -> bool:
        """Count a pass of `seed`, if remembered; True when this pass made it forgotten."""
        entry = self._read(seed) if self.folder else None
        if entry is None:
            return False
        entry["passes"] = int(entry.get("passes", 0)) + 1
        if entry["passes"] >= FORGET_AFTER:
            try:
                os.remove(self._path(seed))
            except FileNotFoundError:
                pass
            return True
        self._write(seed, entry)
        return False

    def entry(self, seed: int) -> dict[str, Any] | None:
        """What is remembered of `seed` (None: nothing)."""
        return self._read(seed) if self.folder else None

    def _names(self) -> list[int]:
        if not self.folder or not os.path.isdir(self.folder):
            return []
        return sorted(int(n[:-5]) for n in os.listdir(self.folder)
                      if n.endswith(".json") and n[:-5].lstrip("-").isdigit())

    def _path(self, seed: int) -> str:
        return os.path.join(self.folder, f"{seed}.json")

    def _read(self, seed: int) -> dict[str, Any] | None:
        path = self._path(seed)
        try:
            with open(path, encoding="utf-8") as fh:
                data = json.load(fh)
            if not isinstance(data, dict) or int(data["seed"]) != seed:
                raise ValueError("not a remembered seed")
            return data
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self.warnings.append(f"{path}: skipped ({type(exc).__name__}: {str(exc)[:80]})")
            return None

    def _write(self, seed: int, data: dict[str, Any]) -> None:
        if not self.folder:
            return
        os.makedirs(self.folder, exist_ok=True)
        path = self._path(seed)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1, sort_keys=True)
        os.replace(tmp, path)  # a test stopped mid-write leaves no half file


def order(remembered: list[int], seeds: range | list[int]) -> list[tuple[int, bool]]:
    """The seeds to try, as (seed, remembered): the remembered ones first (even outside
    `seeds`: they failed this check before), then the rest of `seeds` in order."""
    first = list(dict.fromkeys(remembered))
    taken = set(first)
    return [(s, True) for s in first] + [(s, False) for s in seeds if s not in taken]
