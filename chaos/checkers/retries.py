"""retry-discipline: poison is called once, then parked; a job is parked as poison only after
the provider refused its step, and for its attempts only at the cap; failed attempts stay
within the cap; Retry-After is honoured; retries keep their backoff (chaos.checkers.jitter),
are jittered and not synchronized after an outage; a send refused for good is dead-lettered,
not retried."""
from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from typing import Any

from chaos.history import Event
from chaos.engines.schema import reads
from chaos.checkers.index import readings
from chaos.checkers.ops import TOL, is_operator, is_worker
from chaos.checkers.timeline import Timeline, counts_every_claim, unknown_without_audit
from chaos.checkers.waits import SYNC_MIN_RETRIES, backoff, check_outbox_waits, check_waits
from chaos.checkers.verdict import Verdict


POISON_OUTCOMES = frozenset({"bad_content", "schema", "garbage"})


SYNC_SPAN = 0.020      # retries starting within this span are "at once"


# Full jitter over less than ~10 spans puts half the retries in one span by chance alone.
SYNC_MIN_BASE = 10 * SYNC_SPAN


def check_retry_discipline(history: list[Event], snapshot: dict[str, Any]) -> Verdict:
    """Poison parks at once, retries stay within the cap, waits honour Retry-After and full
    jitter, and retries after an outage are spread."""
    verdict = Verdict("retry-discipline")
    plan = snapshot["plan"]
    has_calls = any(e.get("src") == "provider" and e.get("type") == "call" for e in history)
    # No call at all is evidence only when the harness kept the provider's ledger.
    if not has_calls and "provider" not in snapshot.get("ledgers", ()) and (
            snapshot.get("spend") or plan.get("poison")):
        return verdict.unknown("the engine recorded provider spend (or the plan poisons jobs) "
                               "but the history has no provider call (provider ledger missing)")
    if unknown_without_audit(verdict, history, snapshot):
        return verdict
    tl = readings(history).timeline(snapshot["pipeline"])
    settings = snapshot["settings"]
    _check_poison(verdict, tl)
    _check_poison_in_hand(verdict, tl, settings)
    parks = _check_give_up(verdict, tl, settings)
    _check_caps(verdict, tl, settings)
    waits = check_waits(verdict, tl, settings)
    waits["outbox"] = check_outbox_waits(verdict, readings(history).outbox, settings)
    outages = [_check_outage(verdict, tl, settings, snapshot, window) for window in tl.outages]
    jobs = snapshot["jobs"]
    poisoned = plan.get("poison", {})
    calls = sum(len(v) for v in tl.calls.values())
    verdict.checked = calls + parks + waits["retry_writes"] + waits["outbox"]["retry_writes"]
    verdict.metrics = {
        "calls": calls,
        "poison_calls": sum(_is_poison(c) for v in tl.calls.values() for _, _, c, _ in v),
        "poison_planned": len(poisoned),
        "poison_parked": sum(jobs.get(j, {}).get("state") in snapshot["pipeline"]["parked"]
                             for j in poisoned),
        "max_calls_per_step": max((len(v) for v in tl.calls.values()), default=0),
        **waits, "outages": outages,
    }
    retryable = sum(_is_retryable(c) for v in tl.calls.values() for _, _, c, _ in v)
    repeated = sum(len(v) > 1 for v in tl.calls.values())
    if verdict.valid is True and retryable and not waits["retry_writes"] and not repeated:
        verdict.unknown(f"0 retries observed while {retryable} retryable failures (429, 5xx, "
                        "hang, reset) were answered: the engine's retry writes were not "
                        "recognised, so waits and caps went unjudged")
    return verdict


def _is_retryable(call: Event) -> bool:
    status = call.get("status")
    return call.get("outcome") in ("hang", "reset") or status == 429 or (
        status is not None and status >= 500)


