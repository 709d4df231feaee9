"""Engine throughput: jobs/s through the four-step pipeline with instant steps, beside the raw
SQLite commit ceiling and DBOS on the same work, measured in the same run.

    python bench/engine_throughput.py [--jobs 2000] [--workers 1,2,4] [--sync FULL,NORMAL]

Workers are separate processes released together; each runs the engine's own `worker` command
(engine.cli, in a forked process) with every crash-safety mechanism on (fenced writes, memo,
spend records, heartbeat thread). Prints a table; the figures are for reading, not for
asserting.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import sqlite3
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from chaos.reference.observer import pid_of  # noqa: E402
from chaos.run.supervisor import OwnedPool, die_with_parent, log_tail  # noqa: E402
from engine import DOCUMENT, open_store  # noqa: E402
from engine.store import is_postgres_url  # noqa: E402
from pg_statements import StatementCounter  # noqa: E402
from sqlite_commits import CommitCounter  # noqa: E402

TX_PER_JOB = 4  # one commit per step; the last one also claims the next job


def raw_commit_ceiling(sync: str, seconds: float = 2.0) -> float:
    """Single-row write transactions per second with the engine's connection settings."""
    with tempfile.TemporaryDirectory() as tmp:
        conn = sqlite3.connect(os.path.join(tmp, "raw.db"), isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={sync}")
        conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
        n, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t (v) VALUES (?)", ("x" * 64,))
            conn.execute("COMMIT")
            n += 1
        rate = n / (time.perf_counter() - start)
        conn.close()
    return rate


@dataclass(frozen=True)
class EngineRun:
    """One measured run: jobs/s, each worker process's share of the jobs (in start order),
    the SQLite transactions they committed in all (None: not counted), and the CPU seconds
    they used from their release to their end, every thread's, user and system."""

    rate: float
    shares: list[int]
    commits: int | None = None
    cpu: float | None = None


class Tally:
    """What each forked worker process reports back: its commits and CPU seconds."""

    def __init__(self, ctx, workers: int) -> None:
        self.commits, self.cpu = ctx.Array("q", workers), ctx.Array("d", workers)

    @staticmethod
    def cpu_now() -> float:
        """This process's CPU seconds so far (every thread, user and system)."""
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    def record(self, index: int, commits: int, cpu_since: float) -> None:
        """Worker `index` committed `commits` and used the CPU since `cpu_since`."""
        self.commits[index], self.cpu[index] = commits, self.cpu_now() - cpu_since


def worker_argv(db: str, sync: str, steps: str, slots: int,
                settings: dict[str, Any] | None) -> list[str]:
    """The engine's own `worker` command line for one benchmark process: until idle, polling
    every 2 ms (the default 50 ms would measure the poll at the end, not the work)."""
    argv = ["worker", "--exit-when-idle", "--db", db, "--steps", steps, "--synchronous", sync,
            "--poll-interval", "0.002"]
    if slots != 1:
        argv += ["--slots", str(slots)]
    for name, value in (settings or {}).items():
        argv += [f"--{name.replace('_', '-')}",
                 ("on" if value else "off") if isinstance(value, bool) else str(value)]
    return argv


def _worker(argv: list[str], go, tally: Tally, index: int, count_into: str | None, log: str,
            parent: int) -> None:
    die_with_parent(parent)  # never outlives the benchmark, however it ends
    from engine.cli import main as engine_main
    counter = StatementCounter().install() if count_into else None
    committed = CommitCounter().install()
    with open(log, "w") as err:  # the engine's own lines (and any error) go to its log
        os.dup2(err.fileno(), 2)
    go.wait()
    cpu = tally.cpu_now()
    code = engine_main(argv)
    tally.record(index, committed.commits, cpu)
    if counter is not None:
        counter.dump(count_into)
    raise SystemExit(code)  # the engine's answer is this process's exit code


def engine_run(jobs: int, workers: int, sync: str, prepare=None, db: str | None = None,
               steps: str = "instant", count_into: str | None = None, slots: int = 1,
               settings: dict[str, Any] | None = None) -> EngineRun:
    """`jobs` jobs through `workers` processes running the engine's `worker` command (its
    real entry point, forked, released together) with `slots` job slots each.

    prepare(store), when given, runs on the fresh database first (e.g. to install an observer).
    db: a fresh database to use (a `postgresql://` URL, say); else a SQLite file of its own.
    steps: the step runner (the config's `steps`). count_into: a folder where each worker
    writes the statements it sent to PostgreSQL (pg_statements.StatementCounter).
    settings: more engine settings, as flags. Raises SystemExit if a worker fails or a job
    is left undelivered.
    """
    with tempfile.TemporaryDirectory() as tmp:
        db = db or os.path.join(tmp, "engine.db")
        store = open_store(db, synchronous="NORMAL")
        if prepare is not None:
            prepare(store)
        now = time.time()
        for i in range(jobs):
            store.submit(f"job-{i}", DOCUMENT, {"title": f"t{i}", "body": "a b c " * 20}, now)
        store.close()
        ctx = mp.get_context("fork")
        go, tally = ctx.Event(), Tally(ctx, workers)
        argv = worker_argv(db, sync, steps, slots, settings)
        logs = [os.path.join(tmp, f"worker-{i}.log") for i in range(workers)]
        procs = [ctx.Process(target=_worker, args=(argv, go, tally, i, count_into, logs[i],
                                                   os.getpid()))
                 for i in range(workers)]
        for p in procs:
            p.start()
        time.sleep(0.5)  # let every process import and open its store before the clock starts
        start = time.perf_counter()
        go.set()
        for p in procs:
            p.join()
        elapsed = time.perf_counter() - start
        failed = [(p.exitcode, log) for p, log in zip(procs, logs) if p.exitcode != 0]
        if failed:
            code, log = failed[0]
            raise SystemExit(f"a worker exited with {code}: {log_tail(log)}")
        shares = delivered_by_process(db, [p.pid for p in procs])
        if sum(shares) != jobs:
            raise SystemExit(f"only {sum(shares)} of {jobs} jobs were delivered")
    return EngineRun(jobs / elapsed, shares,
                     None if is_postgres_url(db) else sum(tally.commits), sum(tally.cpu))


def delivered_by_process(db: str, pids: list[int]) -> list[int]:
    """How many jobs each of `pids` delivered (the worker id of its last step names the
    process: `worker:<host>:<pid>:<nonce>`, with `/<slot>` after it with several slots)."""
    store = open_store(db)
    try:
        rows = store.query("SELECT worker FROM step_result WHERE step='deliver'")
    finally:
        store.close()
    per_pid = Counter(pid_of(row["worker"]) for row in rows)
    return [per_pid[pid] for pid in pids]


def engine_rate(jobs: int, workers: int, sync: str, prepare=None, db: str | None = None,
                steps: str = "instant", count_into: str | None = None
                ) -> tuple[float, list[int]]:
    """Jobs/s for `jobs` jobs through `workers` one-slot processes, and each worker's share
    (see engine_run)."""
    run = engine_run(jobs, workers, sync, prepare, db, steps, count_into)
    return run.rate, run.shares


def dbos_rates(jobs: int) -> dict[str, float]:
    """DBOS on the same four-step work (bench/dbos_bench.py), in a process of its own: DBOS
    is one instance per interpreter and starts threads of its own."""
    from dbos_bench import run as run_dbos
    with OwnedPool(1, mp.get_context("spawn")) as pool:
        return next(pool.map(run_dbos, [jobs]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--sync", default="FULL,NORMAL")
    args = parser.parse_args()
    print(f"engine throughput: {args.jobs} jobs, four steps, instant steps, WAL, "
          f"{os.cpu_count()} cores, SQLite {sqlite3.sqlite_version}")
    print(f"{'sync':<7}{'workers':>8}{'jobs/s':>10}{'tx/s':>9}{'raw commits/s':>15}"
          f"{'tx/raw':>8}{'vs 1 worker':>12}  share per worker")
    singles = {}
    for sync in args.sync.split(","):
        ceiling = raw_commit_ceiling(sync)
        single = None
        for n in (int(w) for w in args.workers.split(",")):
            rate, shares = engine_rate(args.jobs, n, sync)
            single = single or rate
            print(f"{sync:<7}{n:>8}{rate:>10.0f}{rate * TX_PER_JOB:>9.0f}{ceiling:>15.0f}"
                  f"{rate * TX_PER_JOB / ceiling:>8.2f}{rate / single:>12.2f}  {shares}")
        singles[sync] = single
    dbos = dbos_rates(args.jobs)
    print(f"DBOS {version('dbos')} (SQLite, same four steps, one process): "
          f"{dbos['called']:.0f} jobs/s called one by one, {dbos['queued']:.0f} off a queue")
    for sync, single in singles.items():
        print(f"  reference, 1 worker at {sync} / DBOS: {single / dbos['called']:.1f}x called, "
              f"{single / dbos['queued']:.1f}x queued")


if __name__ == "__main__":
    main()
