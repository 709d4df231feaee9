"""Checker speed: every invariant over one saved history, with the readings the checkers share
built once (as runs do) and, for the ratio, rebuilt for every checker, in the same run.

    python bench/checker_speed.py [RUN_DIR ...] [--rounds 5]

Without a run folder it reads the fixture runs under tests/fixtures/runs. Rounds alternate
the two ways, and the table shows the median of each.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from chaos.checkers import CHECKERS, INVARIANTS, _load, index  # noqa: E402
from chaos.history import read_history  # noqa: E402


def timed(history, snapshot, shared: bool) -> float:
    """Seconds to run every checker once; `shared` False drops the readings between them."""
    index._last = None
    start = time.perf_counter()
    for name in INVARIANTS:
        if not shared:
            index._last = None
        CHECKERS[name](history, snapshot)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    runs = args.runs or sorted(glob.glob(os.path.join(ROOT, "tests", "fixtures", "runs", "*")))
    _load()
    print(f"python bench/checker_speed.py {' '.join(args.runs)} --rounds {args.rounds}")
    print(f"{'run':<40} {'events':>7} {'shared ms':>10} {'rebuilt ms':>11} {'ratio':>6}")
    for run in runs:
        history = read_history(os.path.join(run, "history.jsonl"))
        with open(os.path.join(run, "snapshot.json"), encoding="utf-8") as fh:
            snapshot = json.load(fh)
        shared, rebuilt = [], []
        for _ in range(args.rounds):
            shared.append(timed(history, snapshot, True))
            rebuilt.append(timed(history, snapshot, False))
        a, b = statistics.median(shared) * 1000, statistics.median(rebuilt) * 1000
        print(f"{os.path.relpath(run, ROOT)[-40:]:<40} {len(history):>7} {a:>10.1f} "
              f"{b:>11.1f} {b / a:>6.2f}")


if __name__ == "__main__":
    main()