def _is_poison(call: Event) -> bool:
    status = call.get("status")
    return call.get("outcome") in POISON_OUTCOMES or (
        status is not None and 400 <= status <= 499 and status != 429)


def _check_poison(verdict: Verdict, tl: Timeline) -> None:
    """After a worker observed poison and committed the failure, no later claim calls again."""
    # Observed: answered definitely (the ledger's completion "fail", as _check_poison_in_hand
    # reads it). A poison answer the fake finished after its caller had hung up ("info": on
    # a loaded machine, after the caller's timeout) was never seen, and retrying is right.
    observed = [(pos, c, h) for entries in tl.calls.values() for pos, _, c, h in entries
                if _is_poison(c) and c.get("completion", "fail") == "fail"]
    observed += [(pos, s, holding) for pos, s, holding in tl.spends
                 if s.get("outcome") == "poison"]
    judged = set()
    for pos, event, holding in sorted(observed, key=lambda o: o[0]):
        if holding is None or holding.write is None or \
                holding.write["t"] + TOL < event.get("t_start", event["t"]):
            continue  # the worker died or was fenced out: the engine never knew
        write, step = holding.write, holding.step
        key = (holding.job, step["name"], holding.segment)
        if write["to"] == step["done"] or key in judged:
            continue
        judged.add(key)
        later = next((c for _, seg, c, h in tl.calls.get((holding.job, step["name"]), [])
                      if seg == holding.segment and (h.start_pos > holding.write_pos if h
                                                     else c["t_start"] > write["t"] + TOL)),
                     None)
        if later is None:
            continue
        parked = write["to"] == step["parked"]
        verdict.fail(
            "call-after-poison-parked" if parked else "poison-retried",
            f"job {holding.job}: step {step['name']!r} got a poison answer "
            f"({event.get('status')} {event.get('outcome')}) for {holding.worker}, which "
            f"{'parked the job' if parked else 'scheduled a retry'} at {tl.at(write['t'])}; "
            f"{later.get('worker')} called the provider again at {tl.at(later['t_start'])}",
            event, write, later)


def _check_poison_in_hand(verdict: Verdict, tl: Timeline, settings: dict) -> None:
    """Within one holding, no call follows a poison answer the worker received: an engine
    that retries in memory, writing nothing between its attempts, still calls once.

    Received: the fake answered the poison definitely (`completion` "fail", or a ledger too
    old to say) within the call timeout, so the caller had it before it could have given
    the call up as a timeout."""
    timeout = settings.get("call_timeout")
    for holds in tl.holdings.values():
        for h in holds:
            for i, (_, c) in enumerate(h.calls):
                if not _is_poison(c) or c.get("completion", "fail") != "fail" or (
                        timeout is not None and c["t_end"] - c["t_start"] > timeout - TOL):
                    continue
                # Before the holding's own write: a call after it is _check_poison's.
                until = h.write["t"] + TOL if h.write is not None else math.inf
                later = next((d for _, d in h.calls[i + 1:]
                              if c["t_end"] < d["t_start"] <= until), None)
                if later is not None:
                    verdict.fail(
                        "poison-retried", f"job {h.job}: step {h.step['name']!r} got a poison "
                        f"answer ({c.get('status')} {c.get('outcome')}) at {tl.at(c['t_end'])} "
                        f"for {h.worker}, which called the provider again at "
                        f"{tl.at(later['t_start'])} under the same claim, writing nothing "
                        "between", h.start, c, later)
                    break


