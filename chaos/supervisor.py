"""The supervisor: spawns engine processes through the engine's own command line, keeps the
asked-for number alive, records their lifecycle, and ends them all.

Whoever starts a process ends it: `close()` terminates, then kills, then reaps every child.
Children are started with --exit-with-parent (PR_SET_PDEATHSIG), so they die with the runner
even when the runner itself is SIGKILLed.
"""
from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Callable

from .history import Event


@dataclass
class Child:
    """One spawned engine process."""

    name: str
    role: str
    slot: int
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
    """Owns the engine processes of one run.

    command: role -> argv prefix (the adapter's); settings are appended as flags;
    env_for: (role, slot, spawn number) -> extra environment (crash points, ...);
    record: where lifecycle events go.
    """

    command: Callable[[str], list[str]]
    settings: dict[str, object]
    log_dir: str | None = None
    env_for: Callable[[str, int, int], dict[str, str]] = lambda role, slot, n: {}
    args_for: Callable[[str, int], list[str]] = lambda role, slot: []
    record: Callable[[Event], None] = lambda event: None
    children: list[Child] = field(default_factory=list)
    spawned: int = 0

    def spawn(self, role: str, slot: int = 0) -> Child:
        """Start one `worker` or `send` process in `slot` with the run's settings."""
        self.spawned += 1
        name = f"{role}-{slot}.{self.spawned}"
        argv = self.command(role) + ["--exit-with-parent", *self.args_for(role, slot)]
        for key, value in self.settings.items():
            argv += [f"--{key.replace('_', '-')}", _flag(value)]
        log_path = os.path.join(self.log_dir, f"{name}.log") if self.log_dir else None
        out = open(log_path, "ab") if log_path else subprocess.DEVNULL
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                    env={**os.environ, **self.env_for(role, slot, self.spawned)})
        finally:
            if log_path:
                out.close()
        child = Child(name, role, slot, proc, time.time(), log_path)
        self.children.append(child)
        self.record({"t": child.started, "src": "process", "type": "spawn", "name": name,
                     "role": role, "slot": slot, "pid": child.pid, "code": None,
                     "signal": None})
        return child

    def reap(self) -> list[Child]:
        """Children that exited since the last call; each exit is recorded."""
        gone = []
        for child in self.children:
            if child.ended is None and child.proc.poll() is not None:
                child.ended = time.time()
                code = child.proc.returncode
                sig = signal.Signals(-code).name if code < 0 else None
                self.record({"t": child.ended, "src": "process", "type": "exit",
                             "name": child.name, "role": child.role, "pid": child.pid,
                             "code": code, "signal": sig})
                gone.append(child)
        return gone

    def alive(self, role: str | None = None) -> list[Child]:
        return [c for c in self.children
                if c.ended is None and c.alive() and (role is None or c.role == role)]

    def keep(self, counts: dict[str, int]) -> list[Child]:
        """Respawn into every empty slot so that `counts[role]` processes run."""
        started = []
        for role, count in counts.items():
            busy = {c.slot for c in self.alive(role)}
            for slot in range(count):
                if slot not in busy:
                    started.append(self.spawn(role, slot))
        return started

    def close(self, grace: float = 3.0) -> None:
        """Terminate every child, kill those still alive after `grace` seconds, reap all."""
        for child in self.alive():
            _send(child.proc, signal.SIGCONT)  # a stopped process cannot act on SIGTERM
            _send(child.proc, signal.SIGTERM)
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


def _flag(value: object) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _send(proc: subprocess.Popen, sig: int) -> None:
    try:
        proc.send_signal(sig)
    except ProcessLookupError:
        pass
