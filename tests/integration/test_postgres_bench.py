"""bench/postgres_throughput.py on tiny input: it runs the three engines and counts the
reference engine's statements by mechanism, and whatever it started is gone when it ends
(its PostgreSQL server, procrastinate's worker processes). Figures are not asserted."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from marked import MARK, carrying

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from pg_statements import REFERENCE, by_mechanism  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_the_bench_runs_on_tiny_input_and_leaves_no_process():
    mark = uuid.uuid4().hex
    argv = [sys.executable, "bench/postgres_throughput.py", "--jobs", "20", "--workers", "1",
            "--sync", "FULL", "--rounds", "1"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=240,
                          env={**os.environ, MARK: mark}, stdin=subprocess.DEVNULL)
    out = done.stdout
    assert done.returncode == 0, f"{out}\n{done.stderr}"
    assert out.startswith("command: python bench/postgres_throughput.py --jobs 20"), out
    row = next(line for line in out.splitlines() if line.startswith("FULL"))
    assert len(row.split()) == 8, row  # sync, workers, three rates, two ratios, load
    assert out.count("  total ") == 2, out  # both engines' statements were counted
    for part in ("memo:", "outbox:", "leases:", "spend records:"):
        assert f"\n  {part} " in out, out
    assert "with/without" in out, out
    deadline = time.monotonic() + 10
    while (left := carrying(mark)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, left


def test_statements_are_shared_out_by_what_they_serve():
    rows = [("BEGIN ISOLATION LEVEL READ COMMITTED", 8, 0, 0.0),
            ("INSERT INTO step_result (job_id) VALUES (%s)", 4, 4, 0.004),
            ("WITH due AS (SELECT id FROM job FOR UPDATE SKIP LOCKED) SELECT m FROM"
             " step_result", 2, 2, 0.002),
            ("UPDATE job SET state=%(working)s, claims=1, lease_until=1", 6, 0, 0.006),
            ("UPDATE job SET state=%(target)s, result=1", 8, 8, 0.008),
            ("VACUUM", 2, 2, 0.002)]
    shares = {m.name: rest for m, *rest in by_mechanism(rows, REFERENCE, 2)}
    assert shares["BEGIN"] == [4, 0, 0.0]
    assert shares["memo: the step's output"] == [2, 2, 2.0]
    assert shares["claim (leased, fenced)"] == [1, 1, 1.0]  # its join on memos is the claim's
    assert shares["lease: kept into the next step"] == [3, 0, 3.0]
    assert shares["state transition (fenced)"] == [4, 4, 4.0]
    assert shares["lease: heartbeat"] == [0, 0, 0.0]  # shown, with nothing in it
    assert shares["other"] == [1, 1, 1.0]
