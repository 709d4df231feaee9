"""Situations of steps, memos, the outbox, operators and submissions (see chaos.situations,
which holds the catalog, the API and the lease situations; this module registers the rest)."""
from __future__ import annotations

import bisect
from typing import Any

from chaos.checkers.ops import TOL, capable, is_engine, is_job, is_operator, is_worker
from chaos.history import Event
from chaos.situations.catalog import Context, situation


# -- steps and memos ------------------------------------------------------------------------

def _memo_resumes(ctx: Context) -> list[tuple[Any, bool]] | str:
    """(holding, its step queues effects) of each step finished from an existing memo with
    no call of its own."""
    if not any(is_engine(e, "memo") for e in ctx.history):
        return "the history has no memo operations: a step's result kept apart is not seen"
    why = ctx.worker_ids_match_calls()
    if why:
        return why
    queued: dict[tuple, list[float]] = {}
    for e in ctx.history:
        if is_engine(e, "effect_queued"):
            queued.setdefault((e.get("job"), e.get("worker")), []).append(e["t"])

    def queues(h) -> bool:
        times = queued.get((h.job, h.worker), ())
        return any(h.start["t"] - TOL <= t <= h.write["t"] + TOL for t in times)

    done = [h for hs in ctx.timeline.holdings.values() for h in hs
            if h.write is not None and h.write["to"] == h.step.get("done")]
    effect_steps = {h.step["name"] for h in done if queues(h)}
    memos, out = ctx.shared.memos, []
    for h in done:
        # A memo committed before the step's end, by another holding: before its claim, or
        # by another worker meanwhile (a fenced-out one's memo, kept).
        memo = memos.live_at((h.job, h.step["name"]), h.write["t"] + TOL)
        if not h.calls and memo is not None and (
                memo["t"] < h.start["t"] or memo.get("worker") != h.worker):
            out.append((h, h.step["name"] in effect_steps))
    return out


def _resume_note(ctx: Context, h) -> str:
    return (f"job {h.job}: {h.worker} finished step {h.step['name']!r} at "
            f"{ctx.at(h.write['t'])} from a memo it had not written, with no call")


@situation("memo-resume",
           "A step was finished from a memo already written (by a worker that crashed or "
           "was fenced out before its completion), with no new call: the resume must use "
           "the memo, not pay again, and finish the step exactly as the first would have.")
def _memo_resume(ctx: Context):
    resumes = _memo_resumes(ctx)
    if isinstance(resumes, str):
        return resumes
    return [(h.start, _resume_note(ctx, h)) for h, _ in resumes]


@situation("memo-resume-with-effects",
           "A memo resume of a step that queues side effects: effects written apart from "
           "the completion are lost (or doubled) exactly here.")
def _memo_resume_effects(ctx: Context):
    resumes = _memo_resumes(ctx)
    if isinstance(resumes, str):
        return resumes
    if not any(is_engine(e, "effect_queued") for e in ctx.history):
        return "the history has no effect_queued operations: no step is seen to queue effects"
    return [(h.start, _resume_note(ctx, h)) for h, effects in resumes if effects]


@situation("kill-mid-step",
           "A worker's process was killed while it held a step not yet finished: whatever "
           "the step had done so far (a call, a memo, half a transaction) must be resumed "
           "or discarded, never half applied.")
def _kill_mid_step(ctx: Context):
    found = []
    for x in ctx.history:
        # the harness's kill, or the probe's at a crash point (the process's own SIGKILL)
        killed = x.get("killed") or x.get("signal") in ("SIGKILL", 9)
        if x.get("src") != "process" or x["type"] != "exit" or not killed or not ctx.died(x):
            continue
        for job, holdings in ctx.timeline.holdings.items():
            for h in holdings:
                if ctx.pid_of(h.start) == x.get("pid") and h.start["t"] <= x["t"] + TOL and \
                        (h.write is None or h.write["t"] > x["t"]):
                    found.append((x, f"job {job}: {x.get('name') or h.worker} was killed at "
                                     f"{ctx.at(x['t'])} in step {h.step['name']!r}, claimed "
                                     f"at {ctx.at(h.start['t'])}"))
                    break
    return found


@situation("crash-between-call-and-commit",
           "A worker's process died after a billed provider call answered and before it "
           "committed the result: the next holder must not pay for the step again unless "
           "the engine's budget allows it.")
def _crash_after_call(ctx: Context):
    why = ctx.worker_ids_match_calls()
    if why:
        return why
    found = []
    for e in ctx.history:
        if e.get("src") != "provider" or e["type"] != "call" or e.get("completion") == "info" \
                or e.get("outcome") != "ok" or not e.get("worker"):
            continue
        died = ctx.jobs.died_before_writing(e["worker"], e.get("job"), e["t_end"], e.get("pid"))
        if died is not None and died["t"] >= e["t_end"] - TOL and ctx.died(died):
            found.append((e, f"job {e.get('job')}: {e['worker']}'s call for "
                             f"{e.get('step')!r} answered at {ctx.at(e['t_end'])}; its process "
                             f"died at {ctx.at(died['t'])} before committing"))
    return found


