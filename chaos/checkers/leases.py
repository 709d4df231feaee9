"""Checkers of leases: two workers never run the same step at once, or the duplicate spend
stays within the scenario's allowance (lease-exclusive); a worker whose lease was taken
writes nothing to the job or its outbox rows (fenced-writes)."""
from __future__ import annotations

import bisect
import math
from typing import Any

from ..history import Event
from .billing import COST_TOLERANCE, memoized_call, needs_ledger
from .index import readings
from .ops import (TOL, capable, disturbed, is_effect, is_engine, is_heartbeat, is_job,
                  is_operator, is_worker, machine_slack, takes_lease)
from .transitions import JobIndex, clock_of, job_ops
from .verdict import Verdict

MAX_WITNESS_CALLS = 10


# -- lease-exclusive ------------------------------------------------------------------------

def check_lease_exclusive(history: list[Event], snapshot: dict[str, Any]) -> Verdict:
    """No two workers' provider calls for one (job, step) overlap, when the plan says leases
    are exclusive; otherwise duplicate spend is measured and held to the allowance.

    A call's interval is [t_start, end], end = the earliest of the ledger's t_end, the time
    its spend record committed (a worker that timed out stopped waiting), its worker's next
    write for the job (a worker is sequential: it writes the failure of a call it gave up on
    only once it stopped waiting) and its process's exit. Exclusive (plan.expect.lease_exclusive): every overlapping pair of calls by
    different workers fails ("concurrent-calls"). Otherwise: duplicate calls are a
    (job, step)'s calls with provider outcome "ok" other than the memoized one (or, with no
    memoized call, the first), leaving out those of a worker that died before it could write
    (a crash's waste, not a lease's); their billed sum must not exceed
    plan.expect.duplicate_spend_allowance. A duplicate that names no worker (the fakes could
    not tie it to a live process) is judged only if no process died while it was open;
    otherwise it may be a crash's waste, and when only such calls take the spend over the
    allowance the verdict is unknown.
    """
    verdict = Verdict("lease-exclusive")
    shared = readings(history)
    calls = shared.calls
    why = needs_ledger(history, calls)
    if why:
        return verdict.unknown(why)
    expect = snapshot["plan"]["expect"]
    exclusive = bool(expect.get("lease_exclusive"))
    allowance = float(expect.get("duplicate_spend_allowance") or 0.0)
    spends, index, memos = shared.spends, shared.jobs, shared.memos
    at = clock_of(history)
    pairs, duplicates, untold = 0, [], []
    for key, group in calls.items():
        verdict.checked += len(group)
        for a, b in overlapping_pairs(group, lambda c: call_end(c, spends, index)):
            pairs += 1
            if exclusive:
                verdict.fail("concurrent-calls", f"job {key[0]}: {a['worker']} and {b['worker']} "
                             f"both called the provider for {key[1]!r}: "
                             f"{at(a['t_start'])}..{at(a['t_end'])} and "
                             f"{at(b['t_start'])}..{at(b['t_end'])}", a, b)
        for c in duplicate_calls(group, memos.periods.get(key, ())):
            if c["worker"] is None and _a_process_died(index, key[0], c["t_start"]):
                untold.append(c)  # perhaps a killed caller's waste: no one can say whose
            elif not (c["worker"] and index.died_before_writing(
                    c["worker"], key[0], c["t_start"], c.get("pid"))):
                duplicates.append(c)
    spend = sum(c["billed"] or 0.0 for c in duplicates)
    untold_spend = sum(c["billed"] or 0.0 for c in untold)
    if not exclusive and spend > allowance + COST_TOLERANCE:
        worst = sorted(duplicates, key=lambda c: -(c["billed"] or 0.0))[:MAX_WITNESS_CALLS]
        verdict.fail("duplicate-spend-over-allowance", f"duplicate spend {spend:.6f} over "
                     f"{len(duplicates)} calls exceeds the allowance {allowance:.6f} (largest "
                     f"shown)", *worst)
    elif not exclusive and spend + untold_spend > allowance + COST_TOLERANCE:
        verdict.unknown(f"{len(untold)} duplicate calls (spend {untold_spend:.6f}) name no "
                        "worker and could not be tied to a process, and a process died while "
                        "each was open: a killed caller's waste is excused, another's is not, "
                        f"and which it was cannot be told; the rest ({spend:.6f}) is within "
                        f"the allowance {allowance:.6f}")
    verdict.metrics = {"lease_exclusive_expected": exclusive, "overlapping_pairs": pairs,
                       "duplicate_calls": len(duplicates), "duplicate_spend": round(spend, 9),
                       "unattributed_duplicates": len(untold),
                       "unattributed_spend": round(untold_spend, 9), "allowance": allowance}
    return verdict


