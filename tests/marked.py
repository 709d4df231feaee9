"""Processes a test started, found by an environment marker it gave them: what a bench or a
command left behind when it ended."""
from __future__ import annotations

import os

import psutil

#: The environment variable a test sets, to a value of its own, on what it starts.
MARK = "NINELIVES_BENCH_TEST"


def carrying(mark: str) -> list[str]:
    """Live processes (not zombies) whose environment carries `mark` under MARK."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        if proc.pid == os.getpid() or proc.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            if proc.environ().get(MARK) == mark:
                found.append(f"{proc.pid}: {' '.join(proc.info['cmdline'] or [])}")
        except psutil.Error:
            continue  # gone meanwhile, or another user's
    return found
