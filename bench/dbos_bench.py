"""DBOS on the engine benchmark's work: a four-step workflow with instant steps, on SQLite.

Used by engine_throughput.py when the optional `bench` extra (dbos) is installed.
"""
from __future__ import annotations

import os
import tempfile
import time


def run(jobs: int) -> float:
    """Run `jobs` four-step workflows one after another; returns workflows per second."""
    from dbos import DBOS

    with tempfile.TemporaryDirectory() as tmp:
        DBOS(config={"name": "ninelives-bench",
                     "system_database_url": f"sqlite:///{os.path.join(tmp, 'dbos.sqlite')}"})

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
        try:
            start = time.perf_counter()
            for i in range(jobs):
                document({"title": f"t{i}", "body": "a b c " * 20})
            return jobs / (time.perf_counter() - start)
        finally:
            DBOS.destroy()
