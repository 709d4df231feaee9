"""Outbox invariants: an effect is resent only when its last outcome was ambiguous, it is
applied once at the receiver, and every delivered job's effects arrive (or are dead-lettered).

An effect is identified by (job, kind): the engine keeps one outbox row per pair. Receiver
requests are read from the receiver's ledger (attributed by headers or body, else by the
idempotency key of an effect_queued operation), rows from the engine's effect operations,
kills from the supervisor's process records.
"""
from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from typing import Any

from chaos.history import Event
from chaos.engines.schema import reads
from chaos.checkers.index import readings
from chaos.checkers.effects import Effect, OutboxIndex
from chaos.checkers.shared_keys import judge_shared_keys
from chaos.checkers.ops import TOL, capable, is_job, machine_slack
from chaos.checkers.verdict import Verdict

CLEAN_OUTCOMES = frozenset({"applied", "replayed"})  # answers a sender saw and can trust
#: the receiver held the answer past the timeout, or never gave one
LATE_FAULTS = frozenset({"timeout", "drop", "lost"})


def _at(t: float, idx: OutboxIndex) -> str:
    return f"+{t - idx.t0:.3f} s"


def _clean(request: Event, idx: OutboxIndex, settings: dict[str, Any]) -> bool:
    """True when the sender saw a 2xx answer it can trust.

    Not when the receiver dropped the connection or answered after the sender gave up: a
    delayed request that finds its key applied meanwhile is ledgered as a plain "replayed"
    200, so lateness is read from the fault the receiver injected, from send_timeout, and
    from the sender having sent its next request before this one's answer was written.
    """
    status = request.get("status")
    if status is None or not 200 <= status <= 299 or request.get("outcome") not in CLEAN_OUTCOMES:
        return False
    if request.get("fault") in LATE_FAULTS:
        return False
    took = request["t_end"] - request["t_start"]
    if settings.get("send_timeout") is not None and took >= settings["send_timeout"] - TOL:
        return False
    starts = idx.sends.get(request.get("worker"), [])
    later = bisect.bisect_right(starts, request["t_start"])
    return later == len(starts) or starts[later] >= request["t_end"]


def _is_claim(row_event: Event) -> bool:
    """A sender's claim of an outbox row."""
    return row_event["type"] == "effect_claimed" and row_event.get("dead_at") is None


# -- outbox-bounded ----------------------------------------------------------------------

def _ambiguity(request: Event, rows: list[Event], idx: OutboxIndex,
               settings: dict[str, Any], slack: float = 0.0) -> str | None:
    """Why the sender of `request` could not know the effect went through, or None.

    "answer": not a clean 2xx (error status, dropped connection, answered after the
    sender's timeout), or one the sender recorded as failed that came within the machine's
    slack of its deadline (`_failed_late`); "sender-killed": a clean answer, but the sender was SIGKILLed before
    marking the row sent (and before sending anything else); "lease-taken": a clean
    answer, unmarked, and another sender claimed the row after this sender's lease ran out;
    "lease-lapsed": sent only after the sender's own lease had run out, or answered cleanly
    but its lease ran out before the sender's next write to the row (paused or slow between
    its send and its mark, it could not mark the row any more).
    """
    if not _clean(request, idx, settings):
        return "answer"
    sender, start = request.get("worker"), request["t_start"]
    if _failed_late(request, rows, settings, slack):
        return "answer"
    # Marked sent by the same claim: before the sender's next claim of the row.
    again = min((e["t"] for e in rows if _is_claim(e) and e.get("worker") == sender
                 and e["t"] > start + TOL), default=float("inf"))
    if any(e.get("worker") == sender and e.get("sent_at") is not None
           and start - TOL <= e["t"] < again for e in rows):
        return None
    if _killed_before_next_send(sender, start, idx):
        return "sender-killed"
    if _lease_taken(sender, start, rows, settings):
        return "lease-taken"
    if _sent_after_lease(sender, start, rows, settings) or \
            _lapsed_before_mark(sender, start, rows, settings):
        return "lease-lapsed"
    return None