def _a_process_died(index, job: str, t: float) -> bool:
    """Whether some process exited between t and the next write for the job by anyone: the
    only way a call that names no worker can have been a crash's waste."""
    after = [w for (j, _), times in index.writes.items() if j == job
             for w in times[bisect.bisect_right(times, t):][:1]]
    until = min(after, default=math.inf)
    return any(t - TOL <= x["t"] <= until for exits in index.exits.values() for x in exits)


def call_end(call: Event, spends: dict[int, Event], index: JobIndex) -> float:
    """When the caller stopped waiting for the call (see check_lease_exclusive)."""
    end = call["t_end"]
    spend = spends.get(id(call))
    if spend is not None:
        end = min(end, spend["t"])
    if call["worker"] and call.get("job") is not None:
        written = index.next_write(call["worker"], call["job"], call["t_start"])
        if written is not None:
            end = min(end, written)
    exit_ = (index.exit_after(call["worker"], call["t_start"], call.get("pid"))
             if call["worker"] else None)
    return min(end, exit_["t"]) if exit_ is not None else end


def overlapping_pairs(group: list[Event], end_of) -> list[tuple[Event, Event]]:
    """Pairs of calls by different workers whose intervals overlap (group by t_start)."""
    pairs, active = [], []
    for call in group:
        start = call["t_start"]
        active = [(end, other) for end, other in active if end > start]
        pairs += [(other, call) for _, other in active if other["worker"] != call["worker"]]
        active.append((end_of(call), call))
    return pairs


def duplicate_calls(group: list[Event], periods) -> list[Event]:
    """The calls that paid again for a good answer to a step (see check_lease_exclusive)."""
    good = [c for c in group if c["outcome"] == "ok"]
    final = periods[-1][0] if periods and periods[-1][1] is None else None
    kept = memoized_call(final, group) if final is not None and is_worker(final) else None
    if kept not in good:
        kept = good[0] if good else None
    return [c for c in good if c is not kept]


# -- fenced-writes --------------------------------------------------------------------------

