"""deadlines-kept: a worker gives up on a provider call by its call timeout, a sender on a
receiver request by its send timeout.

Only a request the fake held past the client's deadline (a hang, a late receiver) says
anything. The deadline runs on the client's own time: the time its process was frozen by
the harness (its pause..resume windows) or left unrun by the machine (its stalls) during
the request is not held against it, for a frozen client cannot give up and, once resumed,
finds the answer that came meanwhile already there. A request whose answer came within
that time says nothing; one whose answer came later still, only through evidence that the
client waited for that answer:
- the engine's own spend record of the call saying it got the answer (outcome ok), where
  the engine keeps one;
- else the client using the late answer: the worker's next write for the job is the step's
  memo or completion, the sender's next write for the row its sent mark, after the fake
  answered, and the client had not gone when the answer was ready nor died before that
  write (a worker id that names a slot outlives its processes), nor did the harness hold
  writes back meanwhile (a held lock, a forced expiry). A failure written after the answer
  is not judged: the time between giving up and writing (a stall, a lock, a loaded
  machine) is not the client's deadline;
- or, for an answer the fake trickled a byte at a time (which resets every socket timeout),
  the client still there when the trickle ended ("held-past-deadline"): the fake found no
  write failing for want of a reader, though the trickle outlasted the deadline, and the
  time the client could not run, by more than two of its writes and the machine's slack;
  unless the client had written its failure while the trickle went on (it gave up, and left
  a thread of its HTTP client reading an answer it no longer waited for).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

from chaos.fakes.provider import TRICKLE_INTERVAL
from chaos.history import Event
from chaos.engines.schema import reads
from chaos.checkers.index import Readings, readings
from chaos.checkers.ops import TOL, held_back, is_effect, machine_slack
from chaos.checkers.verdict import Verdict


@dataclass(frozen=True)
class LateAnswer:
    """A request the fake answered past its client's deadline: the request, its kind
    ("calls" or "sends"), the deadline (s), the client's process, and how long that process
    was frozen by the harness and stalled by the machine during the request (s)."""
    request: Event
    kind: str
    deadline: float
    client: int | None
    frozen: float
    stalled: float

    @property
    def due(self) -> float:
        """When the deadline ran out on the client's own time: the request's start plus
        the deadline plus the time the client could not run."""
        return self.request["t_start"] + self.deadline + self.frozen + self.stalled

    @property
    def past_due(self) -> float:
        """How long after `due` the fake answered (<= 0: the client had no time to give up)."""
        return self.request["t_end"] - self.due

    def what(self) -> str:
        """The request in the witness's words: "call for job/step" or "send of job/kind"."""
        r = self.request
        return (f"call for {r.get('job')}/{r.get('step')}" if self.kind == "calls"
                else f"send of {r.get('job')}/{r.get('kind')}")

    def opening(self, t0: float) -> str:
        """The witness's first words: who, what, when, and the bound."""
        r = self.request
        return (f"{r['worker']}'s {self.what()} at +{r['t_start'] - t0:.3f} s had a "
                f"{self.deadline:g} s deadline")

    def time_excused(self) -> str:
        """The witness's account of the time the client could not run and what is left."""
        pid = f"pid {self.client}" if self.client is not None else "its pid unknown"
        still = ([f"frozen by the harness (paused until resumed) for {self.frozen:.3f} s"]
                 * (self.frozen > 0)
                 + [f"left unrun by the machine for {self.stalled:.3f} s"] * (self.stalled > 0))
        if not still:
            return (f"its process ({pid}) was neither paused nor stalled meanwhile: the "
                    f"answer came {self.past_due:.3f} s past the deadline")
        return (f"its process ({pid}) was {' and '.join(still)} during the request, time "
                f"not held against the deadline, and the answer still came "
                f"{self.past_due:.3f} s past it")


