"""Observer overhead: engine throughput with the harness's audit triggers installed, as a ratio
to the same engine without them, measured in the same run.

    python bench/observer_overhead.py [--jobs 2000] [--workers 1,2] [--sync FULL,NORMAL] [--rounds 3]

Rounds alternate plain and audited runs so that drift on the machine hits both alike; the
table shows the median of each.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from engine_throughput import engine_rate  # noqa: E402

from chaos.reference import audit  # noqa: E402


def install_audit(store) -> None:
    with store.write() as conn:
        audit.install(conn)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--sync", default="FULL,NORMAL")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(f"observer overhead: {args.jobs} jobs, instant steps, median of {args.rounds} rounds")
    print(f"{'sync':<7}{'workers':>8}{'plain jobs/s':>14}{'audited jobs/s':>16}{'ratio':>8}")
    for sync in args.sync.split(","):
        for n in (int(w) for w in args.workers.split(",")):
            plain, audited = [], []
            for _ in range(args.rounds):
                plain.append(engine_rate(args.jobs, n, sync)[0])
                audited.append(engine_rate(args.jobs, n, sync, prepare=install_audit)[0])
            p, a = statistics.median(plain), statistics.median(audited)
            print(f"{sync:<7}{n:>8}{p:>14.0f}{a:>16.0f}{a / p:>8.2f}")


if __name__ == "__main__":
    main()
