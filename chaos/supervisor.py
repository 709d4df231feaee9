"""The supervisor: spawns engine processes with the commands the adapter gives, keeps the
asked-for number alive, records their lifecycle, and ends them all.

Whoever starts a process ends it: `close()` terminates, then kills, then reaps every child.
Every child is started with PR_SET_PDEATHSIG set before exec, so it dies with the runner
even when the runner itself is SIGKILLed, whatever the engine does.
"""
from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Callable

from .contract import Command
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
    killed: bool = False       # the harness sent the signal that ended it

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass
class Supervisor:
    """Owns the engine processes of one run.

    command: (role, slot, spawn number) -> the Command to start (the adapter's argv and
    environment, from the runner's settings for that slot);
    record: where lifecycle events go.
    """

    command: Callable[[str, int, int], Command]
    log_dir: str | None = None
    record: Callable[[Event], None] = lambda event: None
    children: list[Child] = field(default_factory=list)
    spawned: int = 0
    closing: bool = False

    def spawn(self, role: str, slot: int = 0) -> Child:
        """Start one `worker` or `sender` process in `slot`."""
        self.spawned += 1
        name = f"{role}-{slot}.{self.spawned}"
        command = self.command(role, slot, self.spawned)
        log_path = os.path.join(self.log_dir, f"{name}.log") if self.log_dir else None
        out = open(log_path, "ab") if log_path else subprocess.DEVNULL
        try:
            proc = subprocess.Popen(command.argv, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=out, env={**os.environ, **command.env},
                                    preexec_fn=die_with_parent)
        finally:
            if log_path:
                out.close()
        child = Child(name, role, slot, proc, time.time(), log_path)
        self.children.append(child)
        self.record({"t": child.started, "src": "process", "type": "spawn", "name": name,
                     "role": role, "slot": slot, "pid": child.pid, "code": None,
                     "signal": None})
        return child

    def signal(self, child: Child, sig: int) -> None:
        """Send `sig` to `child` on the harness's behalf (its exit then counts as caused)."""
        if sig in (signal.SIGKILL, signal.SIGTERM):
            child.killed = True
        _send(child.proc, sig)

    def reap(self) -> list[Child]:
        """Children that exited since the last call; each exit is recorded, with the tail
        of its log when the harness did not end it."""
        gone = []
        for child in self.children:
            if child.ended is None and child.proc.poll() is not None:
                child.ended = time.time()
                code = child.proc.returncode
                sig = signal.Signals(-code).name if code < 0 else None
                killed = child.killed or self.closing
                event = {"t": child.ended, "src": "process", "type": "exit",
                         "name": child.name, "role": child.role, "slot": child.slot,
                         "pid": child.pid, "code": code, "signal": sig, "killed": killed}
                if not killed:
                    event["log_tail"] = log_tail(child.log_path)
                self.record(event)
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
        self.closing = True
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


def die_with_parent() -> None:
    """In the child before exec: ask Linux to SIGKILL it when the runner dies, whatever
    engine it becomes (PR_SET_PDEATHSIG survives exec), so no engine process is orphaned."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def log_tail(path: str | None, lines: int = 20) -> str | None:
    """The last `lines` lines of a child's log (what it said before it died), or None."""
    if not path:
        return None
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 8192))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return None
    return "\n".join(text.splitlines()[-lines:])


def _send(proc: subprocess.Popen, sig: int) -> None:
    try:
        proc.send_signal(sig)
    except ProcessLookupError:
        pass
