"""lease-kept: a live worker keeps the lease of the step it works on, and every lease it is
granted or renews runs as long as the engine declares (see check_lease_kept)."""
from __future__ import annotations

from typing import Any

from chaos.history import Event
from chaos.checkers.index import readings
from chaos.checkers.ops import (TOL, capable, disturbed, is_heartbeat, is_operator, is_worker,
                                machine_slack)
from chaos.checkers.skew import unjudged
from chaos.checkers.transitions import clock_of
from chaos.checkers.verdict import Verdict


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
    the holder's process was left unrun (a thread ready to run and not run: chaos.run.runqueue)
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
    _check_abandoned(verdict, tl, settings, at, settings.get("finish_retry_slack") or 0.0)
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
        _check_renewals(verdict, shared, tl, settings, snapshot.get("clock"), at)
    for job, holds in tl.holdings.items():
        events = [e for _, e in tl.job_events.get(job, [])]
        for h in holds:
            if unjudged(tl, settings, h.worker) or \
                    tl.pids.get(h.worker) in excused["no-heartbeat"]:
                continue
            verdict.checked += 1
            _check_holding(verdict, h, events, shared, lease, beat, at, tl)
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
                lambda shared: {**shared.windows, "locks": [], "row_locks": [],
                                "expiries": []})
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
        if lease is None or granted is None or not is_worker(e) or \
                unjudged(tl, settings, e.get("worker")):
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
            if disturbed(windows, pid, granted - lease, e["t"], e.get("job")) or (
                    settings.get("lease_from_write") and _stalled_through(
                        shared, pid, granted - lease, e["t"], lease - floor(lease))):
                continue
            verdict.fail("claim-lease-short", f"{head}: less than {floor(lease):.3f} s of the "
                         f"lease ({lease:g} s)", e)
        elif granted > e["t"] + lease + TOL:
            verdict.fail("claim-lease-long", f"{head}: more than the lease ({lease:g} s)", e)


def _check_abandoned(verdict: Verdict, tl, settings: dict, at, grace: float) -> None:
    """A worker process runs at most `slots` jobs at once (its job slots, under one worker
    id or one per slot): when it claims while already holding that many live leases (none
    ended by its own write, by another's claim or by an intervention on the job), it walked
    away from one, leaving its job to wait for the lease to run out ("lease-abandoned"). A
    lease within `grace` of its end (the engine's finish_retry_slack: a write the lock kept
    out may give up that early) counts as over. Holdings are grouped by the process that
    claimed (a worker id that names a slot outlives its processes; one whose process is not
    known stands for itself). Where the engine declares `id_per_slot` (each slot writes
    under an id of its own), a worker id holds one job at a time as well: a slot that
    claims while its own last lease is live walked away from it, however many other slots
    of its process are free."""
    slots = settings.get("slots") or 1
    groups = [(lambda h: holder_process(h, tl), slots)]
    if settings.get("id_per_slot") and slots > 1:
        groups.append((lambda h: ("worker", h.worker), 1))
    for key, limit in groups:
        by_holder: dict[Any, list] = {}
        for holds in tl.holdings.values():
            for h in holds:
                by_holder.setdefault(key(h), []).append(h)
        for holds in by_holder.values():
            if _walked_away(verdict, tl, holds, limit, slots, at, grace):
                return


def _walked_away(verdict: Verdict, tl, holds: list, limit: int, slots: int, at,
                 grace: float) -> bool:
    """Fail lease-abandoned at the first claim of `holds` (one holder's) made while it held
    `limit` live leases; whether it did."""
    holds.sort(key=lambda h: h.start_pos)  # history order: times tie within a commit
    live: list = []  # a holding that is no longer live never is again
    for h in holds:
        t = h.start["t"]
        live = [p for p in live if _live_at(p, t, tl, grace)]
        if len(live) >= limit:
            old = live[0]
            held = (f"the lease on job {old.job}" if limit == 1 else
                    f"{len(live)} live leases, as many as its {slots} slots, the oldest "
                    f"on job {old.job}")
            whose = ("it" if limit == 1 and slots > 1 else "its process")
            verdict.fail("lease-abandoned", f"job {old.job}: {h.worker} claimed job "
                         f"{h.job} at {at(t)} while {whose} still held {held} "
                         f"(step {old.step['name']!r}, claimed at {at(old.start['t'])} by "
                         f"{old.worker}, lease to {at(_held_until(old, tl, t))}) without "
                         "having finished or failed it", old.start, h.start)
            return True
        live.append(h)
    return False


