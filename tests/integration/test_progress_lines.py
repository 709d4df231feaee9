"""What a user sees while a long command works, when its output is not a terminal (a CI
log): a plain line per phase with its counts, what the drain waits for, and no escape codes
or bars. (On a terminal the same steps are rich's bars: tests/unit/test_console.py.)"""
from __future__ import annotations

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ANSI = re.compile(r"\x1b\[")


def ninelives(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chaos.cli", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout)


def test_run_and_replay_show_every_phase_with_its_counts_and_what_the_drain_waits_for(
        tmp_path):
    done = ninelives("run", "smoke", "--profile", "smoke", "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    phases = [line.split(":")[0].strip() for line in lines if line.startswith("  ")]
    assert [p for i, p in enumerate(phases) if p not in phases[:i]] == [
        "planning", "starting", "chaos", "heal", "drain", "check"], done.stderr
    assert "  starting: 15/15 jobs submitted" in lines
    drain = [line for line in lines if line.startswith("  drain: ")]
    assert re.fullmatch(r"  drain: 15/15 jobs settled, all settled", drain[-1]), drain
    assert all(re.search(r"\d+/15 jobs settled, .*s to the deadline|all settled", line)
               for line in drain), drain
    assert not ANSI.search(done.stdout + done.stderr)
    run = next(line.split(": ", 1)[1] for line in done.stdout.splitlines()
               if line.startswith("report: "))
    replayed = ninelives("replay", os.path.dirname(run), "--out", str(tmp_path / "replays"))
    assert replayed.stderr.startswith("try 1/1: "), replayed.stderr
    assert "  drain: " in replayed.stderr and "reproduced" in replayed.stdout


def test_demo_counts_the_jobs_it_delivers(tmp_path):
    done = ninelives("demo", "--jobs", "12", "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert "  submitting: 12/12 jobs" in lines
    assert lines[-1] == "  delivering: 12/12 jobs done, all done", done.stderr
    assert not ANSI.search(done.stdout + done.stderr)