def _failed_late(request: Event, rows: list[Event], settings: dict[str, Any],
                 slack: float) -> bool:
    """The sender recorded the send as failed, and the receiver's answer came so near the
    sender's deadline (its claim plus send_timeout) that the machine's slack may have put it
    past it: the sender may not have had it in time (the receiver's clock says only when
    the answer was written, not when a loaded machine let the sender read it)."""
    timeout, sender = settings.get("send_timeout"), request.get("worker")
    if timeout is None:
        return False
    own = _claims_before(sender, request["t_start"], rows)
    nxt = next((e for e in rows if e.get("worker") == sender and e["t"] > request["t_start"]),
               None)
    failed = nxt is not None and nxt["type"] == "effect_state" and nxt.get("sent_at") is None
    return bool(own) and failed and request["t_end"] > own[-1]["t"] + timeout - slack


def _killed_before_next_send(sender: str | None, start: float, idx: OutboxIndex) -> bool:
    pid = idx.pids.get(sender)
    if pid is None or pid not in idx.kills:
        return False
    starts = idx.sends.get(sender, [])
    later = bisect.bisect_right(starts, start)
    until = starts[later] if later < len(starts) else float("inf")
    return any(start - TOL <= t < until for t in idx.kills[pid])


def _lease_taken(sender: str | None, start: float, rows: list[Event],
                 settings: dict[str, Any]) -> bool:
    own = _claims_before(sender, start, rows)
    taken = [e for e in rows if _is_claim(e) and e.get("worker") != sender
             and e["t"] >= start - TOL]
    if not own or not taken:
        return False
    # A takeover excuses the resend only once the first lease ran out; when the history does
    # not say when that was, it is given the benefit.
    until = _lease_end(own[-1], rows, settings)
    return until is None or taken[0]["t"] >= until - TOL


def _sent_after_lease(sender: str | None, start: float, rows: list[Event],
                      settings: dict[str, Any]) -> bool:
    """The sender's lease on the row had run out before it sent (it was paused or slow
    between its claim and the send): another sender was entitled to the row by then, so
    this request is the lapse's, not a resend of a clean answer. No check before sending
    closes that window, since a pause can fall between the check and the send."""
    own = _claims_before(sender, start, rows)
    if not own:
        return False
    until = _lease_end(own[-1], rows, settings)
    return until is not None and start >= until - TOL


def _lapsed_before_mark(sender: str | None, start: float, rows: list[Event],
                        settings: dict[str, Any]) -> bool:
    """The sender's lease on the row ran out between its send and its next write to the row
    (its mark, refused as too late, or a release)."""
    own = _claims_before(sender, start, rows)
    nxt = next((e for e in rows if e.get("worker") == sender and e["t"] > start + TOL), None)
    if not own or nxt is None:
        return False
    until = _lease_end(own[-1], rows, settings)
    return until is not None and nxt["t"] > until + TOL


def _claims_before(sender: str | None, t: float, rows: list[Event]) -> list[Event]:
    """`sender`'s claims of the row up to `t`, oldest first."""
    return [e for e in rows if _is_claim(e) and e.get("worker") == sender and e["t"] <= t + TOL]


def _lease_end(claim: Event, rows: list[Event], settings: dict[str, Any]) -> float | None:
    """When a sender's claim of a row ran out: its lease_until (else claim time plus the
    outbox_lease setting), or earlier where the harness cut it short (the lease_expiry
    fault); None when the history does not say."""
    until = claim.get("lease_until")
    if until is None and settings.get("outbox_lease") is not None:
        until = claim["t"] + settings["outbox_lease"]
    cuts = [e["t"] for e in rows if e.get("actor") == "harness" and e["t"] >= claim["t"]
            and e.get("lease_until") is not None and e["lease_until"] <= e["t"] + TOL]
    if cuts and (until is None or min(cuts) < until):
        until = min(cuts)
    return until


