"""Throughput of worker processes with job slots: at model latency against the fake provider,
and with instant steps beside the raw SQLite commit ceiling, a minimal loop and DBOS.

    python bench/latency_throughput.py [--quick] [--latency 0.05,0.5]
        [--shapes 1x1,1x8,1x32,1x128,4x32] [--window 4] [--jobs 2000] [--sync FULL,NORMAL]
        [--instant-shapes 1x1,2x1,1x8,2x8,1x32] [--pair 1x8] [--rounds 2] [--dbos-jobs 300]

A shape PxS is P worker processes of S job slots each.

Latency table: the fake provider (chaos.fakes, a real HTTP server on 127.0.0.1 in this
process) answers every call after a fixed latency (the harness's own "slow" answer, as a
scenario's `latency = "fixed:S"` gives). Workers are started as the harness starts them (the
adapter's `python -m engine worker --exit-with-parent ...` command, the document pipeline's
real HTTP steps) on enough jobs that no slot runs dry. After a warm-up (every slot has
finished a call), steps committed in a window of --window seconds give jobs/s (model steps
per job: 3), read against the limit slots x processes / (3 x latency). Memory per job in
flight: the workers' resident memory (sampled through the window) minus an idle one-slot
worker's per process, over the jobs holding a live lease. CPU: cores used over the window by
the workers and by this process (the fake, mostly). The fake's lookup of each caller's
process is off: nothing here reads it, and it walks every descriptor of a 128-slot worker.

Instant table: four instant steps a job (engine_throughput.engine_run: the engine's own
worker command in processes released together, every mechanism on), each shape's jobs/s,
commits a job (SQLite COMMITs counted in every worker: bench/sqlite_commits.py) and the
jobs/s the raw commit ceiling allows at that many commits a job; the minimal loop
(bench/minimal_loop.py); the --pair shape with group commit off and with the harness's audit
triggers on (chaos.reference.audit); DBOS (the `bench` extra) on the same steps. Rows are
measured in --rounds rounds, each row once a round, and the best run is shown beside all.

Figures are for reading, never asserted.
"""
from __future__ import annotations

import argparse
import math
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Callable
from importlib.metadata import PackageNotFoundError, version

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from chaos.contract import ProcessContext  # noqa: E402
from chaos.fakes import FakeProvider  # noqa: E402
from chaos.reference.adapter import REFERENCE  # noqa: E402
from chaos.run.supervisor import Supervisor, log_tail  # noqa: E402
from engine import DOCUMENT, open_store  # noqa: E402
from engine_throughput import (EngineRun, dbos_rates, engine_run,  # noqa: E402
                               raw_commit_ceiling)
from minimal_loop import minimal_rate  # noqa: E402
from observer_overhead import install_audit  # noqa: E402

MODEL_STEPS = REFERENCE.pipeline.model_steps
STEPS_PER_JOB = len(DOCUMENT.steps)
#: No sender runs: the effects wait in the outbox, and this address is never called.
RECEIVER = "http://127.0.0.1:9/v1/effects"
SAMPLE_EVERY = 0.25
WARMUP_LIMIT = 60.0


def shapes(text: str) -> list[tuple[int, int]]:
    """`1x8,4x32` as [(processes, slots), ...]; raises ArgumentTypeError naming a bad one."""
    out = []
    for item in text.split(","):
        procs, _, slots = item.strip().partition("x")
        if not (procs.isdigit() and slots.isdigit() and int(procs) > 0 and int(slots) > 0):
            raise argparse.ArgumentTypeError(f"a shape is PROCESSESxSLOTS, e.g. 4x32: {item!r}")
        out.append((int(procs), int(slots)))
    return out


def load() -> str:
    """The 1-minute load average, as printed beside each row."""
    return f"{os.getloadavg()[0]:.1f}"


# -- the latency table ---------------------------------------------------------------------

