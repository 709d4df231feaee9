"""Aimed faults in a simulation (chaos.spec.aim): a thread that reaches an aimed point parks there,
its whole process kept off the schedule, until the aim's condition comes; or its leases are
expired before it goes on; or it is killed there. As in a real run (chaos.probe), no thread
of the process is held inside a write transaction: the scheduler lets an actor with one open
take its next turn whatever, so it commits, and then waits as its process's other actors do.

The scheduler reports every point an actor reaches (`Scheduler.on_point`), in that actor's
thread, before it parks. The conditions are read on the virtual clock: another process's
claim of what the held one held, from the engine's operations every `LOOK` virtual seconds;
another process reaching the aim's rendezvous point for the same job, as it reaches it; a
number of virtual seconds; the aim's deadline at the latest. Everything here is a function
of the schedule, so the same seed gives the same holds. It records the same `hold`,
`release`, `expire` and `kill` events as a real run's `chaos.run.aim_watch`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from chaos.spec import aim as aims
from chaos.sim.controls import SimControls
from chaos.sim.scheduler import INF, Actor, Process

#: Virtual seconds between two reads of the operations while a hold waits for a takeover.
LOOK = 0.05


@dataclass
class Held:
    target: aims.Target
    process: Process
    job: str | None
    point: str
    t: float


class SimAims:
    """The armed aims of `targets` for `sim` (see the module docstring)."""

    def __init__(self, sim: SimControls, targets: list[aims.Target]) -> None:
        self.sim = sim
        self.targets = [t for t in targets if t.armed]
        self.fired: dict[int, int] = {}
        self.hits: dict[tuple[int, int], int] = {}   # (pid, aim) -> matching passes
        self.held: dict[int, Held] = {}              # pid -> its hold
        self.taken: set[str] = set()
        self.looking = False
        self.healed = False

    # -- in the actor's thread ---------------------------------------------------------------

    def at_point(self, actor: Actor, name: str) -> None:
        """`actor` reached point `name`: a rendezvous for a held process, or a hold here."""
        process = actor.process
        if self.healed or process.role not in ("worker", "sender"):
            return
        job = self.sim.point_job(actor)
        for held in list(self.held.values()):
            if held.target.aim.kind == "point" and name in held.target.watch \
                    and process.pid != held.process.pid and job == held.job:
                self._release(held, "point", by=process.name, reached=name,
                              seen_t=self.sim.sched.now())
        if not process.data.get("armed") or actor.in_transaction() \
                or process.pid in self.held:
            return
        target = self._serves(name, job, process)
        if target is None:
            return
        self.fired[target.index] = self.fired.get(target.index, 0) + 1
        held = Held(target, process, job, name, self.sim.sched.now())
        if target.aim.action == "kill":  # where it stands: its turn ends at this point
            self._log("kill", held, held.t, role=process.role)
            self.sim.kill(process, point=None)
            return
        process.paused_until = INF  # its every thread, as the probe pauses them
        if target.aim.action == "expire":
            self._expire(held)
        else:
            self._hold(held)

    def _serves(self, name: str, job: str | None, process: Process) -> aims.Target | None:
        busy = {h.target.index for h in self.held.values()}
        for t in self.targets:
            aim = t.aim
            if name not in t.points:
                continue
            wanted = aims.job_filter(t, self.sim.plan)
            if (wanted is not None and job != wanted) or (aim.job == "held"
                                                          and job not in self.taken):
                continue
            key = (process.pid, t.index)
            self.hits[key] = self.hits.get(key, 0) + 1
            if self.hits[key] % aim.every or t.index in busy \
                    or self.fired.get(t.index, 0) >= aim.times:
                continue
            step = aims.step_named(aim, self.sim.engine.pipeline)
            if step and (job is None or aims.step_at(aim, self.sim.operations(), job,
                                                     self.sim.engine.pipeline) != step):
                continue
            return t
        return None

    def _hold(self, held: Held) -> None:
        sched, aim = self.sim.sched, held.target.aim
        self.held[held.process.pid] = held
        if held.job:
            self.taken.add(held.job)
        self._log("hold", held, held.t, until=aim.until, deadline=aim.deadline)
        start = sched.now_us
        if aim.kind == "seconds":
            sched.at(start + sched.us(float(aim.until)), lambda: self._timed(held, "seconds"))
        sched.at(start + sched.us(aim.deadline), lambda: self._timed(held, "deadline"))
        if aim.kind == aims.TAKEOVER and not self.looking:
            self.looking = True
            sched.at(start + sched.us(LOOK), self._look)

    def _expire(self, held: Held) -> None:
        """Expire the leases in a thread of the harness's own, then let the process go on."""
        sim = self.sim

        def body() -> None:
            try:
                leases, error = sim.expire_leases(), None
            except Exception as exc:  # the control failed: recorded, the process goes on
                leases, error = 0, f"{type(exc).__name__}: {exc}"
            self._log("expire", held, sim.sched.now(), leases=leases,
                      **({"error": error} if error else {}))
            self._go_on(held.process)

        process = sim.internal_process(f"aim-{held.target.index}")
        sim.sched.spawn(process.name, body, process)

    # -- in the scheduler's thread -------------------------------------------------------------

    def _timed(self, held: Held, reason: str) -> None:
        if self.held.get(held.process.pid) is not held:
            return
        details = ({"waited_for": aims.waited_for(held.target.aim, held.job)}
                   if reason == "deadline" else {})
        self._release(held, reason, **details)

    def _look(self) -> None:
        waiting = [h for h in self.held.values() if h.target.aim.kind == aims.TAKEOVER]
        if not waiting:
            self.looking = False
            return
        ops = self.sim.operations()
        for held in waiting:
            taken = aims.takeover(ops, held.job, held.t, held.process.role,
                                  held.process.pid) if held.job else None
            if taken is not None:
                process = self.sim.processes.get(taken.pid) if taken.pid else None
                self._release(held, aims.TAKEOVER, seen_t=taken.t, worker=taken.by,
                              by=process.name if process is not None else taken.by)
        sched = self.sim.sched
        sched.at(sched.now_us + sched.us(LOOK), self._look)

    def heal(self) -> None:
        """Stop holding anything new and let every held process go on."""
        self.healed = True
        for held in list(self.held.values()):
            self._release(held, "heal")

    def _release(self, held: Held, reason: str, **details: Any) -> None:
        self.held.pop(held.process.pid, None)
        if not held.process.alive:
            reason = "killed"
        self._go_on(held.process)
        now = self.sim.sched.now()
        self._log("release", held, now, reason=reason, held=round(now - held.t, 6), **details)

    def _go_on(self, process: Process) -> None:
        if process.alive:
            process.paused_until = min(process.paused_until, self.sim.sched.now_us)

    def _log(self, type_: str, which: Held, t: float, **details: Any) -> None:
        self.sim.record({"t": t, "src": "nemesis", "type": type_, "aim": which.target.index,
                         "point": which.point, "role": which.target.aim.role,
                         "job": which.job, "target": which.process.name,
                         "pid": which.process.pid, **details})