def _taken_back(effect: Effect, requests: list[Event], causes: list[str | None],
                cuts: list[Event]) -> list[str | None]:
    """`causes`, with "power-cut" for a clean request whose sent mark a power cut took back
    (the cut's `lost_sent` names the effect, and it fell before the effect's next request):
    the store then says the effect was never sent, and sending it again is the engine's
    duty."""
    marks = [c["t"] for c in cuts if list(effect) in (c.get("lost_sent") or [])]
    out = list(causes)
    for i, request in enumerate(requests):
        until = requests[i + 1]["t_start"] if i + 1 < len(requests) else float("inf")
        if out[i] is None and any(request["t_start"] <= t <= until for t in marks):
            out[i] = "power-cut"
    return out


def _describe(request: Event, cause: str | None, idx: OutboxIndex) -> str:
    answer = f"{request.get('status')} {request.get('outcome')}"
    note = {"answer": "ambiguous answer", "sender-killed": "sender killed before marking it",
            "lease-taken": "sender's lease taken before marking it",
            "lease-lapsed": "sent after the sender's lease ran out",
            "power-cut": "its sent mark taken back by a power cut"}.get(cause, "clean")
    return f"#{request.get('n')} at {_at(request['t_start'], idx)} by {request.get('worker')}: " \
           f"{answer} ({note})"


def check_outbox_bounded(history: list[Event], snapshot: dict[str, Any]) -> Verdict:
    """Per (job, kind): receiver requests <= 1 + ambiguous outcomes, and at most one applied."""
    verdict = Verdict("outbox-bounded")
    if not capable(snapshot, "outbox"):
        return _applied_once_without_rows(verdict, history, snapshot)
    idx = readings(history).outbox
    rows = snapshot["outbox"]
    if not idx.requests and (any(r.get("sent_at") is not None for r in rows)
                             or snapshot["receiver_applied"]):
        return verdict.unknown("outbox rows were sent but the history has no receiver request "
                               "(receiver ledger missing)")
    settings = snapshot["settings"]
    slack = machine_slack(snapshot.get("clock"))
    applied_elsewhere = Counter((a["job"], a["kind"]) for a in snapshot["receiver_applied"])
    cuts = [e for e in history if e.get("src") == "nemesis" and e.get("type") == "power_loss"]
    effects = sorted(set(idx.requests) | {(r["job"], r["kind"]) for r in rows},
                     key=lambda e: (str(e[0]), str(e[1])))
    histogram: dict[str, Counter] = defaultdict(Counter)
    ambiguous: Counter = Counter()
    for effect in effects:
        requests = idx.requests.get(effect, [])
        histogram[effect[1]][len(requests)] += 1
        causes = _taken_back(effect, requests, [
            _ambiguity(r, idx.rows.get(effect, []), idx, settings, slack) for r in requests],
            cuts)
        ambiguous.update(c for c in causes if c)
        _judge_attempts(verdict, effect, requests, causes, idx)
        _judge_applied(verdict, effect, requests, applied_elsewhere.get(effect, 0), idx)
    verdict.checked = len(effects)
    verdict.metrics = {
        "effects": len(effects),
        "requests": sum(len(r) for r in idx.requests.values()),
        "duplicates": {kind: dict(sorted(c.items())) for kind, c in sorted(histogram.items())},
        "replays": sum(r.get("outcome") == "replayed" for rs in idx.requests.values() for r in rs),
        "ambiguous": dict(sorted(ambiguous.items())),
        "unattributed_requests": idx.unattributed,
    }
    return verdict