def _check_give_up(verdict: Verdict, tl: Timeline, settings: dict) -> int:
    """A job is parked only when the engine's rules say so, and the provider's ledger shows
    why: as poison after a poison answer (a 4xx other than 429, garbage, unusable content),
    never after one worth retrying (429, 5xx, a timeout, a dropped connection), nor with no
    refusal at all; for its attempts only once it has failed max_attempts of them, each a
    call the provider received. Where max_claims counts every claim, one counter bounds the
    attempts too: a park for its attempts is also due once the step's claims since the job
    entered it reached max_claims, whatever mix of failures and crashes made them (without
    max_attempts, only then). Returns how many parks it judged."""
    claim_cap = settings.get("max_claims") if counts_every_claim(settings) else None
    cap = settings.get("max_attempts") if settings.get("max_attempts") is not None else claim_cap
    cap_name = "max_attempts" if settings.get("max_attempts") is not None else "max_claims"
    judged = 0
    for holds in tl.holdings.values():
        for h in holds:
            w = h.write
            if w is None or w["to"] != h.step["parked"] or not is_worker(w):
                continue
            judged += 1
            before = [c for _, c in h.calls if c["t_start"] <= w["t"] + TOL]
            call = before[-1] if before else None
            # Every call of this step since the job's last operator move, whichever holding
            # made it: a park's evidence need not lie in the holding that wrote it.
            received = [c for _, seg, c, _ in tl.calls.get((h.job, h.step["name"]), [])
                        if seg == h.segment and c["t_start"] <= w["t"] + TOL]
            where = f"job {h.job}: {h.worker} parked step {h.step['name']!r}"
            if claim_cap is not None and w.get("cause") == "attempts":
                if h.claims >= claim_cap:
                    continue  # the shared cap reached: due, whatever its attempts say
                where += f" with {h.claims} of max_claims={claim_cap} claims"
            if w.get("cause") == "poison" and call is not None and _is_retryable(call):
                verdict.fail("retryable-parked-as-poison",
                             f"{where} as poison at {tl.at(w['t'])} after a "
                             f"{call.get('status')} {call.get('outcome')} answer, which is "
                             "worth retrying", call, w)
            elif w.get("cause") == "poison" and not any(_is_poison(c) for c in received):
                verdict.fail("parked-without-refusal",
                             f"{where} as poison at {tl.at(w['t'])}, but the provider refused "
                             f"none of the step's {len(received)} call(s) (no 4xx, garbage or "
                             f"unusable answer); last error {w.get('last_error')!r}",
                             w, *received[-1:])
            elif (w.get("cause") == "attempts" and cap is not None
                  and w.get("attempts") is not None and w["attempts"] < cap):
                verdict.fail("parked-before-cap",
                             f"{where} for its attempts at {tl.at(w['t'])} after "
                             f"{w['attempts']} failed attempt(s), fewer than {cap_name}={cap}",
                             w)
            # a step that calls no model (a delivery) makes its attempts elsewhere: the
            # provider's ledger is no evidence of how many it made
            elif (w.get("cause") == "attempts" and cap is not None and h.step.get("model", True)
                  and len(received) < cap):
                verdict.fail("parked-before-cap",
                             f"{where} for its attempts at {tl.at(w['t'])}, but the provider "
                             f"received only {len(received)} call(s) of the step, fewer than "
                             f"{cap_name}={cap}; last error {w.get('last_error')!r}",
                             w, *received[-1:])
    return judged


