"""retry-discipline's waits (chaos.checkers.retries): each retry's wait within the backoff's full-jitter bounds, and the
waits spread over their ranges as full jitter claims (a Dvoretzky-Kiefer-Wolfowitz band), for
a job's steps and for a sender's failed sends."""
from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict

from chaos.history import Event
from chaos.checkers.ops import TOL
from chaos.checkers.timeline import Holding, Timeline
from chaos.checkers.verdict import Verdict


#: The jitter spread test (see `spread_test`) fails a run that holds the engine's claim with
#: probability at most this (the Dvoretzky-Kiefer-Wolfowitz bound, exact for every n).
JITTER_ALPHA = 1e-6


#: Fewer waits judge no spread: their band is the whole range, so nothing could leave it. From
#: this count on the test can fail, if only waits as far off as all of them at one end (a
#: sender that retries at once, every wait 0): 8 at 1e-6. A higher floor (it was 20) let 18
#: failed sends, each retried at once, pass unjudged.
JITTER_MIN_WAITS = math.floor(math.log(2 / JITTER_ALPHA) / 2) + 1


def check_waits(verdict: Verdict, tl: Timeline, settings: dict) -> dict:
    """Retry-After honoured, backoff within full-jitter bounds, jitter present."""
    # The shortest call timeout any worker ran with bounds when a hung call was given up.
    timeout = min([t for t in (settings.get("call_timeout"), *tl.call_timeouts)
                   if t is not None], default=None)
    stats = Counter()
    samples: dict[int, list[tuple[float, Event]]] = defaultdict(list)
    spread: list[tuple[tuple[float, float], float, float, Event]] = []
    for holds in tl.holdings.values():
        for h in holds:
            w = h.write
            if w is None or w["to"] != h.step["ready"] or w.get("next_run_at") is None:
                continue
            stats["retry_writes"] += 1
            if tl.is_skewed(h.worker):
                stats["skipped_skewed"] += 1  # its next_run_at is on another clock
                continue
            before = [(p, c) for p, c in h.calls if c["t_start"] <= w["t"] + TOL]
            call_pos, call = before[-1] if before else (None, None)
            retry_after = call.get("retry_after") if call else None
            # An HTTP date asks for the wait up to it, up to a second more than its seconds.
            asked = (max(retry_after, call["retry_at"] - call["t_end"])
                     if retry_after is not None and call.get("retry_at") is not None
                     else retry_after)
            # An answer that came after the client could have given up (a loaded fake that
            # took the request late) may never have reached it: its Retry-After is not judged.
            unseen = (retry_after is not None and timeout is not None and call["t_end"]
                      > min(call["t_start"], h.start["t"]) + timeout - TOL)
            stats["retry_after_unseen"] += unseen
            if retry_after is not None and not unseen and call.get("status") in (429, 503):
                stats["retry_after_checked"] += 1
                if _retry_after_ignored(verdict, tl, h, call_pos, call, retry_after):
                    continue
            bounds = backoff(settings, w.get("attempts") or 1)
            if bounds is None:
                stats["skipped_undeclared"] += 1  # the engine declares no backoff bounds
                continue
            low, ceiling = bounds
            _check_backoff(verdict, tl, h, call, low, max(ceiling, asked or 0.0), timeout)
            if retry_after is None:
                samples[w.get("attempts") or 0].append((w["next_run_at"] - w["t"], w))
                if ceiling - low > TOL:
                    spread.append((_wait_range(h, call, timeout), low, ceiling, w))
    for attempts, got in sorted(samples.items()):
        low, ceiling = backoff(settings, attempts)
        delays = [d for d, _ in got]
        # Equal waits, or all of them at the very top of the range: jitter over [low, high]
        # puts each wait in its top tenth with probability 0.1, all n of them with 0.1^n.
        equal = max(delays) - min(delays) <= max(0.001, 0.01 * ceiling)
        at_top = min(delays) >= low + 0.9 * (ceiling - low)
        if len(got) >= SYNC_MIN_RETRIES and (equal or at_top):
            verdict.fail("no-jitter",
                         f"{len(got)} retries after failed attempt {attempts} all wait "
                         f"{statistics.mean(delays):.3f} s (spread {max(delays) - min(delays):.4f}"
                         f" s): jitter would spread them over [{low:.3f}, {ceiling:.3f}] s",
                         *[w for _, w in got[:4]])
    return {"retry_writes": stats["retry_writes"], "skipped_skewed": stats["skipped_skewed"],
            "retry_after_checked": stats["retry_after_checked"],
            "retry_after_unseen": stats["retry_after_unseen"],
            "skipped_undeclared": stats["skipped_undeclared"],
            "jitter_spread": _check_spread(verdict, spread)}


def _wait_range(h: "Holding", call: Event | None, timeout: float | None) -> tuple[float, float]:
    """The wait the engine chose lies between these two: it read its clock between the
    failing answer (or the claim) and the audit write (see _check_backoff)."""
    w = h.write
    since = answered(call, timeout, h.start["t"]) if call else h.start["t"]
    return w["next_run_at"] - w["t"], w["next_run_at"] - since


