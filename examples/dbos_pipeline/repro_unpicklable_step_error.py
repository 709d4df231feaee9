"""The smallest reproduction of a DBOS finding: a step that raises an exception DBOS cannot
pickle (urllib's HTTPError, which holds the open response) leaves no checkpoint of its
failure, and the workflow ends in ERROR with `TypeError: cannot pickle '_io.BufferedReader'
object` recorded in place of the step's HTTPError.

    python examples/dbos_pipeline/repro_unpicklable_step_error.py

prints what the caller got, what DBOS recorded as the workflow's error, and the step rows.
"""
from __future__ import annotations

import base64
import io
import pickle
import sqlite3
import sys
import tempfile
import urllib.error
from pathlib import Path

from dbos import DBOS


@DBOS.step()
def call_model() -> str:
    body = io.BufferedReader(io.BytesIO(b'{"error": "bad request"}'))
    raise urllib.error.HTTPError("http://127.0.0.1:9/v1/chat/completions", 400, "Bad Request",
                                 {}, body)  # what urlopen raises for a 4xx


@DBOS.workflow()
def pipeline() -> str:
    return call_model()


def main() -> int:
    db = Path(tempfile.mkdtemp()) / "repro.sqlite"
    DBOS(config={"name": "repro", "system_database_url": f"sqlite:///{db}"})
    DBOS.launch()
    try:
        pipeline()
    except Exception as exc:
        print(f"the caller got:            {type(exc).__name__}: {exc}")
    DBOS.destroy()
    conn = sqlite3.connect(db)
    (error,) = conn.execute("SELECT error FROM workflow_output").fetchone()
    recorded = pickle.loads(base64.b64decode(error))
    print(f"DBOS recorded the workflow: {type(recorded).__name__}: {recorded}")
    steps = conn.execute("SELECT function_name, error IS NOT NULL FROM operation_outputs").fetchall()
    print(f"step checkpoints:           {steps}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
