"""operator-moves: an operator action answers "done" or "refused: why" (it never raises),
and one the engine reported done did what an operator move promises. It wrote the job; it
left no lease running, so no worker of before can still act on the job; a cancel ends the
job in a terminal state; a requeue or resolve puts it in the ready state of a step, due at
once, with the step started over (no failed attempt or claim carried into it: counters the
engine reports are 0). And an action is refused only where it does not apply: one refused
while the job stood, for the whole action, in a state the engine's pipeline says the action
always applies from (`operator_actions`) is a bug.
"""
from __future__ import annotations

from typing import Any

from chaos.history import Event
from chaos.engines.schema import reads
from chaos.checkers.ops import TOL, capable, is_job, is_operator
from chaos.checkers.verdict import Verdict


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
    always = {a: set(states) for a, states in pipeline.get("operator_actions", {}).items()}
    jobs: dict[str, list[Event]] = {}
    for e in history:
        if is_job(e) and e.get("to") is not None:
            jobs.setdefault(e["job"], []).append(e)
    refusals = 0
    for e in history:
        if e.get("src") == "nemesis" and e.get("type") == "error" \
                and e.get("fault") == "operator":
            verdict.checked += 1
            verdict.fail("operator-action-raised", f"an operator action raised instead of "
                         f"answering done or refused: {e.get('error')}", e)
            continue
        if e.get("src") == "nemesis" and e.get("type") == "operator" \
                and str(e.get("result", "")).startswith("refused"):
            refusals += _judge_refusal(verdict, e, jobs, always, t0)
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
    done = verdict.checked
    verdict.checked += refusals
    if not verdict.checked and verdict.valid is not False:
        verdict.unknown("no operator action was reported done, nor refused where the engine "
                        "says it applies, in this run")
    verdict.metrics = {"actions_done": done, "refusals_judged": refusals,
                       "actions_judged_on_refusal": sorted(always)}
    return verdict


def _judge_refusal(verdict: Verdict, e: Event, jobs: dict[str, list[Event]],
                   always: dict[str, set[str]], t0: float) -> int:
    """Judge one refused action; 1 if it could be judged, else 0. It can be when the engine
    names the action in operator_actions and the job's state is known for the whole action
    (its last write before the action began, and none during it)."""
    action, job = e.get("action"), e.get("job")
    start = e.get("t_start")
    if action not in always or start is None:
        return 0
    writes = jobs.get(job, [])
    before = [w for w in writes if w["t"] <= start]
    if not before or any(start < w["t"] <= e["t"] + TOL for w in writes):
        return 0  # never written yet, or written while the action ran: a race, not judged
    state = before[-1]["to"]
    if state in always[action]:
        verdict.fail("operator-refused-wrongly", f"job {job}: the operator's {action} at "
                     f"+{start - t0:.3f} s was refused ({e.get('result')}), but the job stood "
                     f"in {state!r} throughout, a state {action} always applies from", e,
                     before[-1])
    return 1


CHECKS = {"operator-moves": check_operator_moves}

#: the engine fields each check reads (chaos.engines.schema): an evidence field an engine leaves out
#: makes exactly these checks unknown, naming it
READS = {
    "operator-moves": reads(
        submitted="actor job to",
        claimed="actor job to",
        state="actor attempts claims job lease_until next_run_at to"),
}