def check_fenced_writes(history: list[Event], snapshot: dict[str, Any]) -> Verdict:
    """No job or outbox write by a worker after its lease was taken over.

    The owner: a job's submission, and every write that takes its lease (a claim, a claim
    that parks, an operator's move), make its writer the job's owner; outbox rows likewise
    (queued, then each sender's claim of the row). Every other write by a worker (state
    change, failure, heartbeat, moving on to the next step, an effect queued for its job,
    an effect sent) fails as "zombie-write" unless the writer is the current owner and,
    where the engine has fencing tokens, the token did not go back. Memo inserts by fenced
    workers are allowed (first writer wins) and only counted; harness, operator and submit
    writes are not worker writes.
    """
    verdict = Verdict("fenced-writes")
    if snapshot["jobs"] and not job_ops(history):
        return verdict.unknown("no engine job operations, yet the run had jobs: "
                               "was the observer installed?")
    at = clock_of(history)
    owners: dict[tuple, Event] = {}      # ("job", id) | ("row", id) -> the owner's write
    claims: dict[tuple, Event] = {}      # (thing, worker) -> the worker's last claim of it
    tokens: dict[tuple, int] = {}        # thing -> its last token, where the engine has one
    bumps = fenced_memos = unattributed = unleased = 0
    # An engine that never leases an outbox row sends without a fence to hold: its row
    # writes are counted, not judged.
    leases_rows = any(is_engine(e, "effect_claimed") for e in history)
    for e in (e for e in history if is_engine(e)):
        if e["type"] == "memo":
            owner = owners.get(("job", e["job"]))
            fenced_memos += (e["op"] == "insert" and is_worker(e)
                             and owner is not None and owner.get("worker") != e.get("worker"))
            continue
        if not (is_job(e) or is_effect(e)):
            continue
        thing = ("row", e["row"]) if is_effect(e) and e["type"] != "effect_queued" \
            else ("job", e["job"])
        # An effect queued carries its row's token, not its job's: nothing to compare.
        went_back = (e["type"] != "effect_queued" and e.get("token") is not None
                     and tokens.get(thing) is not None and e["token"] < tokens[thing])
        if e["type"] in ("submitted", "effect_queued", "effect_claimed") or takes_lease(e):
            own = ("row", e["row"]) if e["type"] == "effect_queued" else thing
            bumps += e["type"] not in ("submitted", "effect_queued")
            owners[own] = claims[(own, e.get("worker"))] = e
            if e.get("token") is not None:
                tokens[own] = max(tokens.get(own, e["token"]), e["token"])
        fenced = fenced_by(e)
        if fenced is None:
            continue
        if fenced[0] == "row" and not leases_rows:
            unleased += 1
            continue
        if e.get("worker") is None:
            unattributed += 1  # the observer cannot tell which worker wrote it
            continue
        verdict.checked += 1
        owner = owners.get(fenced)
        if went_back or owner is None or owner.get("worker") != e.get("worker"):
            _zombie(verdict, at, e, owner, claims.get((fenced, e.get("worker"))),
                    tokens.get(thing) if went_back else None)
        elif e.get("token") is not None and e["type"] != "effect_queued":
            tokens[thing] = e["token"]
    calls = _check_calls_leased(verdict, history, snapshot, at)
    calls["calls_judged"] += _check_calls_begun_in_lease(verdict, history, snapshot, at)
    verdict.metrics = {"worker_writes": verdict.checked, "lease_takes": bumps,
                       "fenced_memo_inserts": fenced_memos, "unattributed_writes": unattributed,
                       "unleased_row_writes": unleased, **calls}
    verdict.checked += calls["calls_judged"]
    if verdict.valid is True and unattributed and unattributed >= verdict.checked:
        verdict.unknown(f"the engine's observer could not say who made {unattributed} of "
                        f"{unattributed + verdict.checked} worker writes: they were not judged")
    return verdict


def _check_calls_leased(verdict: Verdict, history: list[Event], snapshot: dict, at
                        ) -> dict[str, int]:
    """A worker calls the provider for a job's step only while it works on that step: after
    its claim of the step (or its move on to it) and before its own write that ends it
    ("call-without-lease": a worker that goes on to a step it never claimed, or calls again
    for one it has finished). A lease taken from it meanwhile (by the harness, an operator,
    another worker after expiry) is not its to know until it writes: the fence is on
    writes, and fenced-writes judges those. Times from the fake and the store are compared
    with TOL."""
    tl = readings(history).timeline(snapshot["pipeline"])
    judged = 0
    for (job, step), entries in tl.calls.items():
        holds = [h for h in tl.holdings.get(job, []) if h.step["name"] == step]
        for _, _, call, _ in entries:
            worker, t = call.get("worker"), call["t_start"]
            if worker is None or worker not in tl.pids:
                continue  # not attributed to an engine worker
            judged += 1
            mine = [h for h in holds if h.worker == worker and h.start["t"] <= t + TOL]
            if any(h.write is None or h.write["t"] >= t - TOL for h in mine):
                continue
            last = mine[-1] if mine else None
            why = ("it never claimed that step" if last is None else
                   f"its own write at {at(last.write['t'])} had ended its claim of "
                   f"{at(last.start['t'])}")
            verdict.fail("call-without-lease",
                         f"job {job}: {worker} called the provider for step {step!r} at "
                         f"{at(t)} without working on that step ({why})",
                         *([last.start, last.write] if last else []), call)
    return {"calls_judged": judged}