@situation("retry-after-honoured",
           "The provider refused a call with 429 or 503 and a Retry-After, and the job's "
           "step called again later: the retry must wait as asked, not hammer the provider.")
def _retry_after(ctx: Context):
    if not ctx.ledger("provider"):
        return "the provider's ledger was not kept"
    calls: dict[tuple, list[Event]] = {}
    for e in ctx.history:
        if e.get("src") == "provider" and e["type"] == "call":
            calls.setdefault((e.get("job"), e.get("step")), []).append(e)
    found = []
    for (job, step), group in calls.items():
        for i, e in enumerate(group):
            if e.get("status") not in (429, 503) or \
                    (e.get("retry_after") is None and e.get("retry_at") is None):
                continue
            later = next((c for c in group[i + 1:]
                          if c["t_start"] >= (e.get("t_end") or e["t_start"]) - TOL), None)
            if later is not None:
                found.append((e, f"job {job}: {step!r} answered {e['status']} with Retry-After "
                                 f"at {ctx.at(e['t_start'])}, called again at "
                                 f"{ctx.at(later['t_start'])}"))
    return found


# -- the outbox -----------------------------------------------------------------------------

def _has_outbox(ctx: Context) -> str | None:
    if not capable(ctx.snapshot, "outbox"):
        return "the engine declares no outbox"
    return None


@situation("outbox-takeover-from-live-sender",
           "A sender claimed an outbox row whose previous sender was still alive, its lease "
           "having lapsed (or been cut): two senders may now send the same effect, and only "
           "the row's fence and the idempotency key keep it once.")
def _outbox_takeover(ctx: Context):
    why = _has_outbox(ctx)
    if why:
        return why
    if any(is_engine(e, "effect_queued") for e in ctx.history) and \
            not any(is_engine(e, "effect_claimed") for e in ctx.history):
        return "the engine takes no lease on outbox rows (no effect_claimed operations)"
    holder: dict[Any, Event] = {}
    found = []
    for e in ctx.history:
        if not is_engine(e) or not e["type"].startswith("effect_") or e["type"] == "effect_queued":
            continue
        row, prev = e.get("row"), holder.get(e.get("row"))
        if e["type"] == "effect_claimed":
            if prev is not None and prev.get("worker") != e.get("worker") and \
                    ctx.exit_between(ctx.pid_of(prev), prev["t"], e["t"]) is None:
                found.append((e, f"job {e.get('job')}: {e.get('worker')} claimed row {row} "
                                 f"({e.get('kind')!r}) at {ctx.at(e['t'])} from "
                                 f"{prev.get('worker')}, alive, which claimed it at "
                                 f"{ctx.at(prev['t'])}"))
            holder[row] = e
        elif prev is not None and e.get("worker") == prev.get("worker") and (
                e["type"] == "effect_sent" or not e.get("lease_until")
                or e["lease_until"] <= e["t"] + TOL):
            holder.pop(row, None)   # sent or let go by its sender
    return found


def _requests_by_key(ctx: Context) -> dict[Any, list[Event]] | str:
    """The receiver's requests by idempotency key, in the ledger's order; or why this history
    cannot show a send's retry (no outbox, no receiver ledger)."""
    why = _has_outbox(ctx)
    if why:
        return why
    if not ctx.ledger("receiver"):
        return "the receiver's ledger was not kept"
    by_key: dict[Any, list[Event]] = {}
    for e in ctx.history:
        if e.get("src") == "receiver" and e["type"] == "request":
            by_key.setdefault(e.get("key"), []).append(e)
    return by_key


def _sent_again(by_key: dict[Any, list[Event]], first: Any, not_before: Any):
    """(key, request, the next request of its key that started at or after
    `not_before(request)`) for each request `first` accepts that was sent again."""
    for key, group in by_key.items():
        for i, e in enumerate(group):
            if first(e):
                again = next((r for r in group[i + 1:] if r["t_start"] >= not_before(e)), None)
                if again is not None:
                    yield key, e, again


@situation("ambiguous-send-retried",
           "A send whose outcome the sender could not know (the answer lost, the request "
           "applied after the sender gave up) was sent again: only the idempotency key "
           "keeps the effect applied once.")
def _ambiguous_send(ctx: Context):
    by_key = _requests_by_key(ctx)
    if isinstance(by_key, str):
        return by_key  # why this history cannot show it
    unknowable = lambda e: (e.get("completion") == "info"  # noqa: E731
                            or e.get("outcome") in ("dropped", "applied_late"))
    return [(again, f"job {e.get('job')}: {e.get('kind')!r} (key {key}) sent at "
                    f"{ctx.at(e['t_start'])} with no knowable outcome ({e.get('outcome')}), "
                    f"sent again at {ctx.at(again['t_start'])} by {again.get('worker')}")
            for key, e, again in _sent_again(by_key, unknowable, lambda e: e["t_start"])]