def _check_caps(verdict: Verdict, tl: Timeline, settings: dict) -> None:
    """attempts <= max_attempts; calls per run of a step <= max_attempts + unwritten holdings.
    Where max_claims counts every claim, it bounds the attempts as well (the lower cap)."""
    caps = {"max_attempts": settings.get("max_attempts"),
            "max_claims": settings.get("max_claims") if counts_every_claim(settings) else None}
    if all(c is None for c in caps.values()):
        return
    name, cap = min(((n, c) for n, c in caps.items() if c is not None), key=lambda nc: nc[1])
    for job, events in tl.job_events.items():
        over = next((e for _, e in events if (e.get("attempts") or 0) > cap
                     and not is_operator(e)), None)
        if over is not None:
            verdict.fail("attempts-over-cap",
                         f"job {job}: {over.get('worker')} recorded attempt {over['attempts']} of "
                         f"state {over['from']!r} at {tl.at(over['t'])}, past {name}={cap}",
                         over)
    unwritten = Counter((h.job, h.step["name"], h.segment)
                        for holds in tl.holdings.values() for h in holds if h.write is None)
    for (job, step), entries in tl.calls.items():
        by_segment: dict[int, list[Event]] = defaultdict(list)
        for _, seg, call, _ in entries:
            by_segment[seg].append(call)
        for seg, calls in by_segment.items():
            allowed = cap + unwritten[(job, step, seg)]
            if len(calls) > allowed:
                verdict.fail("calls-over-cap",
                             f"job {job}: {len(calls)} provider calls for step {step!r}, but "
                             f"{name}={cap} plus {allowed - cap} claim(s) that ended "
                             f"without a write allow {allowed}; call {allowed + 1} by "
                             f"{calls[allowed].get('worker')} at "
                             f"{tl.at(calls[allowed]['t_start'])}", calls[0], calls[allowed])


def _check_outage(verdict: Verdict, tl: Timeline, settings: dict, snapshot: dict,
                  window: list[Event | None]) -> dict:
    """The first calls after an outage, of the (job, step)s that failed in it, are spread."""
    start, end = window
    t_end = end["t"] if end else snapshot.get("phases", {}).get("heal_start") or math.inf
    retries = []
    for entries in tl.calls.values():
        calls = [c for _, _, c, _ in entries]
        if not any(start["t"] <= c["t_start"] <= t_end and c.get("outcome") != "ok"
                   for c in calls):
            continue
        i = next((i for i, c in enumerate(calls) if c["t_start"] >= t_end), None)
        if i is not None and i > 0:
            retries.append((calls[i], calls[i]["t_start"] - calls[i - 1]["t_end"]))
    report = {"start": tl.at(start["t"]), "retries": len(retries),
              "judged": (backoff(settings, 1) or (0.0, 0.0))[1] >= SYNC_MIN_BASE}
    if not retries:
        return report
    delays = [d for _, d in retries]
    starts = sorted(c["t_start"] for c, _ in retries)
    at_once, j = 0, 0
    for i, t in enumerate(starts):
        while t - starts[j] > SYNC_SPAN:
            j += 1
        at_once = max(at_once, i - j + 1)
    report.update(delay_min=round(min(delays), 4), delay_max=round(max(delays), 4),
                  delay_stdev=round(statistics.pstdev(delays), 4), max_in_20ms=at_once)
    if len(retries) < SYNC_MIN_RETRIES or not report["judged"]:
        return report
    identical = max(delays) - min(delays) <= TOL
    if at_once * 2 > len(retries) or identical:
        why = (f"{at_once} of {len(retries)} start within {SYNC_SPAN * 1000:.0f} ms"
               if at_once * 2 > len(retries) else f"all wait {min(delays):.3f} s (no jitter)")
        clustered = sorted(retries, key=lambda r: r[0]["t_start"])[:8]
        verdict.fail("synchronized-retries",
                     f"after the provider outage {tl.at(start['t'])}..{tl.at(t_end)}, the first "
                     f"retries of {len(retries)} failed steps are synchronized: {why}",
                     *[e for e in (start, end) if e], *[c for c, _ in clustered])
    return report


CHECKS = {"retry-discipline": check_retry_discipline}

#: the engine fields the check reads (chaos.engines.schema): an evidence field an engine leaves out
#: makes exactly this check unknown, naming it
READS = {
    "retry-discipline": reads(
        submitted="actor attempts job pid worker",
        claimed="actor attempts job pid step token worker",
        state="actor attempts cause heartbeat job next_run_at pid to worker",
        memo="pid worker",
        effect_queued="job key kind pid worker",
        effect_claimed="job kind pid worker",
        effect_sent="job kind pid worker",
        effect_state="actor attempts dead_at job kind last_error next_run_at pid sent_at worker",
        billed="job outcome pid worker"),
}
