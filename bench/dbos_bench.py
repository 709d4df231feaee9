"""DBOS on the engine benchmark's work: a four-step workflow with instant steps, on SQLite.

Two shapes, both in one DBOS process: workflows called one after another (DBOS's fastest
path, no queue), and workflows enqueued up front and taken off a queue, the shape the
reference engine's jobs have (submitted first, then claimed by a worker) and the one
`examples/dbos_pipeline` runs. Used by engine_throughput.py.
"""
from __future__ import annotations

import os
import tempfile
import time

QUEUE = "bench"


def run(jobs: int) -> dict[str, float]:
    """Jobs/s of `jobs` four-step workflows: {"called": ..., "queued": ...}."""
    from dbos import DBOS

    with tempfile.TemporaryDirectory() as tmp:
        DBOS(config={"name": "ninelives-bench", "run_admin_server": False,
                     "log_level": "WARNING", "system_database_url": f"sqlite:///{os.path.join(tmp, 'dbos.sqlite')}"})

        @DBOS.step()
        def fetch(doc: dict) -> dict:
            text = " ".join(doc["body"].split())
            return {"title": doc["title"], "text": text, "chars": len(text)}

        @DBOS.step()
        def extract(fetched: dict) -> dict:
            return {"title": fetched["title"], "words": len(fetched["text"].split()),
                    "entities": [], "amount_cents": len(fetched["text"]) % 100000}

        @DBOS.step()
        def verify(extracted: dict) -> dict:
            return {"ok": True, "reason": "ok"}

        @DBOS.step()
        def deliver(extracted: dict) -> dict:
            return {"charge_cents": extracted["amount_cents"], "title": extracted["title"]}

        @DBOS.workflow()
        def document(doc: dict) -> dict:
            extracted = extract(fetch(doc))
            verify(extracted)
            return deliver(extracted)

        DBOS.launch()
        # A short polling interval: the default (1 s) would measure the poll, not the work.
        queue = DBOS.register_queue(QUEUE, polling_interval_sec=0.01)
        try:
            rates = {}
            start = time.perf_counter()
            for i in range(jobs):
                document({"title": f"t{i}", "body": "a b c " * 20})
            rates["called"] = jobs / (time.perf_counter() - start)
            start = time.perf_counter()
            handles = [queue.enqueue(document, {"title": f"q{i}", "body": "a b c " * 20})
                       for i in range(jobs)]
            for handle in handles:
                handle.get_result()
            rates["queued"] = jobs / (time.perf_counter() - start)
            return rates
        finally:
            DBOS.destroy()
