"""The supervisor: spawns engine processes through the engine's own CLI, and ends them all.

Whoever starts a process ends it: `Supervisor` is a context manager that terminates, then
kills, then reaps every child on exit. Children are started with --exit-with-parent, so they
die with the runner even when the runner itself is SIGKILLed.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field


@dataclass
class Child:
    """One spawned engine process."""

    name: str
    role: str
    proc: subprocess.Popen
    started: float
    log_path: str | None = None
    ended: float | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass
class Supervisor:
    """Spawns `python -m engine ROLE ...` processes and owns them until `close()`."""

    settings: dict[str, object]
    env: dict[str, str] = field(default_factory=dict)
    log_dir: str | None = None
    children: list[Child] = field(default_factory=list)
    _count: int = 0

    def spawn(self, role: str, *extra: str, env: dict[str, str] | None = None) -> Child:
        """Start one `worker` or `send` process with the run's settings."""
        self._count += 1
        name = f"{role}-{self._count}"
        argv = [sys.executable, "-m", "engine", role, "--exit-with-parent", *extra]
        for key, value in self.settings.items():
            argv += [f"--{key.replace('_', '-')}", str(value)]
        log = None
        log_path = None
        if self.log_dir:
            log_path = os.path.join(self.log_dir, f"{name}.log")
            log = open(log_path, "ab")
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log or subprocess.DEVNULL,
                                stderr=log or subprocess.DEVNULL,
                                env={**os.environ, **self.env, **(env or {})})
        if log:
            log.close()
        child = Child(name, role, proc, time.time(), log_path)
        self.children.append(child)
        return child

    def reap(self) -> list[Child]:
        """Children that exited since the last call (their end time recorded)."""
        gone = []
        for child in self.children:
            if child.ended is None and child.proc.poll() is not None:
                child.ended = time.time()
                gone.append(child)
        return gone

    def alive(self, role: str | None = None) -> list[Child]:
        return [c for c in self.children if c.alive() and (role is None or c.role == role)]

    def close(self, grace: float = 3.0) -> None:
        """Terminate every child, kill those still alive after `grace` seconds, reap all."""
        for child in self.alive():
            child.proc.terminate()
        deadline = time.monotonic() + grace
        for child in self.children:
            try:
                child.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.proc.kill()
                child.proc.wait()
        self.reap()

    def __enter__(self) -> "Supervisor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