def _applied_once_without_rows(verdict: Verdict, history: list[Event],
                               snapshot: dict[str, Any]) -> Verdict:
    """An engine with no outbox still owes the receiver each effect at most once: judged
    per (job, kind) from the receiver alone. Its requests are not bounded: with no rows,
    what was ambiguous to the sender cannot be told."""
    why = _without_receiver(snapshot)
    if why:
        return verdict.unknown(why)
    idx = readings(history).outbox
    applied_elsewhere = Counter((a["job"], a["kind"]) for a in snapshot["receiver_applied"])
    effects = sorted(set(idx.requests) | set(applied_elsewhere),
                     key=lambda e: (str(e[0]), str(e[1])))
    for effect in effects:
        _judge_applied(verdict, effect, idx.requests.get(effect, []),
                       applied_elsewhere.get(effect, 0), idx)
    verdict.checked = len(effects)
    verdict.metrics = {"effects": len(effects),
                       "requests": sum(len(r) for r in idx.requests.values()),
                       "unattributed_requests": idx.unattributed}
    if not effects:
        return verdict.unknown("the engine declares no outbox and the receiver got no effect")
    if verdict.valid:
        verdict.reason = ("the engine declares no outbox: each effect applied at most once "
                          "was judged at the receiver; requests per effect were not bounded "
                          "(no rows to say which outcomes were ambiguous)")
    return verdict


def _without_receiver(snapshot: dict[str, Any]) -> str | None:
    """Why the receiver cannot be the evidence of an engine with no outbox, or None."""
    if not snapshot["pipeline"].get("effects"):
        return "the engine declares no outbox and its pipeline no effect"
    if "receiver" not in snapshot.get("ledgers", ("receiver",)):
        return "the engine declares no outbox and the receiver's ledger is missing"
    return None


def _judge_attempts(verdict: Verdict, effect: Effect, requests: list[Event],
                    causes: list[str | None], idx: OutboxIndex) -> None:
    allowed = 1 + sum(c is not None for c in causes)
    if len(requests) <= allowed:
        return
    job, kind = effect
    listing = "; ".join(_describe(r, c, idx) for r, c in zip(requests[:6], causes))
    verdict.fail("too-many-attempts",
                 f"job {job} {kind!r}: {len(requests)} receiver requests but only "
                 f"{allowed - 1} ambiguous outcome(s), so at most {allowed} allowed: {listing}",
                 *requests[:6])


def _judge_applied(verdict: Verdict, effect: Effect, requests: list[Event], receiver_count: int,
                   idx: OutboxIndex) -> None:
    applied = [r for r in requests if r.get("applied")]
    count = max(len(applied), receiver_count)
    if count <= 1:
        return
    job, kind = effect
    listing = ", ".join(f"{r.get('effect_id')} at {_at(r['t_start'], idx)} under key "
                        f"{r.get('key')!r}" for r in applied[:6])
    verdict.fail("applied-twice",
                 f"job {job} {kind!r} was applied {count} times at the receiver"
                 f"{': ' + listing if listing else ' (by its applied list)'}", *applied[:6])


# -- effects-complete --------------------------------------------------------------------