@dataclass
class FixedLatency:
    """The fake provider's fault policy here: every call answered after `seconds`."""

    seconds: float

    def provider_fault(self, job: str, step: str, n: int) -> dict:
        return {"kind": "slow", "seconds": self.seconds}


class NoCallerLookup:
    """Stands in for the fake's caller lookup (chaos.fakes.peer): no process is looked up."""

    def pid_of(self, client: tuple, server_port: int) -> None:
        return None


@dataclass(frozen=True)
class LatencyRow:
    """One measured shape at one latency."""

    latency: float
    procs: int
    slots: int
    rate: float          # jobs/s over the window
    in_flight: float     # jobs holding a live lease, mean over the window
    rss: float           # bytes, the workers' resident memory, median over the window
    worker_cpu: float    # cores the workers used over the window
    fake_cpu: float      # cores this process (the fake provider) used
    dry: bool            # the queue ran out of jobs before the window ended

    @property
    def limit(self) -> float:
        return self.procs * self.slots / (len(MODEL_STEPS) * self.latency)


def submit_jobs(db: str, jobs: int) -> None:
    """`jobs` document jobs, due now, through the engine's store."""
    store = open_store(db, synchronous="NORMAL")
    try:
        now = time.time()
        for i in range(jobs):
            store.submit(f"job-{i}", DOCUMENT, {"title": f"t{i}", "body": "a b c " * 20}, now)
    finally:
        store.close()


def worker_supervisor(db: str, provider_url: str, slots: int, log_dir: str) -> Supervisor:
    """A Supervisor starting workers with the adapter's command, as a run starts them."""
    engine = {"slots": slots} if slots != 1 else {}
    ctx = ProcessContext(db=db, provider_url=provider_url, receiver_url=RECEIVER, engine=engine)
    return Supervisor(lambda role, slot, n: REFERENCE.command(role, ctx), log_dir=log_dir)


def model_memos(conn: sqlite3.Connection, since: float = 0.0) -> list[tuple[float, str]]:
    """When each model step committed at or after `since`, and by whom (a slot's own worker
    id), in order."""
    marks = ",".join("?" * len(MODEL_STEPS))
    return conn.execute(
        f"SELECT at, worker FROM step_result WHERE step IN ({marks}) AND at >= ? ORDER BY at",
        (*MODEL_STEPS, since)).fetchall()


def steps_per_second(memos: list[tuple[float, str]]) -> float:
    """Model steps per second: each slot's, from its first to its last step in the window,
    summed. A slot finishes a step every latency, and slots started together finish theirs
    together: counted over the window at once, where its edges fall between those bursts
    would sway the count by a whole burst."""
    by_slot: dict[str, list[float]] = {}
    for at, worker in memos:
        by_slot.setdefault(worker, []).append(at)
    return sum((len(ats) - 1) / (ats[-1] - ats[0]) for ats in by_slot.values()
               if len(ats) > 1 and ats[-1] > ats[0])


def leased(conn: sqlite3.Connection) -> int:
    """Jobs holding a live lease now: the jobs in flight."""
    return conn.execute("SELECT COUNT(*) FROM job WHERE lease_until > ?",
                        (time.time(),)).fetchone()[0]


def resident(pids: list[int]) -> int:
    """The processes' resident memory in bytes (from /proc, through psutil)."""
    return sum(psutil.Process(pid).memory_info().rss for pid in pids)


def cpu_seconds(pids: list[int]) -> float:
    """User and system CPU seconds the processes have used so far."""
    return sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in pids)


def check_alive(sup: Supervisor) -> None:
    """Raise SystemExit with a worker's log tail if one has exited."""
    for child in sup.reap():
        raise SystemExit(f"worker {child.name} exited with {child.proc.returncode}:\n"
                         f"{log_tail(child.log_path)}")


