"""The run-queue watch: the spans in which the machine left a process's thread ready and
unrun, from the kernel's schedstat, as stall events the timing checks excuse."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from chaos.run.runqueue import RunQueueWatch, run_delay


def watch_of(delays: dict[int, list[float | None]], times: list[float]):
    """A watch over fake readings: delays[pid][i] at times[i]."""
    events, step = [], {"i": 0}
    watch = RunQueueWatch(lambda: [p for p in delays if delays[p][step["i"]] is not None],
                          events.append, share=0.5,
                          read=lambda pid: delays[pid][step["i"]],
                          clock=lambda: times[step["i"]])
    for i in range(len(times)):
        step["i"] = i
        watch.sample()
    watch.stop()
    return events


def test_consecutive_stalled_spans_make_one_stall_and_a_run_ends_it():
    times = [0.0, 0.1, 0.2, 0.3, 0.4]
    events = watch_of({7: [1.0, 1.06, 1.13, 1.14, 1.15]}, times)
    assert [(e["pid"], e["t"], e["seconds"], e["waited"]) for e in events] == [
        (7, 0.0, 0.2, 0.13)]
    assert events[0]["type"] == "stall" and events[0]["cause"] == "run-queue"


def test_a_process_that_ran_is_no_stall_and_one_that_is_gone_closes_its_own():
    times = [0.0, 0.1, 0.2]
    events = watch_of({1: [0.0, 0.01, 0.02], 2: [5.0, 5.09, None]}, times)
    assert [(e["pid"], e["seconds"]) for e in events] == [(2, 0.1)]


BUSY = "import time\nend = time.time() + 8\nwhile time.time() < end: pass\n"


def test_two_busy_processes_sharing_one_cpu_are_seen_stalled():
    # Real processes and the real kernel: two busy loops pinned to one CPU each wait for it
    # about half the time.
    procs = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(2)]
    try:
        for p in procs:
            os.sched_setaffinity(p.pid, {min(os.sched_getaffinity(0))})
        events = []
        watch = RunQueueWatch(lambda: [p.pid for p in procs], events.append,
                              interval=0.05, share=0.3).start()
        time.sleep(1.5)
        watch.stop()
        assert {e["pid"] for e in events} == {p.pid for p in procs}, events
        assert all(e["waited"] > 0 for e in events)
        assert run_delay(procs[0].pid) > 0.2
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert run_delay(procs[0].pid) is None  # gone
