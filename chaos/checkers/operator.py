"""operator-moves: an operator action answers "done" or "refused: why" (it never raises),
and one the engine reported done did what an operator move promises. It wrote the job; it
left no lease running, so no worker of before can still act on the job; a cancel ends the
job in a terminal state; a requeue or resolve puts it in the ready state of a step, due at
once, with the step started over (no failed attempt or claim carried into it: counters the
engine reports are 0).
"""
from __future__ import annotations

from typing import Any

from ..history import Event
from .ops import TOL, capable, is_job, is_operator
from .verdict import Verdict


def check_operator_moves(history: list[Event], snapshot: dict[str, Any]) -> Verdict:
    """Every operator action reported done, against the operator's write to the job."""
    verdict = Verdict("operator-moves")
    if not capable(snapshot, "operator"):
        return verdict.unknown("the engine declares no operator actions")
    pipeline = snapshot["pipeline"]
    ready = {s["ready"] for s in pipeline["steps"]}
    terminal = set(pipeline["terminal"])
    moves: dict[str, list[Event]] = {}
    for e in history:
        if is_job(e) and is_operator(e) and e.get("type") == "state":
            moves.setdefault(e["job"], []).append(e)
    t0 = history[0]["t"] if history else 0.0
    taken: dict[str, int] = {}  # per job, how many of its operator writes are matched
    for e in history:
        if e.get("src") == "nemesis" and e.get("type") == "error" \
                and e.get("fault") == "operator":
            verdict.checked += 1
            verdict.fail("operator-action-raised", f"an operator action raised instead of "
                         f"answering done or refused: {e.get('error')}", e)
            continue
        if e.get("src") != "nemesis" or e.get("type") != "operator" or e.get("result") != "done":
            continue
        job, action = e["job"], e["action"]
        verdict.checked += 1
        # Actions on a job run one after the other: the k-th done is its k-th operator write.
        queue, k = moves.get(job, []), taken.get(job, 0)
        at = f"+{e['t'] - t0:.3f} s"
        if k >= len(queue) or queue[k]["t"] > e["t"] + TOL:
            verdict.fail("operator-move-missing", f"job {job}: the operator's {action} at {at} "
                         "was reported done, but nothing was written to the job", e)
            continue
        move, taken[job] = queue[k], k + 1
        kept = [f"{name} {move[name]}" for name in ("attempts", "claims")
                if move.get(name) not in (None, 0)] if action != "cancel" else []
        if kept:
            verdict.fail("operator-move-kept-counters", f"job {job}: the operator's {action} at "
                         f"{at} moved it {move['from']} -> {move['to']} but kept {', '.join(kept)}"
                         " of the step it left", e, move)
        until = move.get("lease_until")
        if until is not None and until > move["t"] + TOL:
            verdict.fail("operator-move-kept-lease", f"job {job}: the operator's {action} at "
                         f"{at} left a lease running until +{until - t0:.3f} s", e, move)
        if action == "cancel" and move["to"] not in terminal:
            verdict.fail("operator-move-wrong-state", f"job {job}: the operator cancelled it at "
                         f"{at}, but it went to {move['to']!r}, not a terminal state", e, move)
        elif action in ("requeue", "resolve"):
            due = move.get("next_run_at")
            if move["to"] not in ready:
                verdict.fail("operator-move-wrong-state", f"job {job}: the operator's {action} "
                             f"at {at} moved it to {move['to']!r}, not the ready state of a "
                             "step", e, move)
            elif due is not None and due > move["t"] + TOL:
                verdict.fail("operator-move-not-due", f"job {job}: the operator's {action} at "
                             f"{at} made it due only at +{due - t0:.3f} s", e, move)
    if not verdict.checked and verdict.valid is not False:
        verdict.unknown("no operator action was reported done in this run")
    verdict.metrics = {"actions_done": verdict.checked}
    return verdict


CHECKS = {"operator-moves": check_operator_moves}
