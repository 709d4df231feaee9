"""Waiting in tests: for a condition, polled until a deadline; and for a command's progress
lines as they come, each with the moment it arrived, until enough was seen (the command is
then interrupted, SIGINT, and waited for)."""
from __future__ import annotations

import signal
import subprocess
import time
from typing import Callable, IO


def lines_until(proc: subprocess.Popen, stream: IO[str],
                enough: Callable[[list[tuple[float, str]]], bool]
                ) -> tuple[list[tuple[float, str]], str]:
    """([(monotonic time, line)...] up to the first point `enough(seen)` holds, what the
    stream said after the SIGINT); the process is ended, killed if it does not stop."""
    seen: list[tuple[float, str]] = []
    try:
        for line in stream:
            seen.append((time.monotonic(), line.rstrip("\n")))
            if enough(seen):
                break
        proc.send_signal(signal.SIGINT)
        rest = stream.read()
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return seen, rest


def wait_until(condition: Callable[[], object], seconds: float = 10.0,
               poll: float = 0.01) -> bool:
    """Whether `condition()` came true within `seconds`, looking every `poll` seconds (and
    once more at the deadline)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(poll)
    return bool(condition())
