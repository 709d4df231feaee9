"""Checkers of leases: two workers never run the same step at once, or the duplicate spend
stays within the scenario's allowance, and no worker claims a lease still live
(lease-exclusive); a worker whose lease was taken writes nothing to the job or its outbox
rows (fenced-writes); a live worker keeps its lease (lease-kept: chaos.checkers.lease_kept)."""
from __future__ import annotations

import bisect
import math
from typing import Any, Callable

from chaos.history import Event
from chaos.engines.schema import reads
from chaos.checkers.billing import COST_TOLERANCE
from chaos.checkers.calls import memoized_call, needs_ledger
from chaos.checkers.index import readings
from chaos.checkers.lease_kept import check_lease_kept
from chaos.checkers.ops import TOL, capable, is_effect, is_engine, is_job, is_worker, takes_lease
from chaos.checkers.skew import live_lease_takes, skew_effects, store_clock, unjudged
from chaos.checkers.tokens import OPAQUE, TokenMarks, token_order
from chaos.checkers.transitions import JobIndex, clock_of, job_ops
from chaos.checkers.verdict import Verdict

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
        def wasted(c: Event, job: str = key[0]) -> bool:
            """A call whose worker died before it could write: a crash's waste."""
            return bool(c["worker"]) and index.died_before_writing(c["worker"], job,
                                                                   c["t_start"], c.get("pid"))
        for c in duplicate_calls(group, memos.periods.get(key, ()), wasted):
            if c["worker"] is None and _a_process_died(index, key[0], c["t_start"]):
                untold.append(c)  # perhaps a killed caller's waste: no one can say whose
            elif not wasted(c):
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
    _check_live_leases(verdict, history, snapshot, at)
    return verdict


def _check_live_leases(verdict: Verdict, history: list[Event], snapshot: dict, at) -> None:
    """No worker claims a job whose lease is still live by the true clock ("live-lease-taken":
    the lease as the job's last write left it ends after the claim). A worker on a skewed
    clock is held to it where the store's clock places leases; where its own clock does,
    its claims of live leases are what the skew does, counted and not judged. What the
    skewed workers did goes in metrics["skew"], and in the reason of a verdict that holds."""
    settings = snapshot["settings"]
    tl = readings(history).timeline(snapshot["pipeline"])
    for claim, before in live_lease_takes(history):
        worker = claim.get("worker")
        if unjudged(tl, settings, worker):
            continue
        skew = tl.skew_of(worker)
        clock = f" (its clock {skew:+g} s off, the store's placing leases)" if skew else ""
        verdict.fail("live-lease-taken", f"job {claim['job']}: {worker}{clock} claimed it at "
                     f"{at(claim['t'])} while the lease its last write left ran to "
                     f"{at(before['lease_until'])}, "
                     f"{before['lease_until'] - claim['t']:.3f} s later", before, claim)
    effects = skew_effects(history, settings, tl)
    if effects is None:
        return
    verdict.metrics["skew"] = effects
    verdict.checked += effects["claims"]
    if verdict.valid is True and not verdict.reason:
        verdict.reason = f"skewed workers: {effects['note']}"


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


def duplicate_calls(group: list[Event], periods,
                    wasted: Callable[[Event], bool] = lambda c: False) -> list[Event]:
    """The calls that paid again for a good answer to a step (see check_lease_exclusive): all
    good calls but the one the step kept, its memo's; with no memo (a step that memoizes
    nothing), the first good call of a caller that lived to write (`wasted` says which
    did not: a killed caller's call is a crash's waste, the finisher's is the step's own)."""
    good = [c for c in group if c["outcome"] == "ok"]
    final = periods[-1][0] if periods and periods[-1][1] is None else None
    kept = memoized_call(final, group) if final is not None and is_worker(final) else None
    if kept not in good:
        kept = next((c for c in good if not wasted(c)), good[0] if good else None)
    return [c for c in good if c is not kept]


# -- fenced-writes --------------------------------------------------------------------------

