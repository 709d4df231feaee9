"""The reference engine on PostgreSQL beside SQLite and beside procrastinate: jobs/s through
four instant steps a job, at 1, 2, 4 and 8 worker processes, in the same run; then what its
leases, memo, spend records and outbox cost, in statements and round trips per job.

    python bench/postgres_throughput.py [--jobs 1000] [--workers 1,2,4,8] [--sync FULL,NORMAL]
                                        [--rounds 2]

Every crash-safety mechanism of the reference engine is on (fenced writes, memo, spend
records, outbox rows, heartbeat thread). procrastinate runs the same four steps as four
chained tasks (bench/procrastinate_bench.py). PostgreSQL is a server this script starts
for itself with PostgreSQL's durable defaults (bench/pg_statements.py: initdb and pg_ctl in
a temporary folder, loopback, stopped at the end), one fresh database per measurement;
`NORMAL` there is `synchronous_commit=off` for both engines. Each figure is the best of
--rounds runs: other work on the machine only ever slows a run. Everything runs on this one
machine, so this measures what each costs a job, not what many hosts gain.
"""
from __future__ import annotations

import argparse
import os
import sqlite3
import sys
import tempfile
from importlib.metadata import version

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine.steps import Conclusion, InstantSteps  # noqa: E402
from engine_throughput import engine_rate  # noqa: E402
from pg_statements import (PROCRASTINATE, REFERENCE, BenchServer, by_mechanism,  # noqa: E402
                           read_counts)
from procrastinate_bench import procrastinate_rate  # noqa: E402


class InstantWithoutEffects(InstantSteps):
    """The instant steps with no effects: deliver writes no outbox row. A step runner a
    user could write, to show what the outbox rows cost; the engine is unchanged."""

    def conclude(self, step, output, ctx) -> Conclusion:
        return Conclusion()


WITHOUT_EFFECTS = InstantWithoutEffects()


def best(rounds: int, measure) -> float:
    """The highest of `rounds` measurements: other work on the machine only ever slows one."""
    return max(measure() for _ in range(rounds))


def load() -> str:
    """The 1-minute load average, as printed beside each row."""
    return f"{os.getloadavg()[0]:.1f}"


def throughput(server: BenchServer, jobs: int, counts: list[int], syncs: list[str],
               rounds: int) -> None:
    """The table: each engine's jobs/s at each worker count and sync level (the best of
    `rounds` runs each), with ratios."""
    print(f"{'sync':<7}{'workers':>8}{'sqlite':>9}{'ours pg':>9}{'procrastinate':>15}"
          f"{'pg/sqlite':>11}{'ours/procr':>12}{'load':>6}   (jobs/s)")
    for sync in syncs:
        for n in counts:
            lite = best(rounds, lambda: engine_rate(jobs, n, sync)[0])
            ours = best(rounds, lambda: engine_rate(jobs, n, sync, db=server.database(sync))[0])
            theirs = best(rounds, lambda: procrastinate_rate(server.database(sync), jobs, n))
            print(f"{sync:<7}{n:>8}{lite:>9.0f}{ours:>9.0f}{theirs:>15.0f}"
                  f"{ours / lite:>11.2f}{ours / theirs:>12.2f}{load():>6}", flush=True)


def statement_costs(server: BenchServer, jobs: int) -> None:
    """Statements and the time waited on them per job, by mechanism, for one worker of each
    engine at FULL (counted in a run of its own: the counting itself costs time)."""
    for name, mechanisms, run in (
            ("reference engine", REFERENCE,
             lambda url, into: engine_rate(jobs, 1, "FULL", db=url, count_into=into)[0]),
            (f"procrastinate {version('procrastinate')}", PROCRASTINATE,
             lambda url, into: procrastinate_rate(url, jobs, 1, count_into=into))):
        with tempfile.TemporaryDirectory() as into:
            rate = run(server.database("FULL"), into)
            shares = by_mechanism(read_counts(into), mechanisms, jobs)
        print(f"\n{name}, 1 worker, FULL, {jobs} jobs ({rate:.0f} jobs/s counted, "
              f"{1000 / rate:.2f} ms a job): a job's statements, its round trips (statements"
              f" batched in a pipeline share one) and the worker's wait on them")
        print(f"  {'statement':<38}{'sent':>6}{'trips':>7}{'ms waited':>11}")
        for mechanism, calls, trips, ms in shares:
            print(f"  {mechanism.name:<38}{calls:>6.2f}{trips:>7.2f}{ms:>11.2f}")
        total = [sum(share[i] for share in shares) for i in (1, 2, 3)]
        print(f"  {'total':<38}{total[0]:>6.2f}{total[1]:>7.2f}{total[2]:>11.2f}")
        for part in dict.fromkeys(m.part for m, *_ in shares if m.part):
            calls, trips, ms = (sum(share[i] for share in shares if share[0].part == part)
                                for i in (1, 2, 3))
            print(f"  {part}: {calls:.2f} statements a job ({calls / total[0]:.0%}), {trips:.2f}"
                  f" round trips ({trips / total[1]:.0%}), {ms:.2f} ms waited"
                  f" ({ms / total[2]:.0%} of the wait)")


def outbox_cost(server: BenchServer, jobs: int, counts: list[int], rounds: int) -> None:
    """The reference engine with and without deliver's two outbox rows, at FULL (the best of
    `rounds` runs each)."""
    print(f"\noutbox rows as throughput: the same pipeline with deliver's effects dropped"
          f" (no outbox row), FULL, {jobs} jobs")
    print(f"{'workers':>8}{'with outbox':>13}{'without':>9}{'with/without':>14}{'load':>6}")
    for n in counts:
        with_rows = best(rounds, lambda: engine_rate(jobs, n, "FULL",
                                                     db=server.database("FULL"))[0])
        without = best(rounds, lambda: engine_rate(
            jobs, n, "FULL", db=server.database("FULL"),
            steps="postgres_throughput:WITHOUT_EFFECTS")[0])
        print(f"{n:>8}{with_rows:>13.0f}{without:>9.0f}{with_rows / without:>14.2f}"
              f"{load():>6}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--workers", default="1,2,4,8")
    parser.add_argument("--sync", default="FULL,NORMAL")
    parser.add_argument("--rounds", type=int, default=2,
                        help="runs of each measurement; the best is shown")
    args = parser.parse_args()
    counts = [int(w) for w in args.workers.split(",")]
    print("command: python bench/postgres_throughput.py " + " ".join(sys.argv[1:]))
    with BenchServer() as server:
        print(f"{args.jobs} jobs of four instant steps; PostgreSQL {server.version()} (fsync on),"
              f" SQLite {sqlite3.sqlite_version}, procrastinate {version('procrastinate')};"
              f" {os.cpu_count()} cores, load {load()}; best of {args.rounds} runs", flush=True)
        throughput(server, args.jobs, counts, args.sync.split(","), args.rounds)
        statement_costs(server, args.jobs)
        outbox_cost(server, args.jobs, counts[:2], args.rounds)
    print(f"\nload at the end {load()}")


if __name__ == "__main__":
    main()
