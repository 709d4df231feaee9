"""deadlines-kept: a worker gives up on a provider call by its call timeout, a sender on a
receiver request by its send timeout.

Only a request the fake held past the client's deadline (a hang, a late receiver) says
anything, and only evidence that the client waited for that answer fails it:
- the engine's own spend record of the call saying it got the answer (outcome ok), where
  the engine keeps one;
- else the client using the late answer: the worker's next write for the job is the step's
  memo or completion, the sender's next write for the row its sent mark, after the fake
  answered, and the client had not gone when the answer was ready nor died before that
  write (a worker id that names a slot outlives its processes). A failure written after the
  answer is not judged: the time between giving up and writing (a stall, a lock, a loaded
  machine) is not the client's deadline;
- or, for an answer the fake trickled a byte at a time (which resets every socket timeout),
  the client still there when the trickle ended ("held-past-deadline"): the fake found no
  write failing for want of a reader, though the trickle outlasted the deadline by more than
  two of its writes and the machine's slack (counted from the client's resume if its process
  was paused meanwhile).
"""
from __future__ import annotations

from typing import Any

from ..fakes.provider import TRICKLE_INTERVAL
from ..history import Event
from ..schema import reads
from .index import readings
from .ops import TOL, disturbed, is_effect, machine_slack
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
    slack = machine_slack(snapshot.get("clock"))
    overran = {"calls": 0, "sends": 0}
    spends = shared.spends
    later_writes = _writes_by_client(history)
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
        client = e.get("pid") or index.pids.get(worker)  # the caller's own, where the fakes saw it
        # A paused client cannot leave: its deadline counts from its resume.
        due = max([start + deadline] + [b for pid, a, b in windows["pauses"]
                                        if pid == client and a <= end and b >= start])
        if e.get("trickle") and e.get("client_gone_at") is None and \
                end > due + 2 * TRICKLE_INTERVAL + slack:
            verdict.fail("held-past-deadline",
                         f"{worker}'s call for {e.get('job')}/{e.get('step')} at "
                         f"+{start - t0:.3f} s had a {deadline:g} s deadline, but it kept the "
                         f"connection open while the fake trickled its answer for "
                         f"{end - start:.3f} s: a bound on each read, not on the call", e)
            continue
        spend = spends.get(id(e)) if kind == "calls" else None
        if spend is not None:
            if spend.get("outcome") == "ok":  # the engine had the answer: it waited for it
                verdict.fail("waited-past-deadline",
                             f"{worker}'s call for {e.get('job')}/{e.get('step')} at "
                             f"+{start - t0:.3f} s had a {deadline:g} s deadline, but the engine "
                             f"recorded its answer, which the fake gave {end - start:.3f} s "
                             "after the call started", e, spend)
            continue
        if e.get("completion") == "info":
            continue  # the client had gone when the answer was ready: it did not wait for it
        used = _used_late_answer(kind, e, later_writes, end)
        if used is None or disturbed(windows, client, start, used["t"]):
            continue
        died = index.exit_after(worker, start, e.get("pid"))
        if died is not None and died["t"] < used["t"]:
            continue  # the caller died first: the write is a successor's under the same id
        what = (f"call for {e.get('job')}/{e.get('step')}" if kind == "calls"
                else f"send of {e.get('job')}/{e.get('kind')}")
        verdict.fail("waited-past-deadline",
                     f"{worker}'s {what} at +{start - t0:.3f} s had a {deadline:g} s deadline, "
                     f"but the client waited for the answer the fake gave {end - start:.3f} s "
                     f"after it started and used it: {used['type']} at "
                     f"+{used['t'] - t0:.3f} s", e, used)
    if not verdict.checked and verdict.valid is not False:
        verdict.unknown("no call or send ran past its deadline at the fakes (no hang, no late "
                        "receiver), so no deadline was put to the test")
    verdict.metrics = {"call_timeout": call_timeout, "send_timeout": send_timeout,
                       "overran_calls": overran["calls"], "overran_sends": overran["sends"]}
    return verdict


def _writes_by_client(history: list[Event]) -> dict[tuple, list[Event]]:
    """(worker, job) -> the worker's job and memo writes; (sender, job, kind) -> the
    sender's writes to that outbox row; each in commit order."""
    writes: dict[tuple, list[Event]] = {}
    for e in history:
        if e.get("src") != "engine" or not e.get("worker"):
            continue
        if is_effect(e) and e["type"] in ("effect_sent", "effect_state"):
            writes.setdefault((e["worker"], e.get("job"), e.get("kind")), []).append(e)
        elif e["type"] in ("memo", "state") and not e.get("heartbeat"):
            writes.setdefault((e["worker"], e.get("job")), []).append(e)
    return writes


def _used_late_answer(kind: str, request: Event, writes: dict, answered: float) -> Event | None:
    """The client's next write after the request, if it used the late answer: a memo or a
    completion of the job, or the row's sent mark, committed after the fake answered."""
    if kind == "calls":
        key = (request["worker"], request.get("job"))
        used = lambda w: w["type"] == "memo" or (w["type"] == "state"  # noqa: E731
                                                 and w.get("from") != w.get("to")
                                                 and not w.get("last_error"))
    else:
        key = (request["worker"], request.get("job"), request.get("kind"))
        used = lambda w: w["type"] == "effect_sent"  # noqa: E731
    nxt = next((w for w in writes.get(key, ()) if w["t"] > request["t_start"]), None)
    return nxt if nxt is not None and nxt["t"] >= answered - TOL and used(nxt) else None


CHECKS = {"deadlines-kept": check_deadlines_kept}

#: the engine fields each check reads (chaos.schema): an evidence field an engine leaves out
#: makes exactly these checks unknown, naming it
READS = {
    "deadlines-kept": reads(
        submitted="job pid worker",
        claimed="continued job pid worker",
        state="actor from heartbeat job lease_until pid to took_lease worker",
        memo="job op pid worker",
        effect_queued="job pid worker",
        effect_claimed="pid worker",
        effect_sent="job kind pid worker",
        effect_state="job kind pid worker",
        billed="job outcome pid step worker"),
}
