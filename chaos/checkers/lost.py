"""Why a job never settled: the last process that held it or was working on it, and what
became of that process (killed by a fault of the harness, and when, or alive). Read by the
witness of `all-jobs-settle` (chaos.checkers.liveness) and by the kill summary's count of
jobs each kill lost (chaos.checkers.cuts).

A job is held from a claim to its holder's write that leaves the job outside every working
state (a step done, a retry scheduled, a park), or to an operator's move. The claim names
the holder; where it does not (an observer that cannot tell the writer), a later write of a
worker, a provider call for the job or a crash point reached on it does. A process's fate is
read from the harness's own records: the nemesis's `kill`, the probe's `crashpoint`, the
supervisor's `exit`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chaos.history import Event
from chaos.checkers.ops import is_job, is_operator, is_worker, pids_by_worker


@dataclass
class Hold:
    """The last hold on one job: who took it, when, and the event that says so."""

    job: str
    t: float                  # when the hold began (its claim, or its first evidence)
    worker: str | None
    pid: int | None
    claim: Event | None       # the claim that began it; None when known from work alone
    named_by: Event | None    # the event that named the holder (None: nothing named it)


@dataclass
class Fate:
    """What became of one process: the fault that killed it, or how it ended."""

    pid: int
    name: str | None = None
    cause: str | None = None          # "kill" or "crash point NAME": a fault of the harness
    struck: float | None = None       # when that fault struck it
    fault: Event | None = None
    exit: Event | None = None

    def text(self, at) -> str:
        """The fate in words; `at(t)` writes a time ("+1.234 s")."""
        if self.cause == "kill":
            return f"SIGKILLed at {at(self.struck)} by the nemesis's kill fault"
        if self.cause:
            return f"killed at {at(self.struck)} at {self.cause} (the crash-point fault)"
        e = self.exit
        if e is None:
            return "still running when the run ended: it never gave the job back"
        if e.get("killed"):
            return (f"ended by the harness at {at(e['t'])} ({e.get('signal') or 'stopped'}) "
                    "as the run closed: it never gave the job back")
        how = f"code {e.get('code')}" + (f", {e['signal']}" if e.get("signal") else "")
        return f"exited by itself at {at(e['t'])} ({how}) without giving the job back"


class LostJobs:
    """The history read once for the jobs' last holds and the processes' fates."""

    def __init__(self, history: list[Event], working: set[str] | frozenset[str]) -> None:
        self.t0 = history[0]["t"] if history else 0.0
        self.working = set(working)
        self.pids = pids_by_worker(history)
        self.holds: dict[str, Hold | None] = {}
        self.last_write: dict[str, Event] = {}
        self.fates: dict[int, Fate] = {}
        for e in history:
            self._read(e)

    def at(self, t: float) -> str:
        return f"+{t - self.t0:.3f} s"

    def _fate(self, pid: int) -> Fate:
        return self.fates.setdefault(pid, Fate(pid))

    def _read(self, e: Event) -> None:
        src, kind = e.get("src"), e.get("type")
        if is_job(e):
            self._read_job(e)
        elif src == "provider" and kind == "call" and e.get("job") is not None:
            self._name(e["job"], e)
        elif src == "nemesis" and kind == "kill" and e.get("pid") is not None:
            fate = self._fate(e["pid"])
            if fate.cause is None:
                fate.cause, fate.struck, fate.fault = "kill", e["t"], e
            fate.name = fate.name or e.get("target")
        elif src == "process" and kind == "crashpoint" and e.get("pid") is not None:
            fate = self._fate(e["pid"])  # the last word wins: the crash point's own record
            fate.cause, fate.struck, fate.fault = f"crash point {e.get('point')}", e["t"], e
            if e.get("job") is not None:
                self._name(e["job"], e)
        elif src == "process" and kind in ("spawn", "exit") and e.get("pid") is not None:
            fate = self._fate(e["pid"])
            fate.name = e.get("name") or fate.name
            if kind == "exit":
                fate.exit = e

    def _read_job(self, e: Event) -> None:
        job = e["job"]
        self.last_write[job] = e
        if is_operator(e):
            self.holds[job] = None  # the operator moved it: whoever held it holds it no more
        elif e.get("type") == "claimed":
            pid = e.get("pid") if e.get("pid") is not None else self.pids.get(e.get("worker"))
            named = e if (e.get("worker") or pid is not None) else None
            self.holds[job] = Hold(job, e["t"], e.get("worker"), pid, e, named)
        elif is_worker(e) and e.get("to") not in self.working:
            self.holds[job] = None  # its holder let it go: done, retried later, parked
        elif is_worker(e):
            self._name(job, e)

    def _name(self, job: str, e: Event) -> None:
        """`e` shows a process working on `job`: it names the holder, if nothing had."""
        worker = e.get("worker")
        pid = e.get("pid") if e.get("pid") is not None else self.pids.get(worker)
        if not worker and pid is None:
            return
        hold = self.holds.get(job)
        if hold is None and job in self.holds:
            return  # let go: a late call of the last holder does not take the job back
        if hold is None:
            self.holds[job] = Hold(job, e["t"], worker, pid, None, e)
        elif hold.named_by is None:
            hold.worker, hold.pid, hold.named_by = worker, pid, e

    # -- what a report says ------------------------------------------------------------------

    def explain(self, job: str) -> tuple[str, list[Event]]:
        """Why `job` never settled, as a clause for a witness, and the events that prove it:
        its last holder, whether and when that process was killed and by which fault."""
        hold, last = self.holds.get(job), self.last_write.get(job)
        wrote = ""
        if last is not None:
            by = last.get("worker") or "a writer the engine did not name"
            wrote = f"last written by {by} at {self.at(last['t'])}"
        if hold is None:
            why = "no process held it after" if last is not None else "no process ever held it"
            return f"{wrote}; {why}" if wrote else why, [last] if last is not None else []
        took = (f"which claimed it at {self.at(hold.t)}" if hold.claim is not None
                else f"seen working on it at {self.at(hold.t)}")
        if hold.named_by is None:
            text = (f"last claimed at {self.at(hold.t)} by a worker the engine did not name, "
                    "and no later write, call or crash point names it")
            return text, [e for e in (hold.claim, last) if e is not None][:2]
        who = self._who(hold)
        fate = self.fates.get(hold.pid) if hold.pid is not None else None
        events = [e for e in (hold.claim or hold.named_by, last) if e is not None]
        if fate is None:
            text = f"last held by {who}, {took}; nothing records that process ending"
        else:
            text = f"last held by {who}, {took}; that process was {fate.text(self.at)}"
            events += [e for e in (fate.fault, fate.exit) if e is not None]
        if last is not None and last is not hold.claim:
            text += f" ({wrote})"
        return text, _unique(events)

    def _who(self, hold: Hold) -> str:
        fate = self.fates.get(hold.pid) if hold.pid is not None else None
        where = [f"process {fate.name}"] if fate is not None and fate.name else []
        where += [f"pid {hold.pid}"] if hold.pid is not None else []
        name = f"worker {hold.worker}" if hold.worker else "a worker the engine did not name"
        return f"{name} ({', '.join(where)})" if where else name

    def lost_by_process(self, unsettled: list[str]) -> dict[int, list[str]]:
        """pid -> the jobs among `unsettled` whose last holder was that process, for each
        process a fault of the harness killed (a kill, a crash point)."""
        lost: dict[int, list[str]] = {}
        for job in unsettled:
            hold = self.holds.get(job)
            fate = self.fates.get(hold.pid) if hold is not None and hold.pid is not None else None
            if fate is not None and fate.cause is not None:
                lost.setdefault(hold.pid, []).append(job)
        return lost


def _unique(events: list[Event]) -> list[Event]:
    seen, out = set(), []
    for e in events:
        if id(e) not in seen:
            seen.add(id(e))
            out.append(e)
    return out


def unsettled_jobs(snapshot: dict[str, Any]) -> list[str]:
    """The snapshot's jobs in neither a terminal nor a parked state, by id."""
    pipeline = snapshot["pipeline"]
    settled = set(pipeline["terminal"]) | set(pipeline["parked"])
    return sorted(j for j, row in snapshot["jobs"].items() if row["state"] not in settled)