def _check_calls_begun_in_lease(verdict: Verdict, history: list[Event], snapshot: dict,
                                at) -> int:
    """A worker does not begin a call it must pay for once its lease has ended
    ("call-after-lease"): the call's start as the engine recorded it (its spend record's
    `started`, read from the worker's own clock, the one its lease is written with) comes
    before the end of the lease it held under that token, from its claim and its renewals.
    Unlike the fake's time of arrival, this says what the worker knew when it began: a pause
    after that moment is the machine's, not the worker's. Workers on a skewed clock are not
    judged. Returns how many calls were judged."""
    if not capable(snapshot, "spend_records"):
        return 0
    shared = readings(history)
    tl = shared.timeline(snapshot["pipeline"])
    judged = 0
    for e in history:
        if not is_engine(e, "billed") or e.get("started") is None or not is_worker(e) or \
                tl.is_skewed(e.get("worker")):
            continue
        held = shared.lease_held(e.get("job"), e["worker"], e.get("token"), e["started"])
        if held is None:
            continue  # no lease of this token is known: fenced-writes' to judge
        judged += 1
        claim, until = held
        if e["started"] > until + TOL:
            verdict.fail("call-after-lease", f"job {e['job']}: {e['worker']} began its call "
                         f"for step {e.get('step')!r} at {at(e['started'])}, after the lease "
                         f"it held (token {e.get('token')}) had ended at {at(until)}",
                         claim, e)
    return judged


def fenced_by(e: Event) -> tuple | None:
    """The lease a worker's job or outbox write must hold: its job's for a job write or an
    effect queued (made while finishing the job), its row's for a later outbox write; None
    for writes that take a lease (claims) and for writes that are not a worker's."""
    if not is_worker(e) or takes_lease(e) or e["type"] in ("removed", "submitted",
                                                            "effect_claimed"):
        return None
    if is_job(e) or e["type"] == "effect_queued":
        return ("job", e["job"])
    return ("row", e["row"])


def _zombie(verdict: Verdict, at, e: Event, owner: Event | None, own_claim: Event | None,
            back_from: int | None) -> None:
    if is_job(e) and e["from"] != e["to"]:
        what = f"{e['from']} -> {e['to']}"
    elif is_job(e):
        what = (f"a heartbeat in {e['to']!r}" if e.get("heartbeat")
                else f"the job (staying {e['to']!r}: attempts {e.get('attempts')}, lease until "
                     f"{at(e['lease_until']) if e.get('lease_until') else 'none'})")
    elif e["type"] == "effect_queued":
        what = f"an outbox row {e['kind']!r}"
    else:
        what = f"outbox row {e['row']} ({e['kind']!r})"
    message = f"job {e['job']}: {e.get('worker')} wrote {what} at {at(e['t'])}"
    if back_from is not None:
        message += f", setting the token back from {back_from} to {e['token']}"
    elif owner is None:
        message += ", which nobody had claimed"
    else:
        token = f" (token {owner['token']})" if owner.get("token") is not None else ""
        message += (f", but the lease{token} belonged to {owner.get('worker')} "
                    f"since {at(owner['t'])}")
    if own_claim is not None:
        token = f" token {own_claim['token']}" if own_claim.get("token") is not None else ""
        message += f"; its own claim was{token} at {at(own_claim['t'])}"
    witnesses = [w for w in (own_claim, owner) if w is not None and w is not e]
    witnesses = [w for i, w in enumerate(witnesses) if w not in witnesses[:i]] + [e]
    verdict.fail("zombie-write", message, *witnesses)



# -- lease-kept -----------------------------------------------------------------------------

