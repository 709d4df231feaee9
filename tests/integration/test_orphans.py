"""Every harness command owns its children: SIGKILLed at a random moment, a real `ninelives`
process leaves nothing behind, however deep the process it started (pool workers, their runs'
workers and senders, the multiprocessing resource tracker). Stopped by Ctrl-C or SIGTERM, it
stops them itself, prints one line saying where its partial evidence is, and exits 130 or 143.

The moment is drawn from a seeded random source; the seed is printed, and
ORPHANS_SEED=N reruns the same draws.
"""
from __future__ import annotations

import glob
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
import uuid

import psutil
import pytest
from timed import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURE_RUN = os.path.join(ROOT, "tests", "fixtures", "runs", "pass")
MARK = "ORPHANS_TEST_MARK"  # inherited by every descendant, whatever its session
SEED = int(os.environ.get("ORPHANS_SEED", time.time_ns() % 1_000_000))

#: command -> (arguments after `ninelives`, given the output folder; how deep in its tree a
#: process must exist before the kill: 1 its own children, 2 its children's children).
COMMANDS = {
    "run": (lambda out: ["run", "smoke", "--profile", "smoke", "--out", out, "--quiet"], 1),
    "sweep": (lambda out: ["sweep", "--lease", "1,2", "--heartbeat", "on", "--profile",
                           "smoke", "--out", out], 2),
    "mutants": (lambda out: ["mutants", "--only", "retry_after_ignored", "--out", out], 2),
    # one PostgreSQL server for the whole command, stopped by its watchdog when it is killed
    "mutants-postgres": (lambda out: ["mutants", "--only", "retry_after_ignored", "--backend",
                                      "postgres", "--out", out], 2),
    "sweep-postgres": (lambda out: ["sweep", "--lease", "1,2", "--heartbeat", "on",
                                    "--profile", "smoke", "--backend", "postgres", "--out",
                                    out], 2),
    "sim": (lambda out: ["sim", "smoke", "--out", out, "--quiet"], 0),
    "replay": (lambda out: ["replay", FIXTURE_RUN, "--out", out], 1),
    # enough jobs to outlast the random moment (200 finished within it on an idle machine)
    "demo": (lambda out: ["demo", "--jobs", "2000", "--out", out], 1),
}


def depth_reached(pid: int, depth: int) -> bool:
    """Whether some process `depth` generations below `pid` exists."""
    level = [psutil.Process(pid)]
    for _ in range(depth):
        level = [c for p in level for c in _children(p)]
    return bool(level)


