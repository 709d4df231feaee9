"""The reference engine on PostgreSQL beside SQLite: jobs/s through the four-step pipeline
with instant steps, at 1, 2, 4 and 8 worker processes, in the same run.

    python bench/postgres_throughput.py [--jobs 1000] [--workers 1,2,4,8] [--sync FULL,NORMAL]

Every crash-safety mechanism is on for both (fenced writes, memo, spend records, heartbeat
thread). PostgreSQL is a server this script starts for itself (initdb and pg_ctl in a
temporary folder, loopback, stopped at the end: chaos.pgserver), one fresh database per
row; `synchronous=NORMAL` there is `synchronous_commit=off`. Both run on this one machine,
so this measures what each store costs a job, not what many hosts gain.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from chaos.pgserver import PostgresServer  # noqa: E402
from engine_throughput import TX_PER_JOB, engine_rate  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--workers", default="1,2,4,8")
    parser.add_argument("--sync", default="FULL,NORMAL")
    args = parser.parse_args()
    counts = [int(w) for w in args.workers.split(",")]
    print(f"PostgreSQL beside SQLite: {args.jobs} jobs, four instant steps, "
          f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    print(f"{'sync':<7}{'workers':>8}{'sqlite jobs/s':>15}{'postgres jobs/s':>17}"
          f"{'pg/sqlite':>11}{'pg vs 1 worker':>16}")
    with PostgresServer() as server:
        for sync in args.sync.split(","):
            pg_single = None
            for n in counts:
                lite, _ = engine_rate(args.jobs, n, sync)
                pg, _ = engine_rate(args.jobs, n, sync, db=server.create_database(empty=True))
                pg_single = pg_single or pg
                print(f"{sync:<7}{n:>8}{lite:>15.0f}{pg:>17.0f}{pg / lite:>11.2f}"
                      f"{pg / pg_single:>16.2f}")
    print(f"(a job is {TX_PER_JOB} write transactions on either store)")


if __name__ == "__main__":
    main()