def check_deadlines_kept(history: list[Event], snapshot: dict[str, Any]) -> Verdict:
    """No client waits a call or a send out past its deadline (see the module docstring)."""
    verdict = Verdict("deadlines-kept")
    settings = snapshot["settings"]
    timeouts = {"calls": settings.get("call_timeout"), "sends": settings.get("send_timeout")}
    if timeouts["calls"] is None and timeouts["sends"] is None:
        return verdict.unknown("the engine declares neither a call nor a send timeout")
    shared = readings(history)
    judge = _Judge(history, shared, verdict, machine_slack(snapshot.get("clock")))
    overran = {"calls": 0, "sends": 0}
    excused = {"calls": 0, "sends": 0}
    for late in _late_answers(history, shared, timeouts):
        overran[late.kind] += 1
        if late.past_due <= 2 * TOL:
            excused[late.kind] += 1  # the answer came while the client could not run
            continue
        verdict.checked += 1
        judge.judge(late)
    if not verdict.checked and verdict.valid is not False:
        verdict.unknown("no call or send ran past its deadline at the fakes (no hang, no late "
                        "receiver) by more than its client was frozen or stalled meanwhile, "
                        "so no deadline was put to the test")
    verdict.metrics = {"call_timeout": timeouts["calls"], "send_timeout": timeouts["sends"],
                       "overran_calls": overran["calls"], "overran_sends": overran["sends"],
                       # late only by the time their clients were frozen or stalled
                       "excused_calls": excused["calls"], "excused_sends": excused["sends"],
                       "abandoned_trickles": judge.abandoned}
    return verdict


def _late_answers(history: list[Event], shared: Readings,
                  timeouts: dict[str, float | None]) -> Iterator[LateAnswer]:
    """Each provider call and receiver request the fake answered past its client's
    deadline (by the wall clock), as a LateAnswer, in history order."""
    for e in history:
        src, type_ = e.get("src"), e.get("type")
        kind = ("calls" if (src, type_) == ("provider", "call")
                else "sends" if (src, type_) == ("receiver", "request") else None)
        deadline = timeouts.get(kind) if kind else None
        if deadline is None or not e.get("worker") or \
                e["t_end"] - e["t_start"] <= deadline + 2 * TOL:
            continue  # answered within its deadline: nothing to see
        # The caller's own process, where the fakes saw it; else its worker id's last.
        client = e.get("pid") or shared.jobs.pids.get(e["worker"])
        yield LateAnswer(e, kind, deadline, client, *shared.held_still(client, e["t_start"],
                                                                        e["t_end"]))


class _Judge:
    """Judges each late answer past its client's due time by the evidence of waiting."""

    def __init__(self, history: list[Event], shared: Readings, verdict: Verdict,
                 slack: float) -> None:
        self.shared, self.verdict, self.slack = shared, verdict, slack
        self.t0 = history[0]["t"] if history else 0.0
        self.later_writes = _writes_by_client(history)
        self.abandoned = 0  # trickles left open by a client that had written its failure

    def judge(self, late: LateAnswer) -> None:
        """Fail `late` if the client stayed for a trickle, its spend record has the answer,
        or (with no spend record) it used the answer; see the module docstring."""
        e = late.request
        if e.get("trickle") and e.get("client_gone_at") is None and self._trickled(late):
            return
        if (spend := self.shared.spends.get(id(e)) if late.kind == "calls" else None):
            if spend.get("outcome") == "ok":  # the engine had the answer: it waited for it
                self.verdict.fail(
                    "waited-past-deadline",
                    f"{late.opening(self.t0)}, but the engine recorded its answer, which the "
                    f"fake gave {e['t_end'] - e['t_start']:.3f} s after the call started; "
                    f"{late.time_excused()}", e, spend)
        elif e.get("completion") != "info":  # "info": the client had gone when it was ready
            self._used(late)

    def _trickled(self, late: LateAnswer) -> bool:
        """Fail a client that stayed for a trickled answer well past its due time; whether
        it did."""
        e = late.request
        if late.past_due <= 2 * TRICKLE_INTERVAL + self.slack:
            return False  # too short to tell a client that stayed from one slow to go
        moved_on = _next_write(late.kind, e, self.later_writes)
        if moved_on is not None and moved_on["t"] < e["t_end"] - TOL \
                and not _uses(late.kind, moved_on):
            # It wrote its failure while the trickle went on: the worker gave up by its own
            # clock, and the connection it left open (a thread of its client still reading)
            # holds no answer it waited for.
            self.abandoned += 1
            return False
        self.verdict.fail(
            "held-past-deadline",
            f"{late.opening(self.t0)}, but it kept the connection open while the fake "
            f"trickled its answer for {e['t_end'] - e['t_start']:.3f} s: a bound on each "
            f"read, not on the call; {late.time_excused()}, more than two of the trickle's "
            f"writes and the machine's {self.slack:g} s slack", e)
        return True

    def _used(self, late: LateAnswer) -> None:
        """Fail `late` if the client's next write used its answer."""
        e = late.request
        used = _used_late_answer(late.kind, e, self.later_writes, e["t_end"])
        if used is None or held_back(self.shared.windows, e["t_start"], used["t"]):
            return
        died = self.shared.jobs.exit_after(e["worker"], e["t_start"], e.get("pid"))
        if died is not None and died["t"] < used["t"]:
            return  # the caller died first: the write is a successor's under the same id
        self.verdict.fail(
            "waited-past-deadline",
            f"{late.opening(self.t0)}, but the client waited for the answer the fake gave "
            f"{e['t_end'] - e['t_start']:.3f} s after it started and used it: "
            f"{used['type']} at +{used['t'] - self.t0:.3f} s; {late.time_excused()}", e, used)


