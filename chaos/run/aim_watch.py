"""Aimed faults in a real run: the harness's side of the probe's holds (chaos.spec.aim).

A process armed with NINELIVES_HOLD_AT appends a line to the hold log and blocks the thread
that reached the aimed point there, its other threads pausing at their next point outside a
write transaction (chaos.probe). `AimWatch` reads that log, decides which aim the hold
serves, and releases it (the probe's release file for that hold) when the aim's condition
comes: another process's claim of what it held (read from the engine's operations), another
process passing a named point for the same job (a "reach" line in the same log), a number of
seconds, or the aim's deadline at the latest. An expiry is carried out while the thread
stands held, then it goes on; a kill kills the process where it stands. A hold no aim needs
(an aim already spent, or one hold at a time) is released at once, and once every aim is
spent the probes are disarmed. A hold line without a
hold number comes from a probe that stops its whole process (SIGSTOP), as the probe did
before: that process is continued (SIGCONT).

It records its own `hold`, `release`, `expire` and `kill` events (src "nemesis", each with
`aim`). `heal()` disarms every probe (the log's `.off` file, which also lets every held thread go
on), and releases any hold still arriving: no process is left stopped or blocked.
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from chaos.spec import aim as aims
from chaos.engines.adapter_guard import described
from chaos.history import Event

POLL = 0.02
#: Seconds between two reads of the engine's operations while a hold waits for a takeover.
LOOK = 0.05
#: Seconds to wait for a process whose probe stops it whole (a hold line with no number) to
#: be stopped before continuing it: a SIGCONT sent before its own SIGSTOP would leave it
#: stopped for good.
STOP_WAIT = 2.0


@dataclass
class Held:
    """One process the watch holds for one aim."""

    target: aims.Target
    pid: int
    name: str
    role: str
    job: str | None
    point: str
    t: float
    number: int | None = None  # the probe's count of this process's holds (None: a SIGSTOP)


class AimWatch:
    """Carries out the armed aims of `targets` for one real run (see the module docstring).
    `children()` lists the supervisor's children (name, pid, role); `kill(child)` kills one
    on the harness's behalf (the supervisor's SIGKILL)."""

    def __init__(self, targets: list[aims.Target], engine: Any, db: str, log: str,
                 children: Callable[[], list], record: Callable[[Event], None],
                 plan: Any, kill: Callable[[Any], None] | None = None) -> None:
        self.targets = [t for t in targets if t.armed]
        self.engine, self.db, self.log, self.record, self.plan = engine, db, log, record, plan
        self.children = children
        self.kill = kill or (lambda child: os.kill(child.pid, signal.SIGKILL))
        self.fired: dict[int, int] = {}
        self.held: dict[int, Held] = {}      # pid -> its hold
        self.taken: set[str] = set()         # jobs held by an aim (job = "held" aims these)
        self._offset = 0
        self._reached: list[dict] = []
        self._ops: list[dict] = []
        self._looked = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="aims")

    def start(self) -> "AimWatch":
        self._thread.start()
        return self

    def heal(self) -> None:
        """Disarm every probe, release every hold, and any hold still arriving."""
        with open(aims.off_file(self.log), "a", encoding="utf-8"):
            pass
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        for held in list(self.held.values()):
            self._release(held, "heal")
        deadline = time.time() + 0.2  # a process that passed the point before the .off file
        while time.time() < deadline:
            self._read(release_all=True)
            time.sleep(POLL)

    # -- the loop ------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.wait(POLL):
            try:
                self._read()
                self._check(time.time())
                self._disarm_when_spent()
            except Exception as exc:  # an aim that cannot be carried out is logged, not fatal
                self.record({"t": time.time(), "src": "nemesis", "type": "error",
                             "fault": "aim", "error": described(exc)})

    def _disarm_when_spent(self) -> None:
        """Disarm every probe once every aim has fired its `times` and holds nothing: each
        pass of an armed point would otherwise wait for this watch to let it go, a pause
        no aim asked for (and a lease may run out in it)."""
        if self.targets and not self.held and all(self.fired.get(t.index, 0) >= t.aim.times
                                                  for t in self.targets):
            with open(aims.off_file(self.log), "a", encoding="utf-8"):
                pass

    def _read(self, release_all: bool = False) -> None:
        try:
            with open(self.log, "rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1
        self._offset += end
        for line in data[:end].splitlines():
            entry = json.loads(line)
            if entry.get("action") == "reach":
                self._reached.append(entry)
            elif release_all:
                self._continue(entry["pid"], entry.get("hold"))
            else:
                self._stopped(entry)

    def _stopped(self, entry: dict) -> None:
        """A process held at a hold point: hold it for the aim it serves, or release it."""
        child = self._child(entry["pid"])
        target = self._serves(entry, child)
        if target is None or child is None:
            self._continue(entry["pid"], entry.get("hold"))
            return
        self.fired[target.index] = self.fired.get(target.index, 0) + 1
        job = entry.get("job") or self._job_of(entry["pid"], child.role, entry["t"])
        held = Held(target, entry["pid"], child.name, child.role, job, entry["point"],
                    entry["t"], entry.get("hold"))
        if target.aim.action == "expire":
            self._expire(held)
            return
        if target.aim.action == "kill":
            self._kill(held, child)
            return
        self.held[held.pid] = held
        if held.job:
            self.taken.add(held.job)
        until = target.aim.until
        self.record({"t": entry["t"], "src": "nemesis", "type": "hold", "aim": target.index,
                     "point": held.point, "role": target.aim.role, "job": held.job,
                     "target": held.name, "pid": held.pid, "until": until,
                     "deadline": target.aim.deadline})

    def _serves(self, entry: dict, child: Any) -> aims.Target | None:
        """The first aim this stop serves: its point, its job, its step, not yet spent, and
        not holding another process now (one hold at a time per aim)."""
        busy = {h.target.index for h in self.held.values()}
        for t in self.targets:
            aim = t.aim
            if entry["point"] not in t.points or t.index in busy \
                    or self.fired.get(t.index, 0) >= aim.times:
                continue
            job = entry.get("job")
            wanted = aims.job_filter(t, self.plan)
            if wanted is not None and job != wanted:
                continue
            if aim.job == "held" and job not in self.taken:
                continue
            step = aims.step_named(aim, self.engine.pipeline)
            if step and (job is None or aims.step_at(aim, self.engine.operations(self.db), job,
                                                     self.engine.pipeline) != step):
                continue
            return t
        return None

    def _job_of(self, pid: int, role: str, before: float) -> str | None:
        """The job a process last claimed (for a point that does not say its job, such as a
        heartbeat thread's), from the operations' `pid`."""
        kind = "effect_claimed" if role == "sender" else "claimed"
        jobs = [op.get("job") for op in self.engine.operations(self.db)
                if op.get("type") == kind and op.get("pid") == pid and op["t"] <= before]
        return jobs[-1] if jobs else None

    def _check(self, now: float) -> None:
        for held in list(self.held.values()):
            aim = held.target.aim
            if self._child(held.pid) is None:  # killed while held: nothing to continue
                self.held.pop(held.pid, None)
                self._log_release(held, "killed", now)
            elif aim.kind == "seconds" and now >= held.t + float(aim.until):
                self._release(held, "seconds")
            elif aim.kind == "point" and (met := self._rendezvous(held)) is not None:
                self._release(held, "point", by=self._name_of(met["pid"]),
                              reached=met["point"], seen_t=met["t"])
            elif aim.kind == aims.TAKEOVER and (taken := self._takeover(held, now)) is not None:
                self._release(held, aims.TAKEOVER, seen_t=taken.t, worker=taken.by,
                              by=self._name_of(taken.pid) if taken.pid else taken.by)
            elif now >= held.t + aim.deadline:
                self._release(held, "deadline",
                              waited_for=aims.waited_for(held.target.aim, held.job))

    def _rendezvous(self, held: Held) -> dict | None:
        for e in self._reached:
            if e["point"] in held.target.watch and e["pid"] != held.pid \
                    and e.get("job") == held.job and e["t"] >= held.t:
                return e
        return None

    def _takeover(self, held: Held, now: float) -> aims.Taken | None:
        if now - self._looked >= LOOK:
            self._looked, self._ops = now, self.engine.operations(self.db)
        return aims.takeover(self._ops, held.job, held.t, held.role,
                                 held.pid) if held.job else None

    # -- acting on processes -----------------------------------------------------------------

    def _expire(self, held: Held) -> None:
        """Expire the leases while the process stands held, then release it. The expiry
        runs aside, bounded: a store lock it waits for cannot keep the process held."""
        result: dict[str, Any] = {}

        def expire() -> None:
            try:
                result["leases"] = self.engine.expire_leases(self.db)
            except Exception as exc:
                result["error"] = described(exc)

        worker = threading.Thread(target=expire, name="aim-expire")
        worker.start()
        worker.join(aims.EXPIRE_WAIT)
        if worker.is_alive():
            result["error"] = (f"still waiting for the store after {aims.EXPIRE_WAIT} s (the "
                               "point may lie inside the process's own transaction)")
        self.record({"t": time.time(), "src": "nemesis", "type": "expire",
                     "aim": held.target.index, "point": held.point, "job": held.job,
                     "target": held.name, "pid": held.pid, "leases": result.get("leases", 0),
                     **({"error": result["error"]} if "error" in result else {})})
        self._continue(held.pid, held.number)
        worker.join()

    def _kill(self, held: Held, child: Any) -> None:
        """SIGKILL the process where it stands held: a crash at exactly that point."""
        self.record({"t": time.time(), "src": "nemesis", "type": "kill",
                     "aim": held.target.index, "point": held.point, "job": held.job,
                     "target": held.name, "pid": held.pid, "role": held.role})
        self.kill(child)

    def _release(self, held: Held, reason: str, **details: Any) -> None:
        self.held.pop(held.pid, None)
        # Stamped before the process goes on: it may hold at its next hold point and log
        # that hold before a time read after this call, and the hold would then seem to
        # begin before this one ended (a checker pairing holds and releases lost the first).
        now = time.time()
        self._disarm_when_spent()  # before the release: its next pass must not wait
        sent = self._continue(held.pid, held.number)
        self._log_release(held, reason, now if held.number is not None else sent, **details)

    def _log_release(self, held: Held, reason: str, now: float, **details: Any) -> None:
        self.record({"t": now, "src": "nemesis", "type": "release", "aim": held.target.index,
                     "point": held.point, "role": held.target.aim.role, "job": held.job,
                     "target": held.name, "pid": held.pid, "reason": reason,
                     "held": round(now - held.t, 3),
                     **details})

    def _continue(self, pid: int, number: int | None) -> float:
        """Release hold `number` of `pid` (its probe's release file), or, for a probe that
        stops its whole process (no number), SIGCONT `pid` once it is stopped (or gone).
        Returns the time read just before."""
        if number is not None:
            now = time.time()
            if not os.path.exists(aims.off_file(self.log)):  # else that file released it
                with open(aims.release_file(self.log, pid, number), "a", encoding="utf-8"):
                    pass
            return now
        deadline = time.time() + STOP_WAIT
        while time.time() < deadline and not _stopped_or_gone(pid):
            time.sleep(0.002)
        now = time.time()
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        return now

    def _child(self, pid: int) -> Any:
        return next((c for c in self.children() if c.pid == pid and c.alive()), None)

    def _name_of(self, pid: int) -> str:
        child = next((c for c in self.children() if c.pid == pid), None)
        return child.name if child is not None else f"process {pid}"


def _stopped_or_gone(pid: int) -> bool:
    """Whether `pid` is stopped (state T) or no longer runs (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return True
    state = stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3]
    return state in (b"T", b"t", b"Z", b"X")
