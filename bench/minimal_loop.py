"""The least a durable job loop on SQLite can do for the four-step pipeline, as a yardstick for
the engine: each step's output and the job's move are committed together, the claim is kept
across a job's steps and the next job is claimed in the last step's transaction (4 commits a
job, as the engine), but with no spend records, no heartbeat thread, no lease token checked on
a write and no memo read before a call. Same database (the engine's schema, jobs submitted
through its store), same connection settings, the same instant steps.

It is not safe: a worker paused past its lease would overwrite its successor's work. It shows
what the engine's safety costs, not something to run.
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import sqlite3
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from chaos.run.supervisor import die_with_parent  # noqa: E402
from engine import DOCUMENT, open_store  # noqa: E402
from engine.steps import InstantSteps, StepContext  # noqa: E402
from engine.store import canonical_json  # noqa: E402
from engine_throughput import EngineRun, Tally  # noqa: E402
from sqlite_commits import CommitCounter  # noqa: E402

LEASE = 30.0
STEPS = InstantSteps()


def _claim(conn: sqlite3.Connection, worker: str, now: float) -> tuple[str, str] | None:
    """Lease the job due soonest, inside the caller's transaction: (id, payload) or None."""
    row = conn.execute("SELECT id, payload FROM job WHERE pipeline=? AND next_run_at IS NOT NULL"
                       " AND next_run_at<=? ORDER BY next_run_at LIMIT 1",
                       (DOCUMENT.name, now)).fetchone()
    if row is None:
        return None
    conn.execute("UPDATE job SET state=?, lease_until=?, next_run_at=?, lease_owner=?,"
                 " lease_token=lease_token+1 WHERE id=?",
                 (DOCUMENT.steps[0].working, now + LEASE, now + LEASE, worker, row[0]))
    return row[0], row[1]


def _write(conn: sqlite3.Connection, transaction) -> object:
    """Run `transaction(conn)` in BEGIN IMMEDIATE ... COMMIT; SQLite's busy handler waits."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = transaction(conn)
        conn.execute("COMMIT")
        return result
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _step(conn: sqlite3.Connection, job: str, index: int, output: dict, effects, worker: str):
    """Commit step `index` of `job`: its memo, the job's move, deliver's outbox rows, and on
    the last step the claim of the next job (returned)."""
    step, now = DOCUMENT.steps[index], time.time()
    last = index == len(DOCUMENT.steps) - 1
    text = json.dumps(output, sort_keys=True)
    conn.execute("INSERT INTO step_result (job_id, step, output, cost, at, worker)"
                 " VALUES (?,?,?,?,?,?)", (job, step.name, text, STEPS.COST, now, worker))
    state = step.done if last else DOCUMENT.steps[index + 1].working
    conn.execute("UPDATE job SET state=?, result=?, next_run_at=?, lease_until=? WHERE id=?",
                 (state, text, None if last else now + LEASE, 0 if last else now + LEASE, job))
    for effect in effects:
        conn.execute("INSERT INTO outbox (job_id, kind, payload, idempotency_key,"
                     " next_attempt_at, created) VALUES (?,?,?,?,?,?)",
                     (job, effect.kind, canonical_json(effect.payload), effect.key(job), now, now))
    return _claim(conn, worker, now) if last else None


def work_job(conn: sqlite3.Connection, job: str, payload: str, worker: str):
    """Run the four instant steps of `job`, a commit each; return the next job claimed."""
    memos: dict[str, dict] = {}
    data = json.loads(payload)
    for index, step in enumerate(DOCUMENT.steps):
        ctx = StepContext(job, step.name, worker, 1, memos.__getitem__)
        output = STEPS.call(step.name, data, ctx).output
        effects = STEPS.conclude(step.name, output, ctx).effects
        nxt = _write(conn, lambda c: _step(c, job, index, output, effects, worker))
        memos[step.name] = data = output
    return nxt


def _loop(db: str, sync: str, go, done, tally: Tally, index: int, parent: int) -> None:
    die_with_parent(parent)  # never outlives the benchmark, however it ends
    counter = CommitCounter().install()
    conn = sqlite3.connect(db, isolation_level=None, timeout=5.0)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={sync}")
    worker = f"minimal:{os.getpid()}"
    go.wait()
    cpu = tally.cpu_now()
    job, n = _write(conn, lambda c: _claim(c, worker, time.time())), 0
    while job is not None:
        job, n = work_job(conn, *job, worker), n + 1
    conn.close()
    done[index] = n
    tally.record(index, counter.commits, cpu)


def minimal_rate(jobs: int, workers: int, sync: str) -> EngineRun:
    """Jobs/s of `jobs` jobs through `workers` minimal-loop processes released together, each
    one's share and the commits in all. Raises SystemExit if a job is left undone."""
    with tempfile.TemporaryDirectory() as tmp:
        db = os.path.join(tmp, "minimal.db")
        store = open_store(db, synchronous="NORMAL")  # the engine's schema and submit
        now = time.time()
        for i in range(jobs):
            store.submit(f"job-{i}", DOCUMENT, {"title": f"t{i}", "body": "a b c " * 20}, now)
        store.close()
        ctx = mp.get_context("fork")
        go, done, tally = ctx.Event(), ctx.Array("i", workers), Tally(ctx, workers)
        procs = [ctx.Process(target=_loop, args=(db, sync, go, done, tally, i, os.getpid()))
                 for i in range(workers)]
        for p in procs:
            p.start()
        time.sleep(0.5)  # as engine_throughput: every process ready before the clock starts
        start = time.perf_counter()
        go.set()
        for p in procs:
            p.join()
        elapsed = time.perf_counter() - start
        if sum(done) != jobs:
            raise SystemExit(f"minimal loop: {sum(done)} of {jobs} jobs done "
                             f"(exit codes {[p.exitcode for p in procs]})")
    return EngineRun(jobs / elapsed, list(done), sum(tally.commits), sum(tally.cpu))
