"""What a user sees while a long command works, when its output is not a terminal (a CI
log): a plain line per phase with its counts, what the drain waits for, and no escape codes
or bars. (On a terminal the same steps are rich's bars: tests/unit/test_console.py.)"""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from timed import lines_until

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ANSI = re.compile(r"\x1b\[")


def ninelives(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chaos.commands.cli", *args], cwd=ROOT, text=True,
                          capture_output=True, timeout=timeout)


def test_run_and_replay_show_every_phase_with_its_counts_and_what_the_drain_waits_for(
        tmp_path):
    done = ninelives("run", "smoke", "--profile", "smoke", "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    phases = [line.split(":")[0].strip() for line in lines if line.startswith("  ")]
    assert [p for i, p in enumerate(phases) if p not in phases[:i]] == [
        "planning", "starting", "chaos", "heal", "drain", "stopping", "check"], done.stderr
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


def test_each_phase_of_a_big_demo_says_where_it_stands_within_a_second_of_its_start(
        tmp_path):
    """Read as a user reads a CI log, with the time each line came: the first line of each
    phase comes within a second of the line before it (a bound of 1.5 s for a loaded
    machine), and the lines within a phase at a steady rate. Making 3,000 documents had kept
    `demo` silent for seconds before its first line. Interrupted once it delivers."""
    import signal
    proc = subprocess.Popen(
        [sys.executable, "-m", "chaos.commands.cli", "demo", "--jobs", "3000", "--out", str(tmp_path)],
        cwd=ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen, rest = lines_until(proc, proc.stderr, lambda seen: sum(
        text.startswith("  delivering:") for _, text in seen) >= 2
        or seen[-1][0] - seen[0][0] > 60)
    log = "\n".join(f"{t - seen[0][0]:6.2f} {text}" for t, text in seen) + "\n" + rest
    assert seen[0][1].startswith("ninelives demo: 3000 jobs"), log
    phases = [text.split(":")[0].strip() for _, text in seen[1:]]
    assert phases[0] == "submitting" and "delivering" in phases, log
    before = "demo"
    for (t0, _), (t1, text) in zip(seen, seen[1:]):
        phase = text.split(":")[0].strip()
        bound = 1.5 if phase != before else 3.0  # a phase's first line; then every 2 s
        assert t1 - t0 <= bound, f"{t1 - t0:.2f} s before {text!r}:\n{log}"
        before = phase
    assert proc.returncode == 130 and "Traceback" not in rest, log


@pytest.mark.parametrize("args,banner,first", [
    (["sweep", "--lease", "1,2", "--heartbeat", "on", "--profile", "smoke"], None,
     "  sweep: 0/2 runs"),
    (["mutants", "--only", "retry_after_ignored"], "ninelives mutants:", "  seed 1: 0/2 runs"),
    (["explore", "smoke", "--budget", "30"], None, "  explore: 0/30 s"),  # banner: stdout
], ids=["sweep", "mutants", "explore"])
def test_a_command_of_many_runs_says_where_it_stands_before_the_first_run_ends(
        tmp_path, args, banner, first):
    """sweep had said nothing until its first run ended (15 s), mutants nothing between its
    banner and its first finished run, explore nothing until a schedule ended (on stdout,
    every 10 s). Each now has a line within a second of its start (1.5 s after its banner,
    or 4 s after the process started where there is none), on stderr; then it is stopped."""
    import signal
    import time
    out = ["--out", str(tmp_path)] + (["--corpus", str(tmp_path / "corpus")]
                                      if args[0] == "explore" else [])
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "chaos.commands.cli", *args, *out], cwd=ROOT,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen, rest = lines_until(proc, proc.stderr,
                             lambda seen: seen[-1][1].startswith("  ") or len(seen) > 5)
    log = "\n".join(f"{t - started:6.2f} {text}" for t, text in seen) + "\n" + rest
    at, line = seen[-1]
    assert line.startswith(first), log
    if banner is None:
        assert len(seen) == 1 and at - started <= 4.0, log
    else:
        assert seen[0][1].startswith(banner) and at - seen[0][0] <= 1.5, log
    assert proc.returncode == 130 and "Traceback" not in rest, log
