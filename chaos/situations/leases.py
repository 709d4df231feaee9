"""The situations of leases: a zombie's write or a call answered after a takeover, a
renewal after the lease was lost, a commit after its lease lapsed, a lock held past a lease."""
from __future__ import annotations

import bisect

from chaos.checkers.ops import (LOCK_WINDOWS, TOL, capable, is_engine, is_heartbeat, is_worker,
                           takes_lease)
from chaos.situations.catalog import Context, attributed, situation


# -- leases ---------------------------------------------------------------------------------

@situation("zombie-write-after-takeover",
           "A worker wrote (or tried to: a memo or spend record kept from a refused "
           "completion) for a job after another worker took the job's lease: only the fence "
           "stops a zombie's write from overwriting the new holder's work.")
def _zombie_write(ctx: Context):
    why = attributed(ctx)
    if why:
        return why
    found, seen = [], set()
    for pos, e in enumerate(ctx.history):
        if not is_engine(e, "state", "memo", "billed", "effect_queued") or not is_worker(e):
            continue
        if takes_lease(e) or is_heartbeat(e) or (e["type"] == "memo" and e.get("op") == "delete"):
            continue
        worker, job = e.get("worker"), e.get("job")
        claim = ctx.jobs.claim_of(worker, job, e["t"]) if worker else None
        if claim is None or (worker, id(claim)) in seen:
            continue
        other = ctx.takeover(worker, job, claim, pos)
        if other is not None:
            seen.add((worker, id(claim)))
            found.append((e, f"job {job}: {worker} wrote a {e['type']} at {ctx.at(e['t'])} "
                              f"after {other.get('worker')} took the lease at "
                              f"{ctx.at(other['t'])}"))
    return found


@situation("call-answered-after-takeover",
           "A provider call's answer reached its caller after another worker had taken the "
           "caller's lease (or the harness had cut it short): the caller holds a paid result "
           "it may no longer commit.")
def _call_after_takeover(ctx: Context):
    why = ctx.worker_ids_match_calls() or attributed(ctx)
    if why:
        return why
    found, cuts = [], {}
    for e in ctx.history:   # the harness's writes that cut a job's lease short (expiry)
        if is_engine(e, "state") and e.get("actor") == "harness" and \
                (e.get("lease_until") or 0.0) <= e["t"] + TOL:
            cuts.setdefault(e["job"], []).append(e)
    for e in ctx.history:
        if e.get("src") != "provider" or e["type"] != "call" or e.get("completion") == "info":
            continue
        worker, job, end = e.get("worker"), e.get("job"), e.get("t_end")
        claim = ctx.jobs.claim_of(worker, job, e["t_start"]) if worker else None
        if claim is None or end is None:
            continue
        takers = [b for b in ctx.jobs.bumps.get(job, ()) if is_worker(b)
                  and b.get("worker") != worker] + cuts.get(job, [])
        for b in sorted(takers, key=lambda b: ctx.pos[id(b)]):
            if ctx.pos[id(b)] > ctx.pos[id(claim)] and b["t"] < end - TOL:
                who = "the harness cut" if b.get("actor") == "harness" \
                    else f"{b.get('worker')} took"
                found.append((e, f"job {job}: {worker}'s call for {e.get('step')!r} was "
                                 f"answered at {ctx.at(end)}, after {who} the lease at "
                                 f"{ctx.at(b['t'])}"))
                break
    return found


def _interval(settings: dict) -> float:
    every = settings.get("heartbeat_interval")
    return float(every) if every is not None else float(settings.get("lease") or 0.0) / 3


@situation("heartbeat-after-lease-lost",
           "A worker renewed (or, alive and unpaused past its renewal interval, was due to "
           "renew) a lease another worker had taken: a renewal unfenced extends the new "
           "holder's lease for the zombie.")