def check_lease_kept(history: list[Event], snapshot: dict[str, Any]) -> Verdict:
    """With heartbeat on, a live worker keeps the lease of the step it works on: from its
    claim to its write that ends the step (or its death), the lease it holds never runs out
    ("lease-lapsed"), and no renewal moves it past the renewal's time plus one lease
    ("lease-overextended": the renewal reads its clock before it commits), nor, for an engine
    that declares lease_from_write, short of a whole lease from its write less the machine's
    slack ("renewal-short"). And, heartbeat or not, a claim grants at most one lease from
    when it is written and at least `short_lease`'s floor ("claim-lease-short",
    "claim-lease-long"; a sender's claim of an outbox row likewise, by the outbox lease), and
    a worker never claims while holding as many live leases as it has slots: it walked away
    from one ("lease-abandoned").

    A lapse is judged only while the worker waits on a provider call of its step (a process
    the machine stopped running as a whole is no heartbeat's failure), and is excused when
    the holder's process was left unrun (a thread ready to run and not run: chaos.runqueue)
    for all but one heartbeat interval between its last renewal and the lapse. Not judged
    where the
    harness takes leases on purpose: a holding during which the nemesis
    expired leases, paused the holder, or held the write lock, and workers on a skewed clock
    or started without heartbeat."""
    verdict = Verdict("lease-kept")
    settings = snapshot["settings"]
    shared = readings(history)
    tl = shared.timeline(snapshot["pipeline"])
    at = clock_of(history)
    _check_abandoned(verdict, tl, settings.get("slots") or 1, at,
                     settings.get("finish_retry_slack") or 0.0)
    _check_claim_leases(verdict, history, settings, tl, at, snapshot.get("clock"))
    if not capable(snapshot, "heartbeat") or not settings.get("heartbeat"):
        return verdict if verdict.valid is False else verdict.unknown(
            "the engine runs without heartbeat here: a lease that runs out under a live "
            "worker is expected")
    lease = settings.get("lease")
    if lease is None:
        return verdict if verdict.valid is False else verdict.unknown(
            "the engine declares no lease length")
    excused = shared.windows
    beat = settings.get("heartbeat_interval") or lease / 3
    if settings.get("lease_from_write"):
        _check_renewals(verdict, shared, tl, lease, snapshot.get("clock"), at)
    for job, holds in tl.holdings.items():
        events = [e for _, e in tl.job_events.get(job, [])]
        for h in holds:
            if tl.is_skewed(h.worker) or tl.pids.get(h.worker) in excused["no-heartbeat"]:
                continue
            verdict.checked += 1
            _check_holding(verdict, h, events, shared, lease, beat, at)
    if not verdict.checked and verdict.valid is not False:
        verdict.unknown("no holding to judge: every claim was by a worker on a skewed clock or "
                        "without heartbeat")
    verdict.metrics = {"holdings": verdict.checked, "lease": lease,
                       "heartbeat_interval": settings.get("heartbeat_interval")}
    return verdict


def short_lease(settings: dict, snapshot_clock: str | None) -> tuple[Any, Any]:
    """(floor, excuse) for judging a lease written at some time: floor(lease) is the least it
    may run from its write, and excuse(shared) the harness windows that may make it shorter.
    For an engine that declares lease_from_write, a whole lease less the machine's slack
    (the time between its clock read and its commit that is not a lock wait), excused only
    by a pause of the writer itself, or by its stalls where they fill that time but for the
    slack (`_stalled_through`); otherwise half a lease, excused by any stop
    the harness made (a pause, a held write lock, or a pause of another process that held
    it)."""
    if settings.get("lease_from_write"):
        slack = machine_slack(snapshot_clock)
        return (lambda lease: lease - slack,
                lambda shared: {**shared.windows, "locks": [], "expiries": []})
    return (lambda lease: lease / 2,
            # A writer the harness paused inside its transaction held the lock for everyone.
            lambda shared: {**shared.windows,
                            "locks": shared.windows["locks"] + shared.paused_holds})