def renews(e: Event, h, tl) -> bool:
    """Whether `e` renews holding `h`'s lease: a heartbeat by its holder, or by another
    thread of the holder's process under the holding's own fencing token (one heartbeat
    for every job slot of a process may write under an id of its own)."""
    if not is_heartbeat(e):
        return False
    if e.get("worker") == h.worker:
        return True
    pid = e.get("pid") if e.get("pid") is not None else tl.pids.get(e.get("worker"))
    return (h.token is not None and e.get("token") == h.token and pid is not None
            and ("pid", pid) == holder_process(h, tl))


def holder_process(h, tl) -> Any:
    """The process that made holding `h`'s claim: its pid as the claim names it, else the
    one its worker id is known by, else the worker id itself."""
    pid = h.start.get("pid")
    if pid is None:
        pid = tl.pids.get(h.worker)
    return ("pid", pid) if pid is not None else ("worker", h.worker)


def _held_until(h, tl, t: float) -> float | None:
    """The end of `h`'s lease as its holder last wrote it before `t`; None when another
    write to the job came first (a claim, an operator's or the harness's): the lease ended."""
    until = h.start.get("lease_until") or 0.0
    for _, e in tl.job_events.get(h.job, []):
        if not h.start["t"] < e["t"] <= t + TOL or e is h.start:
            continue
        if not renews(e, h, tl):
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


def _check_renewals(verdict: Verdict, shared, tl, settings: dict, clock: str | None,
                    at) -> None:
    """For an engine whose leases run from their write: every renewal leaves the lease at
    least a whole lease less the machine's slack past the renewal's own commit, unless the
    renewer was paused between its clock read and its write ("renewal-short")."""
    lease = settings["lease"]
    floor, excuse = short_lease({"lease_from_write": True}, clock)
    windows = excuse(shared)
    for e in (w for writes in shared.own_leases.values() for w in writes):
        until = e["lease_until"]
        if not is_heartbeat(e) or unjudged(tl, settings, e.get("worker")) or \
                until >= e["t"] + floor(lease):
            continue
        pid = tl.pids.get(e.get("worker"))
        if disturbed(windows, pid, until - lease, e["t"], e.get("job")) or _stalled_through(
                shared, pid, until - lease, e["t"], lease - floor(lease)):
            continue
        verdict.fail("renewal-short", f"job {e['job']}: {e.get('worker')}'s renewal at "
                     f"{at(e['t'])} left its lease ending at {at(until)}, {until - e['t']:.3f} s "
                     f"ahead: less than {floor(lease):.3f} s of the lease ({lease:g} s)", e)


def _stalled_through(shared, pid: int | None, start: float, end: float, spare: float) -> bool:
    """Whether process `pid` was left unrun (its stalls: chaos.run.runqueue, or the
    simulation's) for all of [start, end] but `spare` seconds: a stall delays a write by at
    most its own length, so only one that long explains the delay."""
    return end > start and shared.stalled(pid, start, end) >= (end - start) - spare - TOL


def _check_holding(verdict: Verdict, h, events: list[Event], shared, lease: float,
                   beat: float, at, tl) -> None:
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
    if disturbed(excused, index.pids.get(h.worker), start, end, h.job):
        return
    held_until, last = h.start.get("lease_until"), h.start
    renewals = [e for e in events if renews(e, h, tl)
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
