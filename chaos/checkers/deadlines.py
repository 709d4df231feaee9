"""deadlines-kept: a worker gives up on a provider call by its call timeout, a sender on a
receiver request by its send timeout.

Only a call that ran past its deadline at the fake says anything: the fake held it longer
(a hang, a late receiver), so a client that kept its deadline stopped waiting before the fake
answered. Its next write for the job (for a sender, for the outbox row) then comes before
the fake's answer; a client that waited the answer out, and used it or failed on it, writes
after it ("waited-past-deadline"). The write's own latency only ever helps the client, and a
write delayed by the harness (a held write lock, a pause of the process) is not judged.
"""
from __future__ import annotations

from typing import Any

from ..history import Event
from .index import readings
from .ops import TOL, disturbed, is_effect
from .verdict import Verdict


def check_deadlines_kept(history: list[Event], snapshot: dict[str, Any]) -> Verdict:
    """No client waits a call or a send out past its deadline (see the module docstring)."""
    verdict = Verdict("deadlines-kept")
    settings = snapshot["settings"]
    call_timeout, send_timeout = settings.get("call_timeout"), settings.get("send_timeout")
    if call_timeout is None and send_timeout is None:
        return verdict.unknown("the engine declares neither a call nor a send timeout")
    shared = readings(history)
    index, windows = shared.jobs, shared.windows
    t0 = history[0]["t"] if history else 0.0
    overran = {"calls": 0, "sends": 0}
    effect_writes = _effect_writes(history)
    for e in history:
        src, type_ = e.get("src"), e.get("type")
        if src == "provider" and type_ == "call" and call_timeout is not None:
            deadline, kind = call_timeout, "calls"
        elif src == "receiver" and type_ == "request" and send_timeout is not None:
            deadline, kind = send_timeout, "sends"
        else:
            continue
        worker, start, end = e.get("worker"), e["t_start"], e["t_end"]
        if not worker or end - start <= deadline + 2 * TOL:
            continue  # answered within its deadline: nothing to see
        overran[kind] += 1
        verdict.checked += 1
        if kind == "calls":
            written = index.next_write(worker, e.get("job"), start)
        else:
            written = next((t for t in effect_writes.get((worker, e.get("job"), e.get("kind")),
                                                         ()) if t > start), None)
        if written is None or written < end - TOL:
            continue  # gave up in time (or died first)
        if disturbed(windows, index.pids.get(worker), start + deadline, written):
            continue  # the harness held its write back
        what = (f"call for {e.get('job')}/{e.get('step')}" if kind == "calls"
                else f"send of {e.get('job')}/{e.get('kind')}")
        verdict.fail("waited-past-deadline",
                     f"{worker}'s {what} at +{start - t0:.3f} s had a {deadline:g} s deadline, "
                     f"but the client waited for the answer the fake gave {end - start:.3f} s "
                     f"after it started: its next write came at +{written - t0:.3f} s", e)
    if not verdict.checked and verdict.valid is not False:
        verdict.unknown("no call or send ran past its deadline at the fakes (no hang, no late "
                        "receiver), so no deadline was put to the test")
    verdict.metrics = {"call_timeout": call_timeout, "send_timeout": send_timeout,
                       "overran_calls": overran["calls"], "overran_sends": overran["sends"]}
    return verdict


def _effect_writes(history: list[Event]) -> dict[tuple, list[float]]:
    """(sender, job, kind) -> the times of the sender's writes to that outbox row."""
    writes: dict[tuple, list[float]] = {}
    for e in history:
        if is_effect(e) and e.get("worker") and e["type"] in ("effect_sent", "effect_state"):
            writes.setdefault((e["worker"], e.get("job"), e.get("kind")), []).append(e["t"])
    return writes


CHECKS = {"deadlines-kept": check_deadlines_kept}