def _check_claim_leases(verdict: Verdict, history: list[Event], settings: dict, tl, at,
                        clock: str | None) -> None:
    """A claim's lease runs from when it is written: it ends no later than one lease after
    the claim commits, and no earlier than `short_lease`'s floor after. A claim the harness
    stopped between its clock and its commit may be as short as that stop made it: its
    shortness is not judged."""
    leases = {"claimed": settings.get("lease"), "effect_claimed": settings.get("outbox_lease")}
    shared = readings(history)
    floor, excuse = short_lease(settings, clock)
    windows = excuse(shared)
    for e in history:
        lease = leases.get(e.get("type")) if e.get("src") == "engine" else None
        granted = e.get("lease_until")
        if lease is None or granted is None or not is_worker(e) or tl.is_skewed(e.get("worker")):
            continue
        if e["type"] == "effect_claimed" and (e.get("dead_at") or e.get("sent_at")):
            continue  # a claim that dead-letters the row grants nothing
        what = (f"job {e['job']}: {e.get('worker')}'s claim of step {e.get('step')!r}"
                if e["type"] == "claimed" else
                f"outbox row {e.get('row')} ({e['job']} {e.get('kind')!r}): "
                f"{e.get('worker')}'s claim")
        head = (f"{what} at {at(e['t'])} set its lease to end at {at(granted)}, "
                f"{granted - e['t']:+.3f} s from the claim")
        if granted < e["t"] + floor(lease):
            pid = tl.pids.get(e.get("worker"))
            if disturbed(windows, pid, granted - lease, e["t"]) or (
                    settings.get("lease_from_write") and _stalled_through(
                        shared, pid, granted - lease, e["t"], lease - floor(lease))):
                continue
            verdict.fail("claim-lease-short", f"{head}: less than {floor(lease):.3f} s of the "
                         f"lease ({lease:g} s)", e)
        elif granted > e["t"] + lease + TOL:
            verdict.fail("claim-lease-long", f"{head}: more than the lease ({lease:g} s)", e)


def _check_abandoned(verdict: Verdict, tl, slots: int, at, grace: float) -> None:
    """A worker runs at most `slots` jobs at once: when it claims while already holding that
    many live leases (none ended by its write, by another's claim or by an intervention on
    the job), it walked away from one, leaving its job to wait for the lease to run out
    ("lease-abandoned"). A lease within `grace` of its end (the engine's finish_retry_slack:
    a write the lock kept out may give up that early) counts as over."""
    by_worker: dict[str, list] = {}
    for holds in tl.holdings.values():
        for h in holds:
            by_worker.setdefault(h.worker, []).append(h)
    for worker, holds in by_worker.items():
        holds.sort(key=lambda h: h.start_pos)  # history order: times tie within a commit
        live: list = []  # a holding that is no longer live never is again
        for h in holds:
            t = h.start["t"]
            live = [p for p in live if _live_at(p, t, tl, grace)]
            if len(live) >= slots:
                old = live[0]
                verdict.fail("lease-abandoned", f"job {old.job}: {worker} claimed job {h.job} "
                             f"at {at(t)} while it still held the lease on job {old.job} "
                             f"(step {old.step['name']!r}, claimed at {at(old.start['t'])}, "
                             f"lease to {at(_held_until(old, tl, t))}) without having "
                             "finished or failed it", old.start, h.start)
                return
            live.append(h)


def _held_until(h, tl, t: float) -> float | None:
    """The end of `h`'s lease as its holder last wrote it before `t`; None when another
    write to the job came first (a claim, an operator's or the harness's): the lease ended."""
    until = h.start.get("lease_until") or 0.0
    for _, e in tl.job_events.get(h.job, []):
        if not h.start["t"] < e["t"] <= t + TOL or e is h.start:
            continue
        if not (is_heartbeat(e) and e.get("worker") == h.worker):
            return None
        until = max(until, e.get("lease_until") or 0.0)
    return until


def _live_at(h, t: float, tl, grace: float = 0.0) -> bool:
    """Whether holding `h` still held a live lease at `t`: not ended by its own write, nor
    by any other write to the job, and its lease not run out (nor within `grace` of it)."""
    if h.write is not None and h.write["t"] <= t + TOL:
        return False
    until = _held_until(h, tl, t)
    return until is not None and until > t + grace + TOL