def _writes_by_client(history: list[Event]) -> dict[tuple, list[Event]]:
    """(worker, job) -> the worker's job and memo writes, its claims of the job included (a
    new claim of it says the worker had given up what it did before); (sender, job, kind) ->
    the sender's writes to that outbox row; each in commit order."""
    writes: dict[tuple, list[Event]] = {}
    for e in history:
        if e.get("src") != "engine" or not e.get("worker"):
            continue
        if is_effect(e) and e["type"] in ("effect_sent", "effect_state"):
            writes.setdefault((e["worker"], e.get("job"), e.get("kind")), []).append(e)
        elif e["type"] in ("memo", "state", "claimed") and not e.get("heartbeat"):
            writes.setdefault((e["worker"], e.get("job")), []).append(e)
    return writes


def _next_write(kind: str, request: Event, writes: dict) -> Event | None:
    """The client's next write for the request's job (a call) or row (a send) after it
    started."""
    key = ((request["worker"], request.get("job")) if kind == "calls"
           else (request["worker"], request.get("job"), request.get("kind")))
    return next((w for w in writes.get(key, ()) if w["t"] > request["t_start"]), None)


def _uses(kind: str, write: Event) -> bool:
    """Whether `write` uses an answer: a memo or a completion of the job (a call), the row's
    sent mark (a send)."""
    if kind == "calls":
        return write["type"] == "memo" or (write["type"] == "state"
                                           and write.get("from") != write.get("to")
                                           and not write.get("last_error"))
    return write["type"] == "effect_sent"


def _uses_answer_to(kind: str, request: Event, write: Event) -> bool:
    """Whether `write` uses the answer to `request`: `_uses`, and a memo of the request's
    own step (a memo of another step answers another call)."""
    return _uses(kind, write) and not (write["type"] == "memo" and request.get("step")
                                       and write.get("step") != request["step"])


def _used_late_answer(kind: str, request: Event, writes: dict, answered: float) -> Event | None:
    """The client's next write after the request, if it used the late answer: a memo or a
    completion of the job, or the row's sent mark, committed after the fake answered."""
    nxt = _next_write(kind, request, writes)
    return nxt if nxt is not None and nxt["t"] >= answered - TOL \
        and _uses_answer_to(kind, request, nxt) else None


CHECKS = {"deadlines-kept": check_deadlines_kept}

#: the engine fields each check reads (chaos.engines.schema): an evidence field an engine leaves out
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
