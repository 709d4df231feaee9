"""Part of effects-complete (chaos.checkers.outbox): an idempotency key names one effect.
A request for one effect under a key the receiver had applied for another applies nothing
(the receiver replays the other's answer, or refuses a different body as a conflict): that
effect is not applied by it. A key derived from something a power cut can take back and
give out again (an outbox row's id) does this after the cut, so the witness names the cut.
"""
from __future__ import annotations

from chaos.history import Event
from chaos.checkers.effects import OutboxIndex
from chaos.checkers.verdict import Verdict


def _at(t: float, idx: OutboxIndex) -> str:
    return f"+{t - idx.t0:.3f} s"


def judge_shared_keys(verdict: Verdict, history: list[Event], idx: OutboxIndex) -> None:
    """An effect posted under an idempotency key the receiver had already applied for
    another effect is not applied by that request: the receiver answers with the other's
    outcome (replayed) or refuses it (conflict). One failure per (effect, key), naming the
    last power cut between the two: a key reused after a cut took back the row that had it."""
    owner: dict[str, Event] = {}  # key -> the request that first applied it
    for requests in idx.requests.values():
        for r in requests:
            if r.get("applied") and r.get("key") is not None and r.get("job") is not None:
                if r["key"] not in owner or r["t_start"] < owner[r["key"]]["t_start"]:
                    owner[r["key"]] = r
    cuts = [e for e in history if e.get("src") == "nemesis" and e.get("type") == "power_loss"]
    judged = set()
    for (job, kind), requests in sorted(idx.requests.items(), key=lambda i: str(i[0])):
        for r in requests:
            first = owner.get(r.get("key"))
            if first is None or (first.get("job"), first.get("kind")) == (job, kind) or \
                    first["t_start"] > r["t_start"] or (job, kind, r["key"]) in judged:
                continue
            judged.add((job, kind, r["key"]))
            between = [c for c in cuts if first["t_start"] <= c["t"] <= r["t_start"]]
            # the cut that took back the first effect's sent mark, else the last one
            lost = [c for c in between if [first.get("job"), first.get("kind")] in
                    (c.get("lost_sent") or [])]
            between = lost[-1:] or between[-1:]
            cut = (f"; the key was given again after power cut {between[0].get('cut')} at "
                   f"{_at(between[0]['t'], idx)}, which took back "
                   f"{between[0].get('lost_count', 0)} acknowledged operation(s)"
                   + (f", job {first.get('job')} {first.get('kind')!r}'s sent mark among them"
                      if lost else "") if between else "")
            verdict.fail("key-of-another-effect",
                         f"job {job} {kind!r} was posted at {_at(r['t_start'], idx)} under "
                         f"idempotency key {r['key']!r}, which the receiver had applied for job "
                         f"{first.get('job')} {first.get('kind')!r} at "
                         f"{_at(first['t_start'], idx)}: answered {r.get('status')} "
                         f"{r.get('outcome')}, that request did not apply it{cut}",
                         r, first, *between)