def check_fenced_writes(history: list[Event], snapshot: dict[str, Any]) -> Verdict:
    """No job or outbox write by a worker after its lease was taken over.

    The owner: a job's submission, and every write that takes its lease (a claim, a claim
    that parks, an operator's move), make its writer the job's owner; outbox rows likewise
    (queued, then each sender's claim of the row). Every other write by a worker (state
    change, failure, heartbeat, moving on to the next step, an effect queued for its job,
    an effect sent) fails as "zombie-write" unless the writer is the current owner and,
    where the engine has fencing tokens, the token did not go back: to a smaller one, or
    with opaque tokens (`token_order`) to the token of a holding whose claim committed
    before the newest one's (see chaos.checkers.tokens). Memo inserts by fenced
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
    order = token_order(snapshot)
    tokens = TokenMarks(order)           # thing -> its newest holding's token, if any
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
        went_back = e["type"] != "effect_queued" and tokens.went_back(thing, e.get("token"))
        if e["type"] in ("submitted", "effect_queued", "effect_claimed") or takes_lease(e):
            own = ("row", e["row"]) if e["type"] == "effect_queued" else thing
            bumps += e["type"] not in ("submitted", "effect_queued")
            owners[own] = claims[(own, e.get("worker"))] = e
            tokens.took(own, e.get("token"))
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
                    tokens.last.get(thing) if went_back else None, order)
        elif e["type"] != "effect_queued":
            tokens.kept(thing, e.get("token"))
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
    # claims a power cut took back, by (job, worker): the store no longer shows them
    cut_claims = [(c["t"], {tuple(x) for x in c.get("lost_claims") or ()}) for c in history
                  if c.get("src") == "nemesis" and c.get("type") == "power_loss"]
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
            if last is None and any(ct >= t and (job, worker) in lost
                                    for ct, lost in cut_claims):
                continue  # its claim was there until a power cut took it back
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
    settings = snapshot["settings"]
    for e in history:
        if not is_engine(e, "billed") or e.get("started") is None or not is_worker(e) or \
                unjudged(tl, settings, e.get("worker")):
            continue
        # The worker's own clock read `started`; where the store's clock placed the lease,
        # the true start is that less the skew the harness gave the worker.
        started = e["started"] - (tl.skew_of(e["worker"]) if store_clock(settings) else 0.0)
        held = shared.lease_held(e.get("job"), e["worker"], e.get("token"), started)
        if held is None:
            continue  # no lease of this token is known: fenced-writes' to judge
        judged += 1
        claim, until = held
        if started > until + TOL:
            verdict.fail("call-after-lease", f"job {e['job']}: {e['worker']} began its call "
                         f"for step {e.get('step')!r} at {at(started)}, after the lease "
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
            back_from: Any, order: str) -> None:
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
    if back_from is not None and order == OPAQUE:
        message += (f" under token {e['token']}, an older holding's than the newest claim's "
                    f"(token {back_from})")
    elif back_from is not None:
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



CHECKS = {
    "lease-exclusive": check_lease_exclusive,
    "fenced-writes": check_fenced_writes,
    "lease-kept": check_lease_kept,
}

#: the engine fields each check reads (chaos.engines.schema): an evidence field an engine leaves out
#: makes exactly these checks unknown, naming it
READS = {
    "fenced-writes": reads(
        submitted="actor job pid token worker",
        claimed="actor continued job lease_until pid step token worker",
        state="actor attempts from heartbeat job lease_until pid to token took_lease worker",
        memo="actor job op pid worker",
        effect_queued="actor job lease_until pid row token worker",
        effect_claimed="actor lease_until pid row token worker",
        effect_sent="actor lease_until pid row token worker",
        effect_state="actor lease_until pid row token worker",
        billed="actor job pid started token worker"),
    "lease-exclusive": reads(
        submitted="actor job lease_until pid worker",
        claimed="actor continued job lease_until pid step token worker",
        state="actor from heartbeat job lease_until pid to token took_lease worker",
        memo="actor job op pid step token worker",
        effect_queued="actor job pid token worker",
        effect_claimed="actor job pid token worker",
        effect_sent="actor job pid token worker",
        effect_state="actor job pid token worker",
        billed="actor job pid step token worker"),
    "lease-kept": reads(
        submitted="actor job lease_until pid worker",
        claimed="actor continued job lease_until pid step token worker",
        state="actor from heartbeat job lease_until pid to token took_lease worker",
        memo="actor job op pid worker",
        effect_queued="actor job lease_until pid worker",
        effect_claimed="actor dead_at job kind lease_until pid row sent_at worker",
        effect_sent="actor lease_until pid worker",
        effect_state="actor lease_until pid worker",
        billed="actor job pid worker"),
}
