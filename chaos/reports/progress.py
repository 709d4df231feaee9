"""How long jobs wait between a worker's last word on them and the next claim: a measure
of progress latency, reported with every run (not an invariant: a killed worker's lease
has to run out before anyone may take its job, so waits of a whole lease are expected
where the scenario kills).

Each claim of a job is measured from the job's previous write. If that write released the
job (its lease ended, or a retry time was set), the wait is the claim's latency; if it left
a lease running (a claim, a heartbeat, a write that kept the lease), nobody could take the
job before that lease ran out, and the wait is time lost to a lease nobody used: because its
holder died (a crash's price), or with its holder alive (a worker that dropped the job and
kept the lease, or one paused or stalled: the waits to look at).
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any

from chaos.checkers.ops import is_job
from chaos.history import Event

SLOWEST = 5


def progress_latency(history: list[Event]) -> dict[str, Any]:
    """{"claims": n, "after_release", "after_held_lease", "after_holder_died",
    "after_holder_alive": stats, "slowest": [...]}: stats are {"count", "median", "max",
    "total"} in seconds ("after_held_lease" is the last two together); "slowest" the longest
    waits on a lease a live holder kept, with the job and the write that left it running."""
    exits = {e["pid"]: e["t"] for e in history
             if e.get("src") == "process" and e.get("type") == "exit"}
    last: dict[str, Event] = {}
    waits: dict[str, list[tuple[float, Event, Event]]] = defaultdict(list)
    for e in history:
        if not is_job(e):
            continue
        before = last.get(e["job"])
        if e["type"] == "claimed" and not e.get("continued") and before is not None:
            if not _held(before):
                ready = max(before["t"], before.get("next_run_at") or 0.0)
                waits["after_release"].append((max(0.0, e["t"] - ready), before, e))
            else:
                died = exits.get(before.get("pid"), float("inf")) <= e["t"]
                waits["after_holder_died" if died else "after_holder_alive"].append(
                    (max(0.0, e["t"] - before["t"]), before, e))
        last[e["job"]] = e
    alive = sorted(waits["after_holder_alive"], key=lambda w: -w[0])
    return {"claims": sum(map(len, waits.values())),
            "after_release": _stats(waits["after_release"]),
            "after_held_lease": _stats(waits["after_holder_died"] + alive),
            "after_holder_died": _stats(waits["after_holder_died"]),
            "after_holder_alive": _stats(alive),
            "slowest": [{"job": claim["job"], "waited": round(wait, 3),
                         "left_by": f"{before['type']} {before.get('from')} -> "
                                    f"{before.get('to')} by {before.get('worker')}"}
                        for wait, before, claim in alive[:SLOWEST]]}


def _held(e: Event) -> bool:
    """Whether the write left the job's lease running."""
    until = e.get("lease_until")
    return until is not None and until > e["t"] and e["type"] in ("claimed", "state")


def _stats(waits: list[tuple[float, Event, Event]]) -> dict[str, Any]:
    times = [w for w, _, _ in waits]
    if not times:
        return {"count": 0}
    return {"count": len(times), "median": round(statistics.median(times), 3),
            "max": round(max(times), 3), "total": round(sum(times), 3)}