def spread_test(ranges: list[tuple[float, float]], alpha: float = JITTER_ALPHA
                ) -> tuple[float, float, float]:
    """Whether waits known only within ranges [a, b] of [0, 1] (a wait over its declared
    backoff range) can come from the uniform spread the engine claims. Returns (too_low,
    too_high, band): too_low is how far the empirical CDF of the b's rises above the
    uniform's, too_high how far that of the a's falls below it; a value over `band` rejects
    the claim. The true waits' CDF lies between those two, so a claim that holds is
    rejected with probability at most `alpha`: band = sqrt(ln(2 / alpha) / 2n)
    (Dvoretzky-Kiefer-Wolfowitz, with Massart's constant)."""
    n = len(ranges)
    lows = sorted(min(max(a, 0.0), 1.0) for a, _ in ranges)
    highs = sorted(min(max(b, 0.0), 1.0) for _, b in ranges)
    too_low = max((i + 1) / n - x for i, x in enumerate(highs))
    too_high = max(x - i / n for i, x in enumerate(lows))
    return too_low, too_high, math.sqrt(math.log(2 / alpha) / (2 * n))


def _check_spread(verdict: Verdict, spread: list) -> dict:
    """Full jitter (or the engine's declared [low, high]) spreads waits uniformly over their
    range: every retry wait without a Retry-After, pooled over attempts (each scaled to its
    own range), against the uniform distribution."""
    ranges = [((a - low) / (high - low), (b - low) / (high - low))
              for (a, b), low, high, _ in spread]
    report = {"waits": len(ranges), "alpha": JITTER_ALPHA}
    if len(ranges) < JITTER_MIN_WAITS:
        return report
    too_low, too_high, band = spread_test(ranges)
    report.update(too_low=round(too_low, 4), too_high=round(too_high, 4), band=round(band, 4))
    if max(too_low, too_high) > band:
        how = "short" if too_low > band else "long"
        scaled = sorted((((b + a) / 2, w) for (a, b), (_, _, _, w) in zip(ranges, spread)),
                        key=lambda pair: pair[0])
        verdict.fail("jitter-not-spread",
                     f"{len(ranges)} retry waits are not spread over their backoff ranges, "
                     f"they are too {how}: their distribution is {max(too_low, too_high):.2f} "
                     f"off the uniform one the engine declares (allowed {band:.2f} at a "
                     f"false-alarm rate of {JITTER_ALPHA:g}); the median wait is at "
                     f"{statistics.median(m for m, _ in scaled):.2f} of its range",
                     *[w for _, w in scaled[:2] + scaled[-2:]])
    return report


def check_outbox_waits(verdict: Verdict, idx, settings: dict) -> dict:
    """A failed send is retried after a wait within the sender's declared backoff bounds
    (outbox_backoff_bounds), and those waits are spread as the bounds' jitter says."""
    stats = Counter()
    spread: list = []
    for effect, rows in idx.rows.items():
        requests = idx.requests.get(effect, [])
        for e in rows:
            if not (e["type"] == "effect_state" and e.get("actor") == "sender"
                    and e.get("next_run_at") is not None and e.get("sent_at") is None
                    and e.get("dead_at") is None and e.get("last_error")):
                continue
            stats["retry_writes"] += 1
            # (the sender's next claim and request can follow its write within a millisecond)
            sent = [r for r in requests if r.get("worker") == e.get("worker")
                    and r["t_start"] < e["t"]]
            if sent and _refused_for_good(sent[-1]):
                verdict.fail("refusal-retried",
                             f"job {e['job']} {e['kind']!r}: the receiver refused "
                             f"{e.get('worker')}'s send for good (status "
                             f"{sent[-1].get('status')}), and the sender scheduled a retry "
                             "instead of dead-lettering the row", sent[-1], e)
                continue
            bounds = backoff(settings, e.get("attempts") or 1, "outbox_backoff_bounds")
            if bounds is None:
                stats["skipped_undeclared"] += 1
                continue
            low, high = bounds
            since = _send_ended(e, sent[-1] if sent else None, rows, settings)
            shortest, longest = e["next_run_at"] - e["t"], e["next_run_at"] - since
            if shortest > high + TOL or longest < low - TOL:
                verdict.fail("outbox-backoff-out-of-bounds",
                             f"job {e['job']} {e['kind']!r}: after failed send attempt "
                             f"{e.get('attempts')}, {e.get('worker')} waits {shortest:.3f} s "
                             f"before the retry; the sender's backoff allows [{low:.3f}, "
                             f"{high:.3f}] s", *sent[-1:], e)
            elif high - low > TOL:
                spread.append(((shortest, longest), low, high, e))
    return {"retry_writes": stats["retry_writes"],
            "skipped_undeclared": stats["skipped_undeclared"],
            "jitter_spread": _check_spread(verdict, spread)}


