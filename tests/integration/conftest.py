"""Integration fixtures: the fakes on 127.0.0.1 with their ledgers in the test's own folder, and
engine processes (`python -m engine ...`) that a test starts and the fixture always ends and reaps,
even when the test fails."""
from __future__ import annotations

import os
import subprocess
import sys
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest

from chaos.fakes import FakeProvider, FakeReceiver

#: Commands that run until idle or stopped: started with --exit-with-parent, so a runner killed
#: mid-test leaves no orphan. The others end by themselves and have no such flag.
LONG_RUNNING = frozenset({"worker", "send"})


@dataclass(frozen=True)
class Ran:
    """A finished engine process: what was run, how it ended, what it printed."""

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    def __str__(self) -> str:
        return (f"$ {' '.join(self.argv)}\nexit code {self.returncode}\n"
                f"--- stdout\n{self.stdout}--- stderr\n{self.stderr}")


class EngineProcesses:
    """Runs `python -m engine COMMAND` against one database with a set of settings flags.

    db: the database (a file, or a URL); log_dir: where each process's stdout and stderr go (files, so a
    chatty process can never block on a full pipe); settings: flags every command gets (a
    value of None leaves the flag out). `close()` kills and reaps every process still running.
    """

    def __init__(self, db: str, log_dir: Path, settings: dict | None = None) -> None:
        self.db, self.log_dir = db, log_dir
        self.settings = dict(settings or {})
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("NINELIVES_")}
        self._procs: list[tuple[subprocess.Popen, Path, tuple[str, ...]]] = []
        log_dir.mkdir(parents=True, exist_ok=True)

    def argv(self, command: str, *args: str, **settings) -> tuple[str, ...]:
        """The command line: settings flags first, so a flag repeated in `args` wins."""
        argv = [sys.executable, "-m", "engine", command]
        if command in LONG_RUNNING:
            argv.append("--exit-with-parent")
        for name, value in {"db": self.db, **self.settings, **settings}.items():
            if value is not None:
                argv += [f"--{name.replace('_', '-')}", str(value)]
        return (*argv, *args)

    def start(self, command: str, *args: str, crash_at: str | None = None,
              **settings) -> subprocess.Popen:
        """Start one engine process; `crash_at` arms NINELIVES_CRASH_AT=<point>:1 in it."""
        argv = self.argv(command, *args, **settings)
        env = dict(self.env)
        if crash_at:
            env["NINELIVES_CRASH_AT"] = f"{crash_at}:1"
        stem = self.log_dir / f"{len(self._procs) + 1:02d}-{command}"
        with open(f"{stem}.out", "wb") as out, open(f"{stem}.err", "wb") as err:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                    env=env, cwd=self.log_dir)
        self._procs.append((proc, stem, argv))
        return proc

    def wait(self, proc: subprocess.Popen, timeout: float = 30.0) -> Ran:
        """Wait for `proc` to end (killing it past `timeout` and failing the test)."""
        _, stem, argv = next(item for item in self._procs if item[0] is proc)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            pytest.fail(f"still running after {timeout} s, killed:\n{self._ran(proc, stem, argv)}")
        return self._ran(proc, stem, argv)

    def run(self, command: str, *args: str, timeout: float = 30.0, crash_at: str | None = None,
            **settings) -> Ran:
        """Run one engine command to its end."""
        return self.wait(self.start(command, *args, crash_at=crash_at, **settings), timeout)

    def ok(self, command: str, *args: str, **settings) -> Ran:
        """Run one engine command that must succeed (exit code 0)."""
        ran = self.run(command, *args, **settings)
        assert ran.returncode == 0, str(ran)
        return ran

    def close(self) -> None:
        for proc, _, _ in self._procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()

    @staticmethod
    def _ran(proc: subprocess.Popen, stem: Path, argv: tuple[str, ...]) -> Ran:
        read = lambda suffix: Path(f"{stem}{suffix}").read_text(errors="replace")  # noqa: E731
        return Ran(argv, proc.returncode, read(".out"), read(".err"))


@pytest.fixture
def engine(db_target, tmp_path, start_fakes):
    """Engine processes on this test's database (a SQLite file, or a PostgreSQL database in a
    module that runs on every backend); fast polling, so idle workers notice work.

    (It depends on start_fakes so that its processes are killed before the fakes close.)"""
    processes = EngineProcesses(db_target, tmp_path / "logs", {"poll_interval": 0.02})
    try:
        yield processes
    finally:
        processes.close()


@pytest.fixture(scope="module")
def module_engine(tmp_path_factory):
    """Engine processes on a database shared by one test module (for tests that only read it)."""
    folder = tmp_path_factory.mktemp("shared")
    processes = EngineProcesses(str(folder / "engine.db"), folder / "logs", {"poll_interval": 0.02})
    try:
        yield processes
    finally:
        processes.close()


@pytest.fixture
def start_fakes(tmp_path):
    """Start a FakeProvider and a FakeReceiver (ledgers in tmp_path); both closed at teardown.

    Call it as `start_fakes(faults=None)`; returns (provider, receiver).
    """
    with ExitStack() as stack:
        def start(faults=None):
            provider = stack.enter_context(FakeProvider(tmp_path / "provider.jsonl", faults))
            receiver = stack.enter_context(FakeReceiver(tmp_path / "receiver.jsonl", faults))
            return provider, receiver
        yield start