def warm_up(sup: Supervisor, conn: sqlite3.Connection, busy: int, latency: float) -> None:
    """Wait until `busy` model steps committed (every slot has been through a call) and two
    latencies more; raises SystemExit if that takes longer than WARMUP_LIMIT."""
    deadline = time.monotonic() + WARMUP_LIMIT
    while len(model_memos(conn)) < busy:
        check_alive(sup)
        if time.monotonic() > deadline:
            raise SystemExit(f"warm-up: {busy} steps not committed in {WARMUP_LIMIT:.0f} s")
        time.sleep(0.05)
    time.sleep(2 * latency)


def measure_window(sup: Supervisor, conn: sqlite3.Connection, window: float,
                   row: dict) -> LatencyRow:
    """Sample the workers through `window` seconds, then count the steps committed in it."""
    pids = [child.pid for child in sup.alive()]
    cpu0, own0, t0 = cpu_seconds(pids), time.process_time(), time.time()
    rss, flight = [], []
    while time.time() < t0 + window:
        check_alive(sup)
        rss.append(resident(pids))
        flight.append(leased(conn))
        time.sleep(SAMPLE_EVERY)
    t1 = time.time()
    cpu, own = cpu_seconds(pids) - cpu0, time.process_time() - own0
    steps = steps_per_second([memo for memo in model_memos(conn, t0) if memo[0] < t1])
    dry = conn.execute("SELECT COUNT(*) FROM job WHERE state=?",
                       (DOCUMENT.initial,)).fetchone()[0] == 0
    return LatencyRow(rate=steps / len(MODEL_STEPS), in_flight=statistics.mean(flight),
                      rss=statistics.median(rss), worker_cpu=cpu / (t1 - t0),
                      fake_cpu=own / (t1 - t0), dry=dry, **row)


def latency_row(provider: FakeProvider, latency: float, procs: int, slots: int,
                window: float) -> LatencyRow:
    """Start `procs` workers of `slots` slots on a fresh database and measure them."""
    provider.faults = FixedLatency(latency)
    limit = procs * slots / (len(MODEL_STEPS) * latency)
    jobs = math.ceil(limit * (window + 4 * latency + 5) * 1.2) + procs * slots
    with tempfile.TemporaryDirectory() as tmp:
        db = os.path.join(tmp, "engine.db")
        submit_jobs(db, jobs)
        conn = sqlite3.connect(db, timeout=10.0)  # reads only
        try:
            with worker_supervisor(db, provider.url, slots, tmp) as sup:
                for k in range(procs):
                    sup.spawn("worker", k)
                warm_up(sup, conn, procs * slots, latency)
                return measure_window(sup, conn, window, {
                    "latency": latency, "procs": procs, "slots": slots})
        finally:
            conn.close()


def idle_worker_rss(provider_url: str) -> int:
    """Resident memory of a one-slot worker polling an empty database, once it is steady
    (the same reading 1 s apart). Raises SystemExit if it never settles in 30 s."""
    with tempfile.TemporaryDirectory() as tmp:
        db = os.path.join(tmp, "idle.db")
        submit_jobs(db, 0)
        with worker_supervisor(db, provider_url, 1, tmp) as sup:
            child = sup.spawn("worker", 0)
            deadline, last = time.monotonic() + 30, -1
            while time.monotonic() < deadline:
                check_alive(sup)
                time.sleep(1.0)
                now = resident([child.pid])
                if now == last:
                    return now
                last = now
    raise SystemExit("the idle worker's memory did not settle in 30 s")