def _refused_for_good(request: Event) -> bool:
    """A definite answer no retry can change: a 4xx other than 408 and 429."""
    status = request.get("status")
    return (request.get("completion") != "info" and status is not None
            and 400 <= status < 500 and status not in (408, 429))


def _send_ended(write: Event, request: Event | None, rows: list[Event],
                settings: dict) -> float:
    """The earliest the sender can have read its clock for the retry `write` schedules:
    after the answer, when its request was answered in time; after its send timeout from
    its claim of the row, when it gave up (it sent after claiming; the fake may log the
    request's arrival later still, on a loaded machine); never after the write."""
    timeout = settings.get("send_timeout")
    # A dropped connection is seen at once; a held request only when the sender gives up.
    if request is not None and request.get("fault") not in ("timeout", "lost") and (
            timeout is None or request["t_end"] - request["t_start"] < timeout - TOL):
        return min(request["t_end"], write["t"])
    claims = [r for r in rows if r["type"] == "effect_claimed"
              and r.get("worker") == write.get("worker") and r["t"] < write["t"]]
    if not claims:
        return write["t"]
    return min(claims[-1]["t"] + (timeout or 0.0), write["t"])


SYNC_MIN_RETRIES = 8   # fewer retries after an outage say nothing about synchronization


def backoff(settings: dict, attempt: int, name: str = "backoff_bounds"
            ) -> tuple[float, float] | None:
    """The engine's declared (lowest, highest) wait after failed attempt `attempt` (of a
    step, or with name "outbox_backoff_bounds" of a send)."""
    bounds = settings.get(name) or ()
    if not bounds or attempt < 1:
        return None
    low, high = bounds[min(attempt, len(bounds)) - 1]
    return float(low), float(high)


def _retry_after_ignored(verdict: Verdict, tl: Timeline, h: Holding, call_pos: int, call: Event,
                         retry_after: float) -> bool:
    # The engine read its clock after the answer (t_end), so retry_at >= t_end + R; the
    # audit's own t may be later still (waiting for the write lock) and is not the bound.
    # An HTTP date names the instant itself (the call's retry_at): nothing before it.
    retry_at = call.get("retry_at")
    w = h.write
    earliest = call["t_end"] + retry_after if retry_at is None else retry_at
    asked = (f"{retry_after:g} s" if retry_at is None else
             f"{call.get('retry_after_header')!r} (an HTTP date, {tl.at(retry_at)})")
    head = (f"job {h.job}: step {h.step['name']!r} answered {call.get('status')} with "
            f"Retry-After {asked} at {tl.at(call['t_end'])}")
    if w["next_run_at"] < earliest - TOL:
        verdict.fail("retry-after-ignored",
                     f"{head}, but {h.worker} scheduled the retry "
                     f"{w['next_run_at'] - call['t_end']:.3f} s after it", call, w)
        return True
    entries = tl.calls.get((h.job, h.step["name"]), [])
    nxt = next(((p, c) for p, seg, c, h2 in entries if p > call_pos and seg == h.segment
                and (h2 is None or h2.start_pos > h.write_pos)), None)
    if nxt is None or tl.is_skewed(nxt[1].get("worker")) or any(
            h.write_pos < p < nxt[0] for p in tl.interventions.get(h.job, [])):
        return False  # an operator or the nemesis moved the job on, or a skewed clock claimed
    if nxt[1]["t_start"] < earliest - TOL:
        verdict.fail("retry-after-ignored",
                     f"{head}, but {nxt[1].get('worker')} called again "
                     f"{nxt[1]['t_start'] - call['t_end']:.3f} s after it", call, w, nxt[1])
        return True
    return False


def answered(call: Event, timeout: float | None, since: float | None = None) -> float:
    """The earliest the worker can have had its answer: the provider's t_end, or its own
    call timeout if that came first (a hanging provider stamps t_end long after the client
    gave up). The timeout runs from when the worker sent the request, which may be well
    before the loaded provider stamped t_start: `since` (the holding's start) bounds it."""
    if timeout is None:
        return call["t_end"]
    start = call["t_start"] if since is None else min(call["t_start"], since)
    return min(call["t_end"], start + timeout)


def _check_backoff(verdict: Verdict, tl: Timeline, h: Holding, call: Event | None,
                   lower: float, upper: float, timeout: float | None) -> None:
    # The engine's clock read lies between the failing answer (or the claim) and the audit
    # write, so the wait it chose lies in [next_run_at - write t, next_run_at - that start].
    w = h.write
    lowest = w["next_run_at"] - w["t"]
    highest = w["next_run_at"] - (answered(call, timeout, h.start["t"]) if call
                                  else h.start["t"])
    if lowest > upper + TOL or highest < lower - TOL:
        verdict.fail("backoff-out-of-bounds",
                     f"job {h.job}: after failed attempt {w.get('attempts')} of step "
                     f"{h.step['name']!r}, {h.worker} waits {lowest:.3f} s before the retry; the "
                     f"engine's backoff allows [{lower:.3f}, {upper:.3f}] s",
                     *([call] if call else []), w)