def _check_renewals(verdict: Verdict, shared, tl, lease: float, clock: str | None,
                    at) -> None:
    """For an engine whose leases run from their write: every renewal leaves the lease at
    least a whole lease less the machine's slack past the renewal's own commit, unless the
    renewer was paused between its clock read and its write ("renewal-short")."""
    floor, excuse = short_lease({"lease_from_write": True}, clock)
    windows = excuse(shared)
    for e in (w for writes in shared.own_leases.values() for w in writes):
        until = e["lease_until"]
        if not is_heartbeat(e) or tl.is_skewed(e.get("worker")) or until >= e["t"] + floor(lease):
            continue
        pid = tl.pids.get(e.get("worker"))
        if disturbed(windows, pid, until - lease, e["t"]) or _stalled_through(
                shared, pid, until - lease, e["t"], lease - floor(lease)):
            continue
        verdict.fail("renewal-short", f"job {e['job']}: {e.get('worker')}'s renewal at "
                     f"{at(e['t'])} left its lease ending at {at(until)}, {until - e['t']:.3f} s "
                     f"ahead: less than {floor(lease):.3f} s of the lease ({lease:g} s)", e)


def _stalled_through(shared, pid: int | None, start: float, end: float, spare: float) -> bool:
    """Whether process `pid` was left unrun (its stalls: chaos.runqueue, or the
    simulation's) for all of [start, end] but `spare` seconds: a stall delays a write by at
    most its own length, so only one that long explains the delay."""
    return end > start and shared.stalled(pid, start, end) >= (end - start) - spare - TOL


def _check_holding(verdict: Verdict, h, events: list[Event], shared, lease: float,
                   beat: float, at) -> None:
    index, excused = shared.jobs, shared.windows
    start = h.start["t"]
    granted = h.start.get("lease_until")
    if granted is not None and granted < start + lease / 2:
        return  # a claim-lease-short (see _check_claim_leases): no lease to keep
    died = index.exit_after(h.worker, start)
    # The holding ends with its own write, its death, or the next claim or intervention on
    # the job (a claim by anyone: moving on to the next step is a claim of its own).
    after = next((e["t"] for e in events if e["t"] > start and e is not h.start and (
        e["type"] == "claimed" or is_operator(e) or e.get("actor") == "harness")), None)
    end = min(t for t in (h.write["t"] if h.write else None, died["t"] if died else None,
                          after, events[-1]["t"]) if t is not None)
    if disturbed(excused, index.pids.get(h.worker), start, end):
        return
    held_until, last = h.start.get("lease_until"), h.start
    renewals = [e for e in events if is_heartbeat(e) and e.get("worker") == h.worker
                and start < e["t"] <= end]
    for e in renewals + [None]:
        t = e["t"] if e is not None else end
        if held_until is not None and held_until < t - TOL and _waiting_at(h, held_until):
            if _stalled_through(shared, index.pids.get(h.worker), last["t"], held_until,
                                beat):
                return  # the machine ran it for less than a beat while its renewal was due
            what = f"its next renewal at {at(t)}" if e is not None else (
                f"its write at {at(t)}" if h.write is not None and t == h.write["t"]
                else f"{'its death' if died and t == died['t'] else 'the end of the run'} at "
                f"{at(t)}")
            verdict.fail("lease-lapsed", f"job {h.job}: {h.worker} held step "
                         f"{h.step['name']!r} from {at(start)}, alive and working, but its lease "
                         f"ran out at {at(held_until)}, before {what} (lease {lease:g} s)",
                         h.start, last, *([e] if e is not None else []))
            return
        if e is None:
            return
        if e.get("lease_until") is not None and e["lease_until"] > e["t"] + lease + TOL:
            verdict.fail("lease-overextended", f"job {h.job}: {h.worker}'s renewal at "
                         f"{at(e['t'])} moved the lease to {at(e['lease_until'])}, "
                         f"{e['lease_until'] - e['t']:.3f} s ahead: more than the lease "
                         f"({lease:g} s)", e)
        held_until, last = e.get("lease_until", held_until), e


def _waiting_at(h, t: float) -> bool:
    """Whether the holder was waiting on a provider call of the step at `t`: the moment a
    heartbeat exists for. A process the machine did not run at all (no call in flight, no
    write) stalled as a whole; a heartbeat cannot help that, and it is not judged."""
    return any(c["t_start"] - TOL <= t <= c["t_end"] + TOL for _, c in h.calls)


CHECKS = {
    "lease-exclusive": check_lease_exclusive,
    "fenced-writes": check_fenced_writes,
    "lease-kept": check_lease_kept,
}