def check_effects_complete(history: list[Event], snapshot: dict[str, Any]) -> Verdict:
    """Every delivered job's outbox rows were applied at the receiver, or dead-lettered; a
    row is dead-lettered only for a refusal for good or after outbox_max_attempts; and no
    effect is posted under an idempotency key the receiver applied for another effect."""
    verdict = Verdict("effects-complete")
    if not capable(snapshot, "outbox"):
        return _delivered_effects_without_rows(verdict, history, snapshot)
    idx = readings(history).outbox
    pipeline = snapshot["pipeline"]
    final = pipeline["steps"][-1]["done"]
    delivered = sorted(j for j, row in snapshot["jobs"].items() if row["state"] == final)
    rows_by_job: dict[str, list[dict]] = defaultdict(list)
    for row in snapshot["outbox"]:
        rows_by_job[row["job"]].append(row)
    if not idx.requests and not snapshot["receiver_applied"] and any(
            row.get("sent_at") is not None for row in snapshot["outbox"]):
        return verdict.unknown("outbox rows were marked sent but neither the history nor the "
                               "snapshot says what the receiver applied (receiver ledger missing)")
    applied = _applied(snapshot, idx)
    judge_shared_keys(verdict, history, idx)
    # A pipeline that declares no effects has no rows to expect.
    declared = set(pipeline.get("effects") or ())
    expects_rows = bool(declared) or bool(rows_by_job)
    drained = snapshot.get("phases", {}).get("drained", True)
    note = "" if drained else " (the drain did not finish before its deadline)"
    last_job_event = _last_job_events(history)
    dead = 0
    for job in delivered:
        kinds = {row["kind"] for row in rows_by_job.get(job, [])}
        missing = sorted(declared - kinds)
        if (expects_rows and not kinds) or missing:
            what = f"no {' or '.join(missing)} row" if kinds else "no outbox row"
            verdict.fail("no-outbox-rows", f"job {job} was delivered but has {what}: its "
                         f"effects were never queued{note}", *_some(last_job_event.get(job)))
        if not kinds:
            verdict.checked += 1
            continue
        for row in sorted(rows_by_job[job], key=lambda r: r["kind"]):
            verdict.checked += 1
            effect = (job, row["kind"])
            if row.get("key") in applied["keys"] or effect in applied["effects"]:
                continue
            if row.get("dead_at") is not None:
                dead += 1
                continue
            _judge_missing(verdict, row, idx, note)
    cap = snapshot["settings"].get("outbox_max_attempts")
    early = 0
    for row in snapshot["outbox"]:
        if row.get("dead_at") is not None and cap is not None:
            verdict.checked += 1
            early += _judge_dead_letter(verdict, row, idx, cap)
    verdict.metrics = {"delivered_jobs": len(delivered), "dead_lettered": dead,
                       "dead_lettered_early": early,
                       "applied_effects": len(applied["effects"]), "drained": drained}
    return verdict


def _delivered_effects_without_rows(verdict: Verdict, history: list[Event],
                                    snapshot: dict[str, Any]) -> Verdict:
    """An engine with no outbox: every job in the pipeline's final state has each effect
    kind the pipeline declares applied at the receiver (a job cannot be done while the
    effect it exists for was lost). There is no dead letter to excuse one."""
    why = _without_receiver(snapshot)
    if why:
        return verdict.unknown(why)
    pipeline = snapshot["pipeline"]
    final = pipeline["steps"][-1]["done"]
    delivered = sorted(j for j, row in snapshot["jobs"].items() if row["state"] == final)
    idx = readings(history).outbox
    applied = _applied(snapshot, idx)["effects"]
    last_job_event = _last_job_events(history)
    for job in delivered:
        for kind in pipeline["effects"]:
            verdict.checked += 1
            if (job, kind) in applied:
                continue
            requests = idx.requests.get((job, kind), [])
            tried = "; ".join(f"{r.get('status')} {r.get('outcome')} at "
                              f"{_at(r['t_start'], idx)}" for r in requests[:4]) or "none"
            verdict.fail("effect-not-applied", f"job {job} reached {final!r} but the receiver "
                         f"never applied its {kind!r} effect (requests: {tried})",
                         *(requests[:4] or _some(last_job_event.get(job))))
    verdict.metrics = {"delivered_jobs": len(delivered), "applied_effects": len(applied)}
    if not delivered:
        return verdict.unknown(f"no job reached {final!r}: no effect was owed")
    return verdict


#: Answers that say "try again": no answer at all (timeout, dropped, lost), 408, 429, 5xx.
def _retryable(request: Event | None) -> bool:
    status = None if request is None else request.get("status")
    return status is None or status in (408, 429) or status >= 500


