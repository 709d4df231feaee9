"""`ninelives demo`: the engine end to end against the fakes, with real worker processes.

Starts the fake provider and receiver, submits faker-made documents, runs workers and a
sender as separate processes, waits until every job is delivered and every effect sent,
then prints the operator queries and what the ledgers saw.
"""
from __future__ import annotations

import os
import sys
import time
from datetime import datetime, timezone

from engine import DOCUMENT, open_store
from engine.operate import print_rows

from chaos.reports.console import Progress, plural
from chaos.contract import ProcessContext
from chaos.spec.documents import make_documents
from chaos.fakes import FakeProvider, FakeReceiver
from chaos.run.supervisor import Supervisor, evidence_in
from chaos.reference.adapter import REFERENCE


def run_demo(jobs: int = 300, workers: int = 2, seed: int = 1, out: str = "reports/demo",
             deadline: float = 120.0) -> int:
    """Run the demo; returns 0 when every job was delivered and every effect applied once."""
    run_dir = os.path.join(out, datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ"))
    os.makedirs(run_dir, exist_ok=True)
    db = os.path.join(run_dir, "engine.db")
    processes = plural(workers, "worker process", "worker processes")
    print(f"ninelives demo: {plural(jobs, 'job')}, {processes} and 1 sender, in {run_dir}",
          file=sys.stderr, flush=True)
    store = open_store(db)
    with Progress("submitting", jobs, unit="jobs") as shown:
        shown.update(0, detail=f"making {plural(jobs, 'document')}")
        documents = make_documents(jobs, seed)
        shown.update(0, detail="")
        for n, (job_id, payload) in enumerate(documents, 1):
            store.submit(job_id, DOCUMENT, payload, time.time())
            shown.update(n)
    with evidence_in(run_dir), \
            FakeProvider(os.path.join(run_dir, "provider.jsonl")) as provider, \
            FakeReceiver(os.path.join(run_dir, "receiver.jsonl")) as receiver, \
            Supervisor(lambda role, slot, n: REFERENCE.command(role, ProcessContext(
                db, provider.url, receiver.url, {"lease": 10, "call_timeout": 5}, slot)),
                log_dir=run_dir) as sup:
        sup.keep({"worker": workers, "sender": 1})
        with Progress("delivering", jobs, unit="jobs done") as shown:
            done = wait_delivered(store, sup, time.monotonic() + deadline, shown)
        print(f"ran {jobs} jobs with {workers} worker processes and 1 sender: "
              f"{'all delivered' if done else 'NOT all delivered before the deadline'}\n")
        applied = receiver.applied()
        calls = len(provider.entries())
    now = time.time()
    for title, rows in (("1. status", store.status(now)), ("2. stuck", store.stuck(now)),
                        ("3. failures", store.failures(DOCUMENT.parked_states)),
                        ("4. costs", store.costs(now))):
        print(f"-- {title}")
        print_rows(rows, False)
        print()
    delivered = store.query("SELECT COUNT(*) AS n FROM job WHERE state='delivered'")[0]["n"]
    keys = {e["key"] for e in applied}
    print(f"provider calls: {calls} for {delivered} delivered jobs x 3 model steps")
    print(f"receiver: {len(applied)} effects applied, {len(keys)} distinct keys "
          f"(expected {2 * delivered})")
    print(f"run folder: {run_dir}")
    ok = done and len(applied) == len(keys) == 2 * delivered
    return 0 if ok else 1


def wait_delivered(store, sup: Supervisor, deadline: float, shown: Progress) -> bool:
    """Wait until no job waits for a worker and the outbox is empty, or the deadline;
    `shown` counts the jobs done and says what is still awaited.

    Returns False at once if every process died (their logs are in the run folder).
    """
    while time.monotonic() < deadline:
        active, unsent = store.active_jobs(DOCUMENT.name), store.unsent_rows()
        waiting = [f"{plural(n, what)} {state}" for n, what, state in (
            (active, "job", "waiting for a worker"), (unsent, "outbox row", "unsent")) if n]
        shown.update(shown.total - active, detail=", ".join(waiting) or "all done")
        if active == 0 and unsent == 0:
            return True
        for child in sup.reap():
            shown.say(f"{child.name} (pid {child.pid}) exited with {child.proc.returncode}; "
                      f"log: {child.log_path}")
        if not sup.alive():
            return False
        time.sleep(0.2)
    return False