def latency_table(latencies: list[float], layout: list[tuple[int, int]], window: float) -> None:
    """Print the latency table: one row per latency and shape."""
    with tempfile.TemporaryDirectory() as tmp, \
            FakeProvider(os.path.join(tmp, "provider.jsonl")) as provider:
        provider.peers = NoCallerLookup()
        idle = idle_worker_rss(provider.url)
        print(f"\nat model latency: the fake provider on 127.0.0.1 answering every call after a"
              f" fixed latency; {len(MODEL_STEPS)} model steps a job; window {window:g} s after"
              f" a warm-up; an idle one-slot worker holds {idle / 2**20:.1f} MB")
        print(f"{'latency':>8}{'procs':>6}{'slots':>6}{'jobs/s':>8}{'limit':>8}{'of limit':>9}"
              f"{'in flight':>10}{'MB/job':>8}{'worker cpu':>11}{'fake cpu':>9}{'load':>6}")
        for latency in latencies:
            for procs, slots in layout:
                r = latency_row(provider, latency, procs, slots, window)
                per_job = (r.rss - procs * idle) / max(r.in_flight, 1) / 2**20
                print(f"{latency * 1000:>5.0f} ms{procs:>6}{slots:>6}{r.rate:>8.1f}"
                      f"{r.limit:>8.1f}{r.rate / r.limit:>9.2f}{r.in_flight:>10.1f}"
                      f"{per_job:>8.2f}{r.worker_cpu:>11.2f}{r.fake_cpu:>9.2f}{load():>6}"
                      f"{'  (ran dry)' if r.dry else ''}", flush=True)


# -- the instant-step table ----------------------------------------------------------------

def instant_measures(jobs: int, sync: str, layout: list[tuple[int, int]],
                     pair: tuple[int, int]) -> dict[str, Callable[[], EngineRun]]:
    """The instant table's rows at `sync`: label -> a measurement of it."""
    procs, slots = pair
    rows: dict[str, Callable[[], EngineRun]] = {
        "minimal loop 1x1": lambda: minimal_rate(jobs, 1, sync)}
    for p, s in layout:
        rows[f"{p}x{s}"] = lambda p=p, s=s: engine_run(jobs, p, sync, slots=s)
    rows.setdefault(f"{procs}x{slots}", lambda: engine_run(jobs, procs, sync, slots=slots))
    if slots > 1:
        rows[f"{procs}x{slots} no group"] = lambda: engine_run(
            jobs, procs, sync, slots=slots, settings={"group_commit": False})
    rows[f"{procs}x{slots} audited"] = lambda: engine_run(
        jobs, procs, sync, prepare=install_audit, slots=slots)
    return rows


def instant_row(sync: str, label: str, runs: list[EngineRun], minimal: float,
                ceiling: float) -> None:
    """Print one row of the instant table: its best run, and every run's jobs/s."""
    run = max(runs, key=lambda r: r.rate)
    jobs = sum(run.shares)
    per_job = run.commits / jobs
    print(f"{sync:<7}{label:<17}{run.rate:>7.0f}{per_job:>8.2f}{per_job / STEPS_PER_JOB:>8.2f}"
          f"{ceiling / per_job:>9.0f}{run.rate / minimal:>9.2f}{run.cpu / jobs * 1000:>8.2f}  "
          f"{'/'.join(f'{r.rate:.0f}' for r in runs):<12}{run.shares}", flush=True)


