"""bench/latency_throughput.py --quick: it prints the latency table and the instant-step table
with every row and column, and whatever it started (worker processes, forked workers, the
DBOS process) is gone when it ends. Figures are not asserted."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

from marked import MARK, carrying

ROOT = Path(__file__).resolve().parents[2]
NUMBER = r"-?\d+(\.\d+)?"


def numbers(line: str, start: int) -> list[str]:
    """The fields of `line` from field `start` on, each checked to be a number."""
    fields = line.split()[start:]
    for field in fields:
        assert re.fullmatch(NUMBER, field), (field, line)
    return fields


def test_the_quick_bench_prints_both_tables_and_leaves_no_process():
    mark = uuid.uuid4().hex
    argv = [sys.executable, "bench/latency_throughput.py", "--quick"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=280,
                          env={**os.environ, MARK: mark}, stdin=subprocess.DEVNULL)
    out = done.stdout
    assert done.returncode == 0, f"{out}\n{done.stderr}"
    lines = out.splitlines()
    assert lines[0] == "command: python bench/latency_throughput.py --quick", out
    # The latency table: 50 ms, then 1x1 and 1x4 with their seven figures and the load.
    rows = [line for line in lines if line.lstrip().startswith("50 ms")]
    assert [line.split()[2:4] for line in rows] == [["1", "1"], ["1", "4"]], out
    for row in rows:
        assert len(numbers(row.replace("(ran dry)", ""), 2)) == 10, row
    # The instant table: the yardsticks, both shapes, the pair without group commit and
    # audited, and the audit's overhead.
    full = [line for line in lines if line.startswith("FULL ")]
    raw, *table, overhead = full
    assert re.fullmatch(r"FULL   raw commits +\d+ commits/s, one row each, best of 5 samples "
                        r"from \d+; load \d+\.\d-\d+\.\d", raw), out
    assert [line[7:24].strip() for line in table] == [
        "minimal loop 1x1", "1x1", "1x4", "1x4 no group", "1x4 audited"], out
    for row in table:
        figures, runs, shares = row[24:].split()[:6], row[24:].split()[6], row[24:].split()[7:]
        assert len(numbers(" ".join(figures), 0)) == 6, row
        assert re.fullmatch(r"\d+", runs), row  # one round: one run
        assert shares == ["[150]"], row  # one process: every job
    # The commit counter sees the minimal loop's commits: a claim, then one a step, the
    # next claim in the last (601 for 150 jobs).
    assert table[0].split()[5:7] == ["4.01", "1.00"], table[0]
    assert re.fullmatch(r"FULL   audit overhead at 1x4: audited/plain \d+\.\d\d", overhead), out
    assert re.search(r"^DBOS( \S+ \(SQLite.*jobs/s called one by one, \d+ off a queue|"
                     r": not installed .*)$", out, re.M), out
    deadline = time.monotonic() + 10
    while (left := carrying(mark)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, left