def _judge_dead_letter(verdict: Verdict, row: dict, idx: OutboxIndex, cap: int) -> int:
    """A row is dead-lettered only when its last answer refused it for good (a 4xx other
    than 408 and 429) or after outbox_max_attempts attempts; 1 if this one was early."""
    effect = (row["job"], row["kind"])
    requests = idx.requests.get(effect, [])
    claims = sum(_is_claim(e) for e in idx.rows.get(effect, []))
    attempts = row.get("attempts") if row.get("attempts") is not None else claims
    last = requests[-1] if requests else None
    if attempts >= cap or (requests and not _retryable(last)):
        return 0
    answer = "no request was ever made" if last is None else (
        f"its last answer was {last.get('status')} {last.get('outcome')}")
    verdict.fail("dead-lettered-early", f"job {row['job']} {row['kind']!r}: dead-lettered "
                 f"after {attempts} attempt(s) of {cap} (outbox_max_attempts), though "
                 f"{answer}, which says try again", *(requests[-1:] or idx.rows.get(effect, [])[-1:]))
    return 1


def _applied(snapshot: dict[str, Any], idx: OutboxIndex) -> dict[str, set]:
    """Keys and (job, kind) pairs the receiver applied: its applied list and its ledger."""
    keys, effects = set(), set()
    for a in snapshot["receiver_applied"]:
        keys.add(a.get("key"))
        effects.add((a.get("job"), a.get("kind")))
    for effect, requests in idx.requests.items():
        for r in requests:
            if r.get("applied"):
                keys.add(r.get("key"))
                effects.add(effect)
    keys.discard(None)
    return {"keys": keys, "effects": effects}


def _judge_missing(verdict: Verdict, row: dict, idx: OutboxIndex, note: str) -> None:
    job, kind = row["job"], row["kind"]
    events = idx.rows.get((job, kind), [])
    requests = idx.requests.get((job, kind), [])
    tried = "; ".join(f"{r.get('status')} {r.get('outcome')} at {_at(r['t_start'], idx)}"
                      for r in requests[:4]) or "none"
    if row.get("sent_at") is not None:
        mark = next((e for e in events if e.get("sent_at") is not None), None)
        by = f" by {mark.get('worker')} at {_at(mark['t'], idx)}" if mark else ""
        verdict.fail("marked-sent-not-applied",
                     f"job {job} {kind!r}: outbox row {row.get('row')} was marked sent{by}, "
                     f"but the receiver never applied key {row.get('key')!r} (requests: "
                     f"{tried}){note}", *_some(mark), *requests[:4])
        return
    verdict.fail("not-applied",
                 f"job {job} {kind!r}: outbox row {row.get('row')} of a delivered job is "
                 f"neither applied nor dead-lettered (attempts {row.get('attempts')}, last "
                 f"error {row.get('last_error')!r}; requests: {tried}){note}",
                 *events[-2:], *requests[:4])


def _last_job_events(history: list[Event]) -> dict[str, Event]:
    last: dict[str, Event] = {}
    for e in history:
        if is_job(e):
            last[e["job"]] = e
    return last


def _some(event: Event | None) -> tuple[Event, ...]:
    return () if event is None else (event,)


CHECKS = {"outbox-bounded": check_outbox_bounded, "effects-complete": check_effects_complete}

#: the engine fields each check reads (chaos.engines.schema): an evidence field an engine leaves out
#: makes exactly these checks unknown, naming it
READS = {
    "effects-complete": reads(
        submitted="job pid worker",
        claimed="job pid worker",
        state="job pid worker",
        memo="pid worker",
        effect_queued="job key kind pid worker",
        effect_claimed="dead_at job kind pid worker",
        effect_sent="job kind pid worker",
        effect_state="job kind pid worker",
        billed="pid worker"),
    "outbox-bounded": reads(
        submitted="pid worker",
        claimed="pid worker",
        state="pid worker",
        memo="pid worker",
        effect_queued="actor job key kind pid worker",
        effect_claimed="actor dead_at job kind lease_until pid sent_at worker",
        effect_sent="actor job kind pid sent_at worker",
        effect_state="actor job kind lease_until pid sent_at worker",
        billed="pid worker"),
}