def _children(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children()
    except psutil.NoSuchProcess:
        return []


def left_behind(session: int, mark: str, out: str) -> list[str]:
    """Live processes that belong to the killed command: in its session or process group,
    carrying its environment marker, or naming its output folder on their command line."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        if proc.pid == os.getpid() or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            ours = os.getsid(proc.pid) == session or os.getpgid(proc.pid) == session
            ours = ours or proc.environ().get(MARK) == mark
        except (psutil.Error, OSError):
            continue  # gone meanwhile, or another user's
        cmdline = " ".join(proc.info["cmdline"] or [])
        if ours or out in cmdline:
            found.append(f"{proc.pid}: {cmdline}")
    return found


def still_left(session: int, mark: str, out: str, timeout: float) -> list[str]:
    """What `left_behind` finds once it finds nothing, or when `timeout` seconds passed."""
    deadline = time.monotonic() + timeout
    while (left := left_behind(session, mark, out)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


class Command:
    """One `ninelives` command in a session of its own, with a marker in its environment;
    `end()` kills whatever of it is left, whatever the test did."""

    def __init__(self, tmp_path, command: str, args=None, depth: int = 1) -> None:
        args, self.depth = COMMANDS[command] if args is None else (args, depth)
        self.name, self.out = command, str(tmp_path / "out")
        self.mark, self.log_path = uuid.uuid4().hex, tmp_path / "command.log"
        self.rng = random.Random(f"{SEED}-{command}")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "chaos.commands.cli", *args(self.out)], cwd=ROOT,
                stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                env={**os.environ, MARK: self.mark}, start_new_session=True)

    def at_a_random_moment(self) -> float:
        """Wait until its processes exist, then a random delay; returns the delay."""
        assert wait_until(lambda: self.proc.poll() is None
                          and depth_reached(self.proc.pid, self.depth), 40), \
            f"{self.name} never started its processes:\n{self.output()}"
        delay = self.rng.uniform(0.0, 2.0)
        print(f"ORPHANS_SEED={SEED}: {self.name} signalled {delay:.2f} s after its tree was "
              f"{self.depth} deep")
        time.sleep(delay)  # the random moment itself, not a wait for a condition
        assert self.proc.poll() is None, f"{self.name} ended before the signal:\n{self.output()}"
        return delay

    def left(self) -> list[str]:
        return still_left(self.proc.pid, self.mark, self.out, timeout=20)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def end(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for line in left_behind(self.proc.pid, self.mark, self.out):
            try:
                os.kill(int(line.split(":")[0]), signal.SIGKILL)
            except OSError:
                pass


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_command_killed_at_a_random_moment_leaves_no_process(tmp_path, command):
    cmd = Command(tmp_path, command)
    try:
        cmd.at_a_random_moment()
        cmd.proc.send_signal(signal.SIGKILL)
        cmd.proc.wait(10)
        left = cmd.left()
        assert not left, f"left behind by a SIGKILLed `ninelives {command}`: {left}"
    finally:
        cmd.end()


@pytest.mark.parametrize("command,sig,to_group", [
    ("run", signal.SIGINT, True),      # Ctrl-C at a terminal: the whole foreground group
    ("run", signal.SIGTERM, False),
    ("sweep", signal.SIGINT, False),   # its pool workers hear nothing: it must stop them
    ("mutants", signal.SIGTERM, False),
], ids=["run-SIGINT-group", "run-SIGTERM", "sweep-SIGINT", "mutants-SIGTERM"])
def test_a_stopped_command_ends_its_processes_says_where_its_evidence_is(tmp_path, command,
                                                                         sig, to_group):
    cmd = Command(tmp_path, command)
    try:
        cmd.at_a_random_moment()
        (os.killpg if to_group else os.kill)(cmd.proc.pid, sig)
        cmd.proc.wait(40)
        output = cmd.output()
        assert cmd.proc.returncode == 128 + sig, output
        assert "Traceback" not in output, output
        lines = [line for line in output.splitlines() if line.startswith("interrupted")]
        assert len(lines) == 1, output
        said = re.fullmatch(rf"interrupted \({sig.name}\): every process it started is "
                            r"stopped; its partial evidence is in (\S+)", lines[0])
        assert said, output
        assert said[1].startswith(cmd.out) and os.path.isdir(said[1]), lines[0]
        left = cmd.left()
        assert not left, f"left behind by `ninelives {command}` after {sig.name}: {left}"
    finally:
        cmd.end()


def test_a_child_whose_parent_died_before_it_asked_to_die_with_it_exits_at_once():
    """PR_SET_PDEATHSIG covers only a death after the request: a child that finds another
    parent than the one that started it (here: any other pid) must not go on to exec."""
    from functools import partial

    from chaos.run.supervisor import die_with_parent
    argv = [sys.executable, "-c", "print('ran')"]
    ran = subprocess.run(argv, capture_output=True, text=True, timeout=30,
                         preexec_fn=partial(die_with_parent, os.getpid() + 1_000_000))
    assert (ran.returncode, ran.stdout) == (1, "")
    ran = subprocess.run(argv, capture_output=True, text=True, timeout=30,
                         preexec_fn=partial(die_with_parent, os.getpid()))
    assert (ran.returncode, ran.stdout) == (0, "ran\n")


def test_a_run_killed_while_it_holds_a_worker_leaves_no_process(tmp_path):
    """An aimed hold blocks a worker's thread at its point: the run SIGKILLed meanwhile must
    not leave that worker behind, waiting for a release that will never come (the kernel's
    parent-death SIGKILL reaches it)."""
    cmd = Command(tmp_path, "run aim-zombie-completion", lambda out: [
        "run", "aim-zombie-completion", "--profile", "smoke", "--out", out, "--quiet"])
    try:
        assert wait_until(lambda: holding(cmd.out), 40), \
            f"no worker was ever held:\n{cmd.output()}"
        cmd.proc.send_signal(signal.SIGKILL)
        cmd.proc.wait(10)
        left = cmd.left()
        assert not left, f"left behind by a run killed during a hold: {left}"
    finally:
        cmd.end()


def holding(out: str) -> bool:
    """Whether a run under `out` holds a process now: an aim's hold in its events.jsonl
    (written as it happens) with no release after it."""
    held: set = set()
    for path in glob.glob(os.path.join(out, "**", "events.jsonl"), recursive=True):
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                e = json.loads(line) if line.endswith("\n") else {}
                if e.get("src") == "nemesis" and "aim" in e:
                    key = (path, e["aim"], e.get("pid"))
                    if e["type"] == "hold":
                        held.add(key)
                    elif e["type"] == "release":
                        held.discard(key)
    return bool(held)


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, read from /proc/<pid>/task/*/children, breadth first."""
    found, level = [], [pid]
    while level:
        below = []
        for parent in level:
            try:
                tasks = os.listdir(f"/proc/{parent}/task")
            except OSError:
                continue
            for task in tasks:
                try:
                    with open(f"/proc/{parent}/task/{task}/children") as fh:
                        below += [int(p) for p in fh.read().split()]
                except OSError:
                    pass
        found += below
        level = below
    return found


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_a_score_killed_as_a_mutant_s_test_starts_leaves_no_process(tmp_path):
    """`score` SIGKILLed the moment one of its test commands (`python -m chaos.score kill`,
    started by a cosmic-ray worker in a session of its own) appears, or a little later,
    while that command still imports: the worker dies with the campaign, and the test
    command with its worker, whatever moment it asked for that (it had asked after its
    imports, so a campaign killed meanwhile left it running, 1 time in 6). Five kills, the
    campaign resumed each time from its work folder."""
    work = str(tmp_path / "campaign")
    for i, delay in enumerate([0.0, 0.0, 0.1, 0.3, 1.0]):
        os.makedirs(tmp_path / f"kill-{i}")
        cmd = Command(tmp_path / f"kill-{i}", "score", lambda out: [
            # the HTTP client's mutants survive the simulation: each test runs for seconds
            "score", "--modules", "engine/http.py", "--seeds", "3", "--deep", "0", "--jobs",
            "2", "--workdir", work])
        try:
            def a_test_started() -> bool:
                return any("chaos.score kill" in cmdline(p) for p in descendants(cmd.proc.pid))
            assert wait_until(a_test_started, 60, poll=0.002), \
                f"no mutant's test ever started:\n{cmd.output()}"
            time.sleep(delay)  # the moment itself, not a wait for a condition
            cmd.proc.send_signal(signal.SIGKILL)
            cmd.proc.wait(10)
            left = still_left(cmd.proc.pid, cmd.mark, cmd.out, timeout=5)
            assert not left, f"left behind by `ninelives score` SIGKILLed {delay} s after a " \
                             f"mutant's test started: {left}"
        finally:
            cmd.end()