def _heartbeat_lost(ctx: Context):
    settings = ctx.snapshot.get("settings") or {}
    if not capable(ctx.snapshot, "heartbeat") or settings.get("heartbeat") is False:
        return "the engine does not renew leases (no heartbeat)"
    why = attributed(ctx)
    if why:
        return why
    found, seen = [], set()
    for pos, e in enumerate(ctx.history):   # a renewal committed after the takeover
        if is_engine(e, "state") and is_heartbeat(e) and is_worker(e) and e.get("worker"):
            claim = ctx.jobs.claim_of(e["worker"], e["job"], e["t"])
            if claim is not None and id(claim) not in seen and \
                    ctx.takeover(e["worker"], e["job"], claim, pos) is not None:
                seen.add(id(claim))
                found.append((e, f"job {e['job']}: {e['worker']} renewed at "
                                 f"{ctx.at(e['t'])} a lease taken over"))
    for e in ctx.history:   # a heartbeat held at its renewal until the takeover, released
        if e.get("src") == "nemesis" and e.get("type") == "release" \
                and e.get("role") == "heartbeat" and e.get("reason") == "takeover":
            found.append((e, f"job {e.get('job')}: {e.get('target')} was held at its renewal "
                             f"until {e.get('by') or 'another worker'} took the lease, then "
                             f"renewed at {ctx.at(e['t'])}"))
    every, off = _interval(settings), ctx.shared.windows["no-heartbeat"]
    end_of_run = ctx.history[-1]["t"]
    for job, holdings in ctx.timeline.holdings.items():
        for h in holdings:
            if id(h.start) in seen:
                continue
            other = ctx.takeover(h.worker, job, h.start,
                                 h.write_pos if h.write is not None else len(ctx.history))
            pid = ctx.pid_of(h.start)
            if other is None or pid in off:
                continue
            dead = ctx.exit_between(pid, h.start["t"], end_of_run)
            if dead is not None and dead["t"] <= other["t"] + TOL:
                continue   # dead before the takeover: no renewal was due
            # A worker's next write of any job after the takeover: it had left the step.
            times = ctx.jobs.by_worker.get(h.worker, [])
            i = bisect.bisect_right(times, other["t"])
            moved = times[i] if i < len(times) else end_of_run
            until = min([x["t"] for x in (h.write, dead) if x is not None] + [end_of_run, moved])
            frozen, _ = ctx.shared.held_still(pid, other["t"], until)
            if until - other["t"] - frozen > every + TOL:
                seen.add(id(h.start))
                found.append((other, f"job {job}: {h.worker} was alive with its renewal due "
                                     f"for {until - other['t'] - frozen:.2f} s after "
                                     f"{other.get('worker')} took its lease at "
                                     f"{ctx.at(other['t'])}"))
    return found


def _has_leases(ctx: Context) -> str | None:
    if not ctx.shared.own_leases:
        return "the engine's claims carry no lease end (lease_until)"
    return None


@situation("commit-after-lease-lapse",
           "A worker committed a step's end after its own lease had run out, nobody having "
           "taken the job meanwhile: an engine that fences by time alone refuses good work, "
           "one that does not fence lets a lapsed holder race a new one.")
def _commit_after_lapse(ctx: Context):
    why = _has_leases(ctx) or attributed(ctx)
    if why:
        return why
    found = []
    for job, holdings in ctx.timeline.holdings.items():
        for h in holdings:
            w = h.write
            if w is None or w["to"] != h.step.get("done"):
                continue
            # the lease the holding's claim and its own renewals before the write gave it
            # (not the next step's claim, committed with the write)
            own = [e for e in ctx.shared.own_leases.get((job, h.worker, h.token), ())
                   if h.start_pos <= ctx.pos[id(e)] < h.write_pos]
            if not own:
                continue
            held = (h.start, max(e["lease_until"] for e in own))
            cut = _cut(ctx, job, h.start, h.write_pos)  # the harness ended it early
            end = min(held[1], cut["t"]) if cut is not None else held[1]
            if w["t"] <= end + TOL or ctx.takeover(h.worker, job, h.start, h.write_pos):
                continue
            if cut is None and ctx.takeover(h.worker, job, h.start, h.write_pos,
                                            workers_only=False):
                continue
            how = "cut short by the harness" if cut is not None and cut["t"] < held[1] \
                else "having run out"
            found.append((w, f"job {job}: {h.worker} committed {w['from']} -> {w['to']} "
                             f"at {ctx.at(w['t'])}, its lease {how} at {ctx.at(end)}"))
    return found


def _cut(ctx: Context, job: str, claim: dict, before_pos: int) -> dict | None:
    """The harness's first write that ended `job`'s lease (a forced expiry) after `claim`
    and before history position `before_pos`, or None."""
    for e in ctx.history[ctx.pos[id(claim)] + 1:before_pos]:
        if is_engine(e, "state") and e.get("job") == job and e.get("actor") == "harness" \
                and e.get("lease_until") is not None and e["lease_until"] <= e["t"] + TOL:
            return e
    return None


@situation("lock-wait-past-lease",
           "The store's write lock (or the job's row) was held past the end of a worker's "
           "lease on a job it was working on: its next write waits behind the lock while its "
           "lease runs out and another worker may claim the job.")
def _lock_wait(ctx: Context):
    why = _has_leases(ctx)
    if why:
        return why
    windows = ctx.shared.windows
    spans = [(a, b, None) for a, b in windows["locks"]]
    spans += [(a, b, row) for table, row, a, b in windows.get("row_locks", ()) if table == "job"]
    starts = {e["t"]: e for e in ctx.history if e.get("src") == "nemesis"
              and e["type"] in LOCK_WINDOWS + ("row_lock",)}
    found = []
    for a, b, only in spans:
        for job, holdings in ctx.timeline.holdings.items():
            if only is not None and job != only:
                continue
            for h in holdings:
                if h.start["t"] > a or (h.write is not None and h.write["t"] < a):
                    continue
                held = ctx.shared.lease_held(job, h.worker, h.start.get("token"), a)
                if held is not None and a <= held[1] < b:
                    shown = starts.get(a, h.start)
                    found.append((shown, f"job {job}: {h.worker}'s lease ended at "
                                         f"{ctx.at(held[1])} while the lock held since "
                                         f"{ctx.at(a)} ({'until the end' if b == float('inf') else ctx.at(b)})"))
    return found
