"""Who made a write, for an engine whose rows do not say.

An observer that cannot name the writer of a job or outbox write leaves its `worker` None.
If the engine marks its boundaries with the probe, the harness can still tell: the probe's
trace (`chaos.probe.Trace`) records every point each process passes, with its job, and the
adapter names its `write_points`, the points after which a process writes to that job (after
a call returns, before a failure is recorded, ...). A process may have made a write when the
last point it passed before the write (of any job: a worker works on one job at a time) may
be a write point of that job, and it had not exited by then; a process's threads (a heartbeat
beside the step) are followed apart. The store stamps writes to the millisecond, so every
point within that millisecond may have come just before the write. One such process attributes the
write (`attributed: "probe"`); several leave it unattributed (`"ambiguous"`).
"""
from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Iterable

from chaos.history import Event

#: A store stamps its writes to the millisecond (truncated): a write stamped t happened in
#: [t, t + STAMP).
STAMP = 0.001


def attribute_writes(history: list[Event], write_points: Iterable[str]) -> int:
    """Fill `worker` and `pid` of the engine operations in `history` that lack a writer,
    from the trace's point events (`src: process, type: point`); returns how many it
    attributed. Changes the operations in place."""
    points = frozenset(write_points)
    # (pid, thread) -> the points it passed: a process's threads write apart
    trace: dict[tuple, list[tuple[float, str, str | None]]] = defaultdict(list)
    exits: dict[int, float] = {}
    named: dict[int, str] = {}     # pid -> the engine's id of it, from events naming both
    spawned: dict[int, str] = {}   # pid -> the supervisor's name of it
    for e in history:
        src, type_ = e.get("src"), e.get("type")
        if src == "process" and type_ == "point":
            trace[(e["pid"], e.get("thread"))].append((e["t"], e["point"], e.get("job")))
        elif src == "process" and type_ == "exit":
            exits[e["pid"]] = e["t"]
        elif src == "process" and type_ == "spawn":
            spawned[e["pid"]] = e["name"]
        elif e.get("pid") is not None and e.get("worker"):
            named.setdefault(e["pid"], e["worker"])
    workers = {**spawned, **named}
    for passed in trace.values():
        passed.sort(key=lambda p: p[0])
    times = {key: [p[0] for p in passed] for key, passed in trace.items()}
    done = 0
    for e in history:
        if e.get("src") != "engine" or e.get("worker") is not None or e.get("job") is None \
                or e.get("actor") not in ("worker", "sender"):
            continue
        pids = {pid for (pid, thread), passed in trace.items()
                if exits.get(pid, float("inf")) >= e["t"]
                and any(point in points and job == e["job"]
                        for point, job in _just_before(passed, times[(pid, thread)], e["t"]))}
        if len(pids) == 1:
            (pid,) = pids
            e.update(pid=pid, worker=workers.get(pid, f"pid:{pid}"), attributed="probe")
            done += 1
        elif pids:
            e["attributed"] = "ambiguous"
    return done


def _just_before(passed: list[tuple[float, str, str | None]], times: list[float],
                 t: float) -> list[tuple]:
    """(point, job) of every point that may be the last one passed before a write stamped
    `t`: the last at or before t, and those within the stamp's millisecond."""
    first = max(bisect.bisect_right(times, t) - 1, 0)
    last = bisect.bisect_left(times, t + STAMP)
    return [p[1:] for p in passed[first:last]]