@situation("failed-send-retried",
           "The receiver refused a send for a reason worth retrying (a 5xx, 408 or 429, "
           "nothing applied) and the effect was sent again: the retry must wait out the "
           "sender's backoff, jittered, not hammer the receiver at once.")
def _failed_send(ctx: Context):
    by_key = _requests_by_key(ctx)
    if isinstance(by_key, str):
        return by_key  # why this history cannot show it
    def refused_for_now(e: Event) -> bool:
        # a definite refusal (a ledger too old to say "completion" gave only those)
        status = e.get("status")
        return (e.get("completion", "fail") == "fail" and not e.get("applied")
                and status is not None and (status >= 500 or status in (408, 429)))
    return [(again, f"job {e.get('job')}: {e.get('kind')!r} (key {key}) refused with "
                    f"{e.get('status')} at {ctx.at(e['t_end'])}, sent again at "
                    f"{ctx.at(again['t_start'])} by {again.get('worker')}")
            for key, e, again in _sent_again(by_key, refused_for_now,
                                             lambda e: e["t_end"] - TOL)]


@situation("crash-between-commit-and-effect",
           "A process died after committing a write that queued an effect, or after claiming "
           "an effect to send, and before the effect was marked sent: the effect must still "
           "be sent, once.")
def _crash_before_effect(ctx: Context):
    why = _has_outbox(ctx)
    if why:
        return why
    sent: dict[Any, float] = {}
    for e in ctx.history:
        if is_engine(e, "effect_sent"):
            sent.setdefault(e.get("row"), e["t"])
    found, seen = [], set()
    for e in ctx.history:
        if not is_engine(e, "effect_queued", "effect_claimed") or not is_worker(e):
            continue
        worker, pid = e.get("worker"), ctx.pid_of(e)
        times = ctx.jobs.by_worker.get(worker, [])
        if e["type"] == "effect_claimed":   # its next write of the row
            times = [w["t"] for w in ctx.history if is_engine(w) and w.get("row") == e.get("row")
                     and w.get("worker") == worker and w["t"] > e["t"]
                     and w["type"] != "effect_queued"]
        i = bisect.bisect_right(times, e["t"])
        nxt = times[i] if i < len(times) else float("inf")
        until = min(nxt, sent.get(e.get("row"), float("inf")))
        died = ctx.exit_between(pid, e["t"], until)
        if died is not None and (id(died), e.get("job")) not in seen:
            seen.add((id(died), e.get("job")))
            found.append((died, f"job {e.get('job')}: {worker} died at {ctx.at(died['t'])} "
                                f"after its {e['type']} of row {e.get('row')} "
                                f"({e.get('kind')!r}) at {ctx.at(e['t'])}, before it was sent"))
    return found


# -- operators and submissions --------------------------------------------------------------

@situation("operator-move-on-worked-job",
           "An operator acted on a job (or tried to) while a live worker held it mid-step: "
           "the move must take the job from the worker, whose late writes must then fail.")
def _operator_on_worked(ctx: Context):
    if not capable(ctx.snapshot, "operator"):
        return "the engine declares no operator actions"
    found = []
    tl = ctx.timeline
    for pos, e in enumerate(ctx.history):
        committed = is_job(e) and is_operator(e)
        refused = e.get("src") == "nemesis" and e["type"] == "operator" and \
            str(e.get("result", "")).startswith("refused")
        if not (committed or refused) or e.get("job") is None:
            continue
        t = e.get("t_start", e["t"]) if refused else e["t"]
        for h in reversed(tl.holdings.get(e["job"], [])):
            if h.start_pos >= pos:
                continue
            open_ = h.write is None or h.write_pos > pos
            if open_ and ctx.exit_between(ctx.pid_of(h.start), h.start["t"], t) is None:
                found.append((e, f"job {e['job']}: an operator's "
                                 f"{e.get('action') or e.get('to')} at {ctx.at(t)} while "
                                 f"{h.worker} held step {h.step['name']!r}"
                                 + (" (refused)" if refused else "")))
            break
    return found


@situation("duplicate-submit",
           "A job was submitted again under an id already submitted: the engine must keep "
           "one job, and say so to the caller.")
def _duplicate_submit(ctx: Context):
    shown = [e for e in ctx.history if e.get("src") == "nemesis"
             and e["type"] == "duplicate_submit"]
    if not shown:
        shown = [e for e in ctx.history if e.get("src") == "runner" and e["type"] == "submit"
                 and e.get("duplicate")]
    return [(e, f"job {e.get('job')}: submitted again at {ctx.at(e['t'])} "
                f"({e.get('kind') or 'duplicate'}: {e.get('result')})") for e in shown]