def instant_table(jobs: int, syncs: list[str], layout: list[tuple[int, int]],
                  pair: tuple[int, int], rounds: int, dbos_jobs: int) -> None:
    """Print the instant-step table: the engine's shapes, and `pair` without group commit
    and with the audit on, beside the raw commit ceiling, the minimal loop and DBOS. Rows
    are measured in `rounds` rounds, one after another in each, and the best run is shown:
    other work on the machine only ever slows one."""
    print(f"\ninstant steps: {jobs} jobs of {STEPS_PER_JOB} steps, WAL, SQLite"
          f" {sqlite3.sqlite_version}; best of {rounds} rounds (every run in 'runs'); tx: the"
          f" workers' commits; ceiling: the jobs/s the raw commit rate allows at that tx/job;"
          f" cpu: the workers' CPU ms a job, every thread, user and system")
    print(f"{'sync':<7}{'shape':<17}{'jobs/s':>7}{'tx/job':>8}{'tx/step':>8}{'ceiling':>9}"
          f"{'/minimal':>9}{'cpu':>8}  {'runs':<12}jobs per process")
    for sync in syncs:
        rows = instant_measures(jobs, sync, layout, pair)
        raw, runs, loads = [], {label: [] for label in rows}, [load()]
        for _ in range(rounds):
            for label, measure in rows.items():
                # The disk's rate drifts with other work: sampled before every run, the
                # best sample is the ceiling.
                raw.append(raw_commit_ceiling(sync, seconds=0.3))
                runs[label].append(measure())
            loads.append(load())
        ceiling = max(raw)
        print(f"{sync:<7}{'raw commits':<17}{ceiling:>7.0f} commits/s, one row each, best of"
              f" {len(raw)} samples from {min(raw):.0f}; load {'-'.join(loads)}")
        minimal = max(r.rate for r in runs["minimal loop 1x1"])
        for label, measured in runs.items():
            instant_row(sync, label, measured, minimal, ceiling)
        plain = f"{pair[0]}x{pair[1]}"
        ratio = max(r.rate for r in runs[f"{plain} audited"]) / max(r.rate for r in runs[plain])
        print(f"{sync:<7}audit overhead at {plain}: audited/plain {ratio:.2f}")
    dbos_line(dbos_jobs)


def dbos_line(jobs: int) -> None:
    """DBOS on the same four instant steps, or why not."""
    try:
        dbos = version("dbos")
    except PackageNotFoundError:
        print("DBOS: not installed (the `bench` extra; `make bench` installs it)")
        return
    rates = dbos_rates(jobs)
    print(f"DBOS {dbos} (SQLite, one process, {jobs} jobs): {rates['called']:.0f} jobs/s"
          f" called one by one, {rates['queued']:.0f} off a queue")


def main(argv: list[str] | None = None) -> None:
    """Print both tables, the command first."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="a small run that shows the tables' shape (for the tests)")
    parser.add_argument("--latency", default=None, help="seconds, comma-separated (0.05,0.5)")
    parser.add_argument("--shapes", type=shapes, default=None, help="1x1,1x8,1x32,1x128,4x32")
    parser.add_argument("--window", type=float, default=None, help="seconds measured (4)")
    parser.add_argument("--jobs", type=int, default=None, help="instant-table jobs (2000)")
    parser.add_argument("--sync", default=None, help="FULL,NORMAL")
    parser.add_argument("--instant-shapes", type=shapes, default=None,
                        help="1x1,2x1,1x8,2x8,1x32")
    parser.add_argument("--pair", type=shapes, default=None,
                        help="the shape run without group commit and audited (1x8)")
    parser.add_argument("--rounds", type=int, default=None, help="instant-table rounds (2)")
    parser.add_argument("--dbos-jobs", type=int, default=None, help="300")
    args = parser.parse_args(argv)
    quick = args.quick
    defaults = dict(latency="0.05" if quick else "0.05,0.5",
                    shapes=shapes("1x1,1x4" if quick else "1x1,1x8,1x32,1x128,4x32"),
                    window=1.0 if quick else 4.0, jobs=150 if quick else 2000,
                    sync="FULL" if quick else "FULL,NORMAL",
                    instant_shapes=shapes("1x1,1x4" if quick else "1x1,2x1,1x8,2x8,1x32"),
                    pair=shapes("1x4" if quick else "1x8"), rounds=1 if quick else 2,
                    dbos_jobs=20 if quick else 300)
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    print("command: " + " ".join(["python bench/latency_throughput.py", *sys.argv[1:]]))
    print(f"{os.cpu_count()} cores, load {load()}")
    latency_table([float(x) for x in args.latency.split(",")], args.shapes, args.window)
    instant_table(args.jobs, args.sync.split(","), args.instant_shapes, args.pair[0],
                  args.rounds, args.dbos_jobs)
    print(f"\nload at the end {load()}")


if __name__ == "__main__":
    main()
