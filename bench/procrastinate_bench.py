"""procrastinate on the engine benchmark's work: four instant steps a job, on PostgreSQL.

A job is four chained tasks, each deferring the next with its output as the next task's
arguments before it finishes: procrastinate's own way to make each step's completion
durable before the next starts (a task is its unit of retry; it has no steps inside a task
that survive a crash). A step's output is in the next task's row (the defer commits) before
the step's own row is marked succeeded, so a crash between the two runs the step again and
defers its successor twice: procrastinate is at-least-once per task, where the reference
engine commits a step's memo and the job's next state in one transaction.

Jobs are deferred up front; worker processes (`run_worker_async`, concurrency 1, its
defaults otherwise: LISTEN/NOTIFY on, a pool of its own) are released together and stop
when they have caught up (`wait=False`). Used by postgres_throughput.py.
"""
from __future__ import annotations

import asyncio
import multiprocessing as mp
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from chaos.run.supervisor import die_with_parent  # noqa: E402
from pg_statements import StatementCounter  # noqa: E402

QUEUE = "bench"
START_TIMEOUT = 60.0  # for the workers to open their pools
RUN_TIMEOUT = 600.0


def make_app(url: str):
    """A procrastinate App on database `url` with the four steps as tasks."""
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(name="fetch", queue=QUEUE)
    async def fetch(doc: dict) -> None:
        text = " ".join(doc["body"].split())
        await extract.defer_async(fetched={"title": doc["title"], "text": text,
                                           "chars": len(text)})

    @app.task(name="extract", queue=QUEUE)
    async def extract(fetched: dict) -> None:
        await verify.defer_async(extracted={
            "title": fetched["title"], "words": len(fetched["text"].split()),
            "entities": [], "amount_cents": len(fetched["text"]) % 100000})

    @app.task(name="verify", queue=QUEUE)
    async def verify(extracted: dict) -> None:
        await deliver.defer_async(extracted=extracted, verdict={"ok": True, "reason": "ok"})

    @app.task(name="deliver", queue=QUEUE)
    async def deliver(extracted: dict, verdict: dict) -> dict:
        return {"charge_cents": extracted["amount_cents"], "title": extracted["title"]}

    return app


def prepare(url: str, jobs: int) -> None:
    """Apply procrastinate's schema to the empty database `url` and defer `jobs` jobs."""
    import psycopg
    app = make_app(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(app.schema_manager.get_schema())

    async def defer_all() -> None:
        async with app.open_async():
            fetch = app.tasks["fetch"]
            for start in range(0, jobs, 500):
                await fetch.batch_defer_async(*({"doc": {"title": f"t{i}", "body": "a b c " * 20}}
                                                for i in range(start, min(jobs, start + 500))))
    asyncio.run(defer_all())


def _worker(url: str, ready, go, index: int, parent: int, count_into: str | None) -> None:
    die_with_parent(parent)  # never outlives the benchmark, however it ends
    counter = StatementCounter().install() if count_into else None
    app = make_app(url)

    async def work() -> None:
        async with app.open_async():
            await app.check_connection_async()  # the pool is open before the clock starts
            ready.wait(START_TIMEOUT)
            await asyncio.to_thread(go.wait)
            await app.run_worker_async(queues=[QUEUE], concurrency=1, wait=False,
                                       install_signal_handlers=False, name=f"bench-{index}")
    asyncio.run(work())
    if counter is not None:
        counter.dump(count_into)


def procrastinate_rate(url: str, jobs: int, workers: int,
                       count_into: str | None = None) -> float:
    """Jobs/s for `jobs` four-step jobs through `workers` processes on the empty database
    `url`. count_into: a folder where each worker writes the statements it sent. Raises
    SystemExit when a job did not finish."""
    prepare(url, jobs)
    ctx = mp.get_context("fork")
    ready, go = ctx.Barrier(workers + 1), ctx.Event()
    procs = [ctx.Process(target=_worker, args=(url, ready, go, i, os.getpid(), count_into))
             for i in range(workers)]
    try:
        for p in procs:
            p.start()
        ready.wait(START_TIMEOUT)
        start = time.perf_counter()
        go.set()
        for p in procs:
            p.join(max(0.0, start + RUN_TIMEOUT - time.perf_counter()))
        elapsed = time.perf_counter() - start
    finally:
        stop(procs)
    check_done(url, jobs)
    return jobs / elapsed


def stop(procs: list) -> None:
    """End and reap the worker processes still alive: SIGTERM, SIGKILL after 5 s."""
    for p in procs:
        if p.is_alive():
            p.terminate()  # ours: started by procrastinate_rate, ended by its pid
    for p in procs:
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join()


def check_done(url: str, jobs: int) -> None:
    """Raise SystemExit unless every job's last step succeeded and no task failed."""
    import psycopg
    with psycopg.connect(url, autocommit=True) as conn:
        rows = dict(conn.execute("SELECT task_name || ':' || status, COUNT(*) FROM"
                                 " procrastinate_jobs GROUP BY 1").fetchall())
    if rows.get("deliver:succeeded", 0) != jobs or len(rows) != 4:
        raise SystemExit(f"procrastinate did not finish {jobs} jobs: {rows}")
