"""Evidence of a machine too busy to run a process: the spans in which one of an engine
process's threads was ready to run and waited for a CPU instead (Linux schedstat's run
delay), recorded as `stall` events, as the simulation records the stalls it schedules.

A heartbeat that renewed late, a free worker slow to claim: on a loaded machine these are
the machine's doing, not the engine's, and only the kernel knows which. The checks that
judge timing excuse a process's own stalls, and nothing else.

`/proc/PID/task/TID/schedstat` holds three numbers per thread: time on a CPU, time waiting
on a run queue, and time slices (nanoseconds). The watch samples every live child each
`interval`; a span between two samples in which some thread of the process waited at least
`share` of it is stalled, and consecutive stalled spans make one event {"t", "src":
"process", "type": "stall", "pid", "seconds", "waited", "cause": "run-queue"}. Where
schedstat cannot be read (not Linux, a kernel without it) the watch records nothing, and the
checks judge as before.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Callable, Iterable

from chaos.history import Event

INTERVAL = 0.05   # seconds between samples
SHARE = 0.5       # a span is stalled when a thread waited at least this share of it


def run_delay(pid: int) -> float | None:
    """The longest run-queue wait among the process's threads so far, in seconds (None:
    the process is gone or its schedstat unreadable)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    longest = None
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                waited = int(f.read().split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            continue
        longest = waited if longest is None else max(longest, waited)
    return longest


class RunQueueWatch:
    """Samples the run delay of the processes `pids()` names, on a daemon thread, and
    records each stall through `record` (see the module docstring). `start()`, `stop()`."""

    def __init__(self, pids: Callable[[], Iterable[int]], record: Callable[[Event], None],
                 interval: float = INTERVAL, share: float = SHARE,
                 read: Callable[[int], float | None] = run_delay,
                 clock: Callable[[], float] = time.time) -> None:
        self.pids, self.record, self.interval, self.share = pids, record, interval, share
        self.read, self.clock = read, clock
        self._last: dict[int, tuple[float, float]] = {}   # pid -> (when, its run delay)
        self._open: dict[int, list[float]] = {}   # pid -> [start, end, waited]
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "RunQueueWatch":
        self._thread = threading.Thread(target=self._run, name="run-queue-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling and record the stalls still open."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        for pid in list(self._open):
            self._close(pid)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def sample(self) -> None:
        """One look at every process: extend, open or close its stall."""
        now = self.clock()
        live = set(self.pids())
        for pid in live:
            waited = self.read(pid)
            if waited is None:
                continue
            before = self._last.get(pid)
            self._last[pid] = (now, waited)
            if before is None or now <= before[0]:
                continue
            span, grew = now - before[0], waited - before[1]
            if grew >= self.share * span:
                stall = self._open.setdefault(pid, [before[0], now, 0.0])
                stall[1], stall[2] = now, stall[2] + grew
            elif pid in self._open:
                self._close(pid)
        for pid in [p for p in self._open if p not in live]:
            self._close(pid)

    def _close(self, pid: int) -> None:
        start, end, waited = self._open.pop(pid)
        self.record({"t": start, "src": "process", "type": "stall", "pid": pid,
                     "seconds": round(end - start, 6), "waited": round(waited, 6),
                     "cause": "run-queue"})
