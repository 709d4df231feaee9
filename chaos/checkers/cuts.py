"""What each kill cut: the steps a process held when the harness killed it (a SIGKILL of the
nemesis, or an armed crash point that one of its jobs reached). A process that runs several
jobs at once (job slots) loses every one of them in the one death, so a kill is reported
with the steps it cut, read from the holdings (chaos.checkers.timeline), never assumed; and
with the jobs it lost: those whose last holder it was and that never settled
(chaos.checkers.lost), which an engine that recovers nothing may lose more of than the steps
it counted as cut (a job taken just before the kill, its lease not yet written).
"""
from __future__ import annotations

from collections import Counter
from typing import Any

from chaos.history import Event
from chaos.checkers.index import readings
from chaos.checkers.lease_kept import renews
from chaos.checkers.lost import LostJobs, unsettled_jobs
from chaos.checkers.ops import TOL


def kill_cuts(history: list[Event], pipeline: dict[str, Any]) -> list[dict[str, Any]]:
    """Per kill of a worker process, in time order: {"t", "pid", "name", "how" ("kill" or
    "crash point NAME"), "steps": [{"job", "step", "worker"}]}, the steps the process held
    when it died: claimed (or moved on to) before its exit, not ended by its own write, nor
    taken over by another claim or an intervention on the job first, and still being worked
    on: its lease live as its holder last wrote it, or a provider call of it in flight (a
    slot whose lease ran out while it was stopped walks away from its job, and a call
    outliving its lease is still a step the death cut)."""
    tl = readings(history).timeline(pipeline)
    fates = LostJobs(history, pipeline["working"]).fates
    causes = {pid: fate.cause for pid, fate in fates.items() if fate.cause is not None}
    deaths = [e for e in history if e.get("src") == "process" and e.get("type") == "exit"
              and e.get("pid") in causes and e.get("role", "worker") == "worker"]
    held = _held_by_pid(tl)
    cuts = []
    for exit_ in deaths:
        t, pid = exit_["t"], exit_["pid"]
        steps = [{"job": h.job, "step": h.step["name"], "worker": h.worker}
                 for h, until in held.get(pid, ())
                 if h.start["t"] <= t < until and _worked_on(h, t, tl)]
        cuts.append({"t": t, "pid": pid, "name": exit_.get("name"), "how": causes[pid],
                     "steps": steps})
    return cuts


def with_jobs_lost(cuts: list[dict[str, Any]], history: list[Event],
                   snapshot: dict[str, Any]) -> list[dict[str, Any]]:
    """`cuts`, each with "jobs_lost": the jobs that never settled whose last holder was the
    process it killed (sorted ids), and "struck": when the fault struck it (the exit, `t`,
    is when the supervisor saw it gone)."""
    reading = LostJobs(history, snapshot["pipeline"]["working"])
    lost = reading.lost_by_process(unsettled_jobs(snapshot))
    return [{**cut, "jobs_lost": lost.get(cut["pid"], []),
             "struck": reading.fates[cut["pid"]].struck} for cut in cuts]


def cut_metrics(cuts: list[dict[str, Any]], t0: float = 0.0) -> dict[str, Any]:
    """The report's summary of `kill_cuts`: kills, steps cut in all, the most one kill cut,
    and how many kills cut 0, 1, 2, ... steps; for cuts `with_jobs_lost`, also the jobs lost
    in all, how many kills lost any, how many lost 0, 1, 2, ... jobs, and the kill that lost
    the most ({"at": when it struck, in seconds after `t0`, "name", "pid", "jobs"})."""
    sizes = [len(c["steps"]) for c in cuts]
    out = {"kills": len(cuts), "steps_cut": sum(sizes), "most_in_one_kill": max(sizes, default=0),
           "kills_by_steps_cut": {str(n): k for n, k in sorted(Counter(sizes).items())}}
    if cuts and all("jobs_lost" in c for c in cuts):
        worst = max(cuts, key=lambda c: len(c["jobs_lost"]))
        lost = [len(c["jobs_lost"]) for c in cuts]
        out.update(jobs_lost=sum(lost), kills_that_lost_jobs=sum(1 for n in lost if n),
                   kills_by_jobs_lost={str(n): k for n, k in sorted(Counter(lost).items())},
                   most_lost_in_one_kill={"at": round(worst["struck"] - t0, 3),
                                          "name": worst.get("name"),
                                          "pid": worst["pid"], "jobs": worst["jobs_lost"]})
    return out


def _worked_on(h, t: float, tl) -> bool:
    """Whether holding `h` was still being worked on at `t`: its lease (its claim's, as its
    holder's renewals moved it) had not run out, or one of its calls was in flight."""
    if any(c["t_start"] - TOL <= t <= (c.get("t_end") or t) + TOL for _, c in h.calls):
        return True
    until = h.start.get("lease_until")
    if until is None:
        return True  # an engine without leases: nothing says the holder had let it go
    for _, e in tl.job_events.get(h.job, ()):
        if h.start["t"] < e["t"] <= t and renews(e, h, tl):
            until = max(until, e.get("lease_until") or 0.0)
    return until > t - TOL


def _held_by_pid(tl) -> dict[int, list[tuple[Any, float]]]:
    """pid -> [(holding, the time it stopped being its process's)]: the holding's own write,
    or the job's next claim or intervention, whichever came first (inf: none)."""
    out: dict[int, list[tuple[Any, float]]] = {}
    for job, holds in tl.holdings.items():
        moved = set(tl.interventions.get(job, ()))
        others = sorted([h.start["t"] for h in holds]
                        + [e["t"] for pos, e in tl.job_events.get(job, ()) if pos in moved])
        for h in holds:
            pid = h.start.get("pid") if h.start.get("pid") is not None else tl.pids.get(h.worker)
            ends = [h.write["t"]] if h.write is not None else []
            ends += [t for t in others if t > h.start["t"]]
            out.setdefault(pid, []).append((h, min(ends, default=float("inf"))))
    return out
