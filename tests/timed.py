"""Reading a command's progress lines as they come, each with the moment it arrived, until
enough was seen; then the command is interrupted (SIGINT) and waited for."""
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
