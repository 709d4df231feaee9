"""Checker of durability across power cuts (durable-commits): every transaction the engine
had acknowledged before a cut is in its store after it, where the engine's settings promise
durability; where they do not, what each cut lost is reported, not failed.

The evidence is the nemesis's own (chaos.powerloss.fault): each `power_loss` event carries
the operations the store showed just before the cut that it no longer shows after it
(`lost_count`, `lost_by_type`, the first `lost`), and the adapter's declaration for the
run's settings (`durability_promised`, `durability_setting`). What the cut cost beyond the
store (a call billed again, an effect applied twice) is judged by the other invariants
against the fakes' ledgers; the provider calls made again for a memo a cut lost are
counted here apart (`rebilled_after_cut`)."""
from __future__ import annotations

from collections import Counter
from typing import Any

from chaos.history import Event
from chaos.checkers.verdict import Verdict

NAME = "durable-commits"


def _at(e: Event, t0: float | None) -> str:
    return f"+{e['t'] - t0:.3f} s" if t0 is not None else f"t={e['t']:.3f}"


def check_durable_commits(history: list[Event], snapshot: dict[str, Any]) -> Verdict:
    """Each power_loss event with lost operations fails ("lost-acknowledged") when its
    durability_promised is True; unknown when no cut fired, or when the adapter declares
    nothing about durability and a cut lost something."""
    verdict = Verdict(NAME)
    cuts = [e for e in history if e.get("src") == "nemesis" and e.get("type") == "power_loss"]
    if not cuts:
        return verdict.unknown("no power cut in this run")
    t0 = (snapshot.get("phases") or {}).get("chaos_start")
    lost: Counter[str] = Counter()
    undeclared = 0
    for e in cuts:
        verdict.checked += e.get("acknowledged", 0)
        lost.update(e.get("lost_by_type") or {})
        if not e.get("lost_count"):
            continue
        promised = e.get("durability_promised")
        if promised is None:
            undeclared += 1
        elif promised:
            first = (e.get("lost") or [{}])[0]
            what = ", ".join(f"{n} {t}" for t, n in sorted(e["lost_by_type"].items()))
            verdict.fail("lost-acknowledged",
                         f"power cut {e['cut']} at {_at(e, t0)} ({e.get('mode')}, "
                         f"{e.get('dropped_writes', 0)} unsynced writes, "
                         f"{e.get('dropped_bytes', 0)} bytes dropped) lost {e['lost_count']} "
                         f"acknowledged operation(s) ({what}) although "
                         f"{e.get('durability_setting')} promises durability; the first: "
                         f"{first.get('type')} of job {first.get('job')} at "
                         f"{_at(first, t0) if 't' in first else '?'}", e)
    calls = [e for e in history if e.get("src") == "provider" and e.get("type") == "call"]
    rebilled = 0
    for e in cuts:
        memos = {tuple(m) for m in e.get("lost_memos") or []}
        rebilled += sum(1 for c in calls if (c.get("job"), c.get("step")) in memos
                        and c["t"] > e["t"])
    verdict.metrics = {
        "cuts": len(cuts), "acknowledged": sum(e.get("acknowledged", 0) for e in cuts),
        "lost": sum(e.get("lost_count", 0) for e in cuts), "lost_by_type": dict(lost),
        "dropped_writes": sum(e.get("dropped_writes", 0) for e in cuts),
        "dropped_bytes": sum(e.get("dropped_bytes", 0) for e in cuts),
        # a call billed again because the cut lost the memo of an earlier one: the cut's
        # cost, counted apart from the engine's own waste
        "rebilled_after_cut": rebilled,
        "lost_sent_marks": sum(len(e.get("lost_sent") or []) for e in cuts),
        "promised": cuts[0].get("durability_promised"),
        "setting": cuts[0].get("durability_setting")}
    if verdict.valid is True and undeclared:
        verdict.unknown(f"{undeclared} power cut(s) lost acknowledged operations, and the "
                        "adapter declares no durability for its settings")
    return verdict


CHECKS = {NAME: check_durable_commits}
#: reads no engine field: the nemesis's power_loss events only
READS: dict[str, tuple[str, ...]] = {NAME: ()}
