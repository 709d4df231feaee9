"""bench/harness_power.py --quick on one mutant and one search: it prints the command, the
table's header and the mutant's row with a figure, and whatever it started is gone when it
ends. Figures are not asserted."""
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


def test_the_quick_bench_prints_its_table_and_command_and_leaves_no_process():
    mark = uuid.uuid4().hex
    argv = [sys.executable, "bench/harness_power.py", "--quick", "--only",
            "no_token_on_complete", "--searches", "random"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, MARK: mark}, stdin=subprocess.DEVNULL)
    out = done.stdout
    assert done.returncode == 0, f"{out}\n{done.stderr}"
    lines = out.splitlines()
    assert lines[0] == ("command: python bench/harness_power.py --quick --only "
                        "no_token_on_complete --searches random"), out
    assert re.fullmatch(r"CPU seconds to the first catch, median of 1, at most 15 CPU s a "
                        r"cell; load \d+\.\d", lines[1]), out
    assert lines[2].split() == ["bug", "scenario", "random"], out
    assert re.fullmatch(r"no_token_on_complete +mutants/zombies +(\d+\.\d|>15)", lines[3]), out
    deadline = time.monotonic() + 10
    while (left := carrying(mark)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, left
