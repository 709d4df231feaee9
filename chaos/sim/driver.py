"""One simulated run, engine-neutral: the schedule's shape, its processes and their respawns,
the crash and stall picks, the phases (chaos, heal, drain, check) and the collected result.

`Simulation` is the part every engine shares. What is the engine's own comes through a
subclass: how a worker or sender runs in a thread (`_worker_body`, `_sender_body`), the
observer and the submissions (`_prepare`), the controls the nemesis uses (`expire_leases`,
`hold_write_lock`, `submit`, `operate`), whether the store has settled (`_settled`), its
integrity check and its operations. `chaos.sim.threads` is that subclass for any adapter with
the contract's in-process hooks; the reference engine has its own in `chaos.reference`.

A schedule is fixed by (scenario, seed, engine) and the choices it made (see `choices`):
first which jobs, worker slots, sender slots and timeline faults take part (a seeded run
keeps them all; the shrinker leaves some out), then at every turn which thread runs and
whether an armed crash point fires where it stands.
"""
from __future__ import annotations

import random
import threading
import traceback
import time
from typing import Any, Callable

from chaos.spec import aim as aims
from chaos.engines import crashpoints
from chaos import history as hist
from chaos.checkers import run_checkers
from chaos.contract import EngineSettings, ProcessContext, process_counts
from chaos.run.expect import harness_snapshot, process_context
from chaos.run.nemesis import FaultPolicy
from chaos.sim.aim import SimAims
from chaos.sim.choices import Choices, everything
from chaos.sim.nemesis import SimNemesis
from chaos.sim.scheduler import CRASH, RUN, STALL as STALLED, Actor, PointHook, Process, Scheduler
from chaos.sim.spec import START, SimResult, SimSpec, plan_for
from chaos.sim.world import PROVIDER_URL, RECEIVER_URL, ClientErrors, SimProvider, SimReceiver

TICK = 0.01           # virtual seconds a turn takes: more than the checkers' 5 ms tolerance
STALL = 0.1           # virtual seconds a stalled thread is left waiting
STALL_CHANCE = 0.02   # a seeded schedule stalls a thread at this share of its picks
POLL = 0.02           # how often the drain looks for a settled store (as the runner does)
RESPAWN = 0.05        # virtual seconds before a dead process's slot is filled again
MAX_TURNS = 300_000   # a schedule that runs longer is cut (and reported as not drained)


class Simulation:
    """Builds and runs one schedule; `result()` collects it. Subclasses supply the engine's
    part (see the module docstring); `settings` is the engine's, in the harness's terms."""

    def __init__(self, spec: SimSpec, choices: Choices, db: str, settings: EngineSettings,
                 hooks: tuple[PointHook, ...], errors: ClientErrors) -> None:
        self.spec, self.scenario, self.choices = spec, spec.scenario, choices
        self.engine = spec.engine
        self.plan, self.all_documents = plan_for(spec.scenario, spec.seed, spec.engine.pipeline)
        self.db, self.settings = db, settings
        self.sched = Scheduler(START, TICK, STALL, self._choose, self._actor_ended,
                               self._process_ended, lambda a: self._crash_chance(a) > 0,
                               hooks=hooks)
        self.policy = FaultPolicy(self.scenario, self.plan, settings.send_timeout)
        # the engine's own points the scenario's names arm (roles resolved, "*": all), as a
        # real run arms them (chaos.engines.crashpoints)
        self.armed_points = frozenset(
            crashpoints.resolve(self.scenario.faults.crash_points, self.engine).armed)
        self.provider = SimProvider(self.sched, self.policy, errors)
        self.receiver = SimReceiver(self.sched, self.policy, errors)
        self.events: list[hist.Event] = []
        self.processes: dict[int, Process] = {}
        self.integrity: list[dict] = []
        self.phases: dict[str, Any] = {}
        self.errors: list[dict] = []
        self.spawned = 0
        self.chaos_on = True
        self.ended = False
        run = self.scenario.run
        self.chaos_start_us = 0
        self.heal_us = self.sched.us(run.chaos)
        self.drain_us = self.heal_us + self.sched.us(run.heal)
        # faults aimed at the engine's points (chaos.sim.aim), as a real run aims them
        self.aims = SimAims(self, aims.resolve(self.scenario.aims, self.engine))
        if self.aims.targets:
            self.sched.on_point = self.aims.at_point

    # -- the engine's part (subclasses) ---------------------------------------------------------

    def _prepare(self) -> None:
        """Install the observer and submit `self.documents`, recording each submit."""
        raise NotImplementedError

    def _worker_body(self, process: Process) -> Callable[[], None]:
        raise NotImplementedError

    def _sender_body(self, process: Process) -> Callable[[], None]:
        raise NotImplementedError

    def _settled(self) -> bool:
        raise NotImplementedError

    def _integrity(self) -> str | None:
        """The store's integrity check: "ok", the problems, or None (the engine has none)."""
        raise NotImplementedError

    def operations(self) -> list[hist.Event]:
        """The engine's operations, on the virtual clock."""
        raise NotImplementedError

    def expire_leases(self) -> int:
        """The lease_expiry fault: every held lease lapses now; how many."""
        raise NotImplementedError

    def hold_write_lock(self, seconds: float, held: Callable[[], None],
                        released: Callable[[], None]) -> None:
        """The contention fault, in its own actor: take the write lock, call `held()`, keep
        it `seconds` virtual seconds, let it go, call `released()`."""
        raise NotImplementedError

    def submit(self, job: str, payload: Any) -> str:
        """Submit again (a duplicate): "created", "exists" or "rejected"."""
        raise NotImplementedError

    def operate(self, action: str, job: str) -> str:
        """An operator action: "done" or "refused: why"."""
        raise NotImplementedError

    # -- the schedule's shape -------------------------------------------------------------------

    def _decide_shape(self) -> None:
        """Which jobs, worker and sender slots and timeline faults take part."""
        keep = lambda: self.choices.choose(2, everything(2), shape=True) == 1  # noqa: E731
        docs = self.all_documents
        jobs = [(job, payload) for job, payload in docs if keep()] or docs[:1]
        self.documents = dict(jobs)
        self.job_ids = [job for job, _ in jobs]
        run = self.scenario.run
        self.worker_slots = [s for s in range(run.workers) if keep()] or [0]
        senders = process_counts(run, self.engine)["sender"]  # none for an engine without outbox
        self.sender_slots = [s for s in range(senders) if keep()] or ([0] if senders else [])
        self.timeline = [e for e in self.plan.timeline
                         if e.get("job", self.job_ids[0]) in self.documents and keep()]
        self.shape_choices = len(self.choices.record)

    def record(self, event: hist.Event) -> None:
        event.setdefault("seq", len(self.events))
        self.events.append(event)

    def record_submit(self, job: str, payload: Any, result: str, duplicate: bool) -> None:
        self.record({"t": self.sched.now(), "src": "runner", "type": "submit", "job": job,
                     "payload_hash": hist.payload_hash(payload), "result": result,
                     "duplicate": duplicate})

    def _start(self) -> None:
        for slot in self.worker_slots:
            self._spawn("worker", slot)
        for slot in self.sender_slots:
            self._spawn("sender", slot)
        self._phase("chaos")
        self.nemesis = SimNemesis(self, self.timeline)
        process = self.internal_process("nemesis")
        self.nemesis.actor = self.sched.spawn(process.name, self.nemesis.run, process)
        self.sched.at(self.heal_us, self._heal)
        self.sched.at(self.drain_us, self._drain)

    def _slot_events(self, slot: int) -> None:
        """The runner's per-slot records: a skewed clock, heartbeat off."""
        now, ctx = self.sched.now(), self.slot_context(slot)
        if ctx.clock_skew:
            self.record({"t": now, "src": "nemesis", "type": "skew", "slot": slot,
                         "seconds": ctx.clock_skew})
        if ctx.heartbeat is False:
            self.record({"t": now, "src": "nemesis", "type": "heartbeat_off", "slot": slot,
                         "call_timeout": ctx.call_timeout})

    def slot_context(self, slot: int, role: str = "worker") -> ProcessContext:
        """The per-slot settings a real run gives (chaos.run.expect.process_context)."""
        return process_context(self.scenario, self.plan, self.settings, role, slot, self.db,
                               PROVIDER_URL, RECEIVER_URL)

    def skew(self, slot: int) -> float:
        """The clock skew of worker slot `slot` (seconds)."""
        return self.slot_context(slot).clock_skew

    def heartbeat_off(self, slot: int) -> bool:
        """Whether worker slot `slot` runs without heartbeat."""
        return self.slot_context(slot).heartbeat is False

    def internal_process(self, name: str) -> Process:
        """A process of the harness's own (the nemesis, a lock holder): no lifecycle events."""
        return Process(pid=0, role="nemesis", slot=0, name=name)

    # -- engine processes -----------------------------------------------------------------------

    def _spawn(self, role: str, slot: int) -> None:
        self.spawned += 1
        pid = self.spawned
        process = Process(pid=pid, role=role, slot=slot, name=f"{role}-{slot}.{pid}")
        process.data["armed"] = self.chaos_on
        self.processes[pid] = process
        self.record({"t": self.sched.now(), "src": "process", "type": "spawn",
                     "name": process.name, "role": role, "slot": slot, "pid": pid,
                     "code": None, "signal": None})
        if role == "worker":
            self._slot_events(slot)
        body = self._worker_body(process) if role == "worker" else self._sender_body(process)
        self.sched.spawn(process.name, body, process)

    def point_job(self, actor: Actor) -> str | None:
        """The job `actor` works on at the point it reached (called in its thread)."""
        return job_of(actor)

    def rng(self, process: Process) -> random.Random:
        """The process's own random source, fixed by the seed and its pid."""
        return random.Random(f"{self.spec.seed}:{process.role}:{process.pid}")

    def live(self) -> list[Process]:
        return [p for p in self.processes.values() if p.alive]

    def kill(self, process: Process, point: str | None, actor: Actor | None = None) -> None:
        """SIGKILL `process` (at crash point `point`, when one fired in `actor`)."""
        if not process.alive:
            return
        if point is not None:
            self.record({"t": self.sched.now(), "src": "process", "type": "crashpoint",
                         "pid": process.pid, "role": process.role, "point": point,
                         "job": job_of(actor) if actor else process.data.get("job")})
        process.data["exit"] = (-9, "SIGKILL")
        self.sched.kill(process)

    # -- the scheduler's callbacks ----------------------------------------------------------------

    def _choose(self, eligible: list[Actor]) -> tuple[int, str]:
        """One pick: which due actor, and whether it runs, stalls or crashes where it stands
        (an armed crash point firing). Options: run 0..n-1, stall n..2n-1, then a crash for
        each actor parked at an armed point; 0 is the simplest."""
        n = len(eligible)
        chances = [self._crash_chance(a) for a in eligible]
        crashable = [i for i, p in enumerate(chances) if p > 0]
        stalls = 0 if self.sched.atomic_pick else n

        def sample(rng: random.Random) -> int:
            i = rng.randrange(n)
            if chances[i] > 0 and rng.random() < chances[i]:
                return n + stalls + crashable.index(i)
            return i + n if stalls and rng.random() < STALL_CHANCE else i

        value = self.choices.choose(n + stalls + len(crashable), sample)
        if value >= n + stalls:
            index, how = crashable[value - n - stalls], CRASH
        else:
            index, how = value % n, (STALLED if value >= n else RUN)
        actor = eligible[index]
        if how == CRASH or (how == RUN and self._crash_loops(actor)):
            self.kill(actor.process, actor.point, actor)
            return index, CRASH
        if how == STALLED:
            # A stalled thread is the simulation's loaded machine: recorded, so that a check
            # with a deadline can tell a late process from a slow engine.
            self.record({"t": self.sched.now(), "src": "process", "type": "stall",
                         "pid": actor.process.pid, "name": actor.process.name,
                         "role": actor.process.role, "thread": actor.name, "seconds": STALL})
        return index, how

    def _crash_chance(self, actor: Actor) -> float:
        f, process = self.scenario.faults, actor.process
        if (actor.point is None or not self.armed_points or process.role == "nemesis"
                or not process.data.get("armed")):
            return 0.0
        if crashpoints.ALL in self.armed_points or actor.point in self.armed_points:
            return f.crash_point_probability
        return 0.0

    def _crash_loops(self, actor: Actor) -> bool:
        """A crash-looping document kills its worker every time it passes the engine's
        crash-loop point (as NINELIVES_CRASH_JOBS does in a real run)."""
        return (actor.point == getattr(self.engine, "crash_loop_point", None)
                and actor.process.role == "worker"
                and job_of(actor) in self.plan.crash_loop)

    def _thread_raised(self, args: threading.ExceptHookArgs) -> None:
        """A thread outside the scheduler's actors raised (an engine thread the simulation
        does not run, say): recorded with no process, as the simulation's own failure to
        run the engine faithfully, never a silent pass."""
        name = args.thread.name if args.thread is not None else "?"
        self.errors.append({"t": self.sched.now(), "process": None, "thread": name,
                            "traceback": "".join(traceback.format_exception(
                                args.exc_type, args.exc_value, args.exc_traceback))})

    def _actor_ended(self, actor: Actor) -> None:
        process = actor.process
        if actor.exit == "error":
            self.errors.append({"t": self.sched.now(), "process": process.name,
                                "thread": actor.name, "traceback": actor.error})
        if actor.exit == "stop" or process.role == "nemesis" or not process.alive:
            return
        if actor is not process.actors[0]:
            return  # a helper thread that ended (by itself, or raising) leaves its process
        process.data.setdefault("exit", (1, None) if actor.exit == "error" else (0, None))
        self.sched.kill(process)

    def _process_ended(self, process: Process) -> None:
        if process.role == "nemesis":
            return
        code, sig = process.data.get("exit", (0, None))
        now = self.sched.now()
        # Killed: by a signal the harness sent (a kill, a crash point), or at the shutdown. A
        # process whose main thread returned or raised during the run ended by itself, as a
        # real one would, and processes-survive says so.
        self.record({"t": now, "src": "process", "type": "exit", "name": process.name,
                     "role": process.role, "pid": process.pid, "code": code, "signal": sig,
                     "killed": sig is not None or self.ended})
        if sig == "SIGKILL":
            self._check_integrity(f"kill of {process.name}")
        if not self.ended:
            role, slot = process.role, process.slot
            self.sched.at(self.sched.now_us + self.sched.us(RESPAWN),
                          lambda: self.ended or self._spawn(role, slot))

    # -- phases ---------------------------------------------------------------------------------

    def _phase(self, name: str) -> None:
        now = self.sched.now()
        self.phases[f"{name}_start"] = now
        self.record({"t": now, "src": "runner", "type": "phase", "phase": name})

    def _heal(self) -> None:
        self._phase("heal")
        self.chaos_on = False
        self.aims.heal()
        self.nemesis.heal()

    def _drain(self) -> None:
        self._phase("drain")
        self.drain_deadline_us = self.sched.now_us + self.sched.us(self.scenario.run.drain)
        self._settle_check()

    def _settle_check(self) -> None:
        if self._settled():
            return self._end(True)
        if self.sched.now_us >= self.drain_deadline_us:
            return self._end(False)
        self.sched.at(self.sched.now_us + self.sched.us(POLL), self._settle_check)

    def _check_integrity(self, after: str) -> None:
        result = self._integrity()
        if result is not None:
            self.integrity.append({"t": self.sched.now(), "after": after, "result": result})

    def _end(self, drained: bool) -> None:
        self._phase("check")
        self.phases["drain_end"] = self.phases["check_start"]
        self.phases["drained"] = drained
        self.ended = True
        self.sched.finished = True

    # -- the run --------------------------------------------------------------------------------

    def run(self) -> None:
        self._decide_shape()
        self._prepare()
        self._start()
        saved, threading.excepthook = threading.excepthook, self._thread_raised
        try:
            self.sched.run(MAX_TURNS)
        finally:
            threading.excepthook = saved
        if not self.ended:  # cut by the turn budget, or nothing could run any more
            self.phases.setdefault("drain_start", self.sched.now())
            self.phases.setdefault("heal_start", self.sched.now())
            self.phases["cut"] = f"after {self.sched.turns} turns"
            self._end(False)
        self.sched.stop_all()
        now = self.sched.now()
        for process in self.live():
            process.alive = False
            self.record({"t": now, "src": "process", "type": "exit", "name": process.name,
                         "role": process.role, "pid": process.pid, "code": 0, "signal": None,
                         "killed": True})
        self.phases["processes_ended"] = now

    def result(self, started: float) -> SimResult:
        """Collect the history, the snapshot and the verdicts."""
        provider = [_ledger_event(e, "provider", "call") for e in self.provider.entries]
        receiver = [_ledger_event(e, "receiver", "request") for e in self.receiver.entries]
        history = hist.merge(self.operations(), provider, receiver, self.events)
        snapshot = self._snapshot()
        verdicts = run_checkers(history, snapshot)
        return SimResult(
            spec=self.spec, plan=self.plan, choices=list(self.choices.record),
            shape_choices=self.shape_choices, history=history,
            snapshot=snapshot, verdicts=verdicts, applied=self.nemesis.applied,
            turns=self.sched.turns, virtual_seconds=round(self.sched.now() - START, 6),
            wall_seconds=time.perf_counter() - started, errors=self.errors,
            ledgers={"provider": self.provider.entries, "receiver": self.receiver.entries},
            events=self.events, db=self.db)

    def _snapshot(self) -> dict[str, Any]:
        engine = self.engine
        snap = engine.snapshot(self.db)
        self._check_integrity("end")
        snap.update(harness_snapshot(self.scenario, self.plan, engine, self.settings,
                                     integrity=self.integrity,
                                     receiver_applied=self.receiver.effects,
                                     phases=self.phases, jobs=self.job_ids, clock="virtual"))
        return snap


def job_of(actor: Actor) -> str | None:
    """The job `actor` works on: its own where the engine notes it per thread (a process with
    job slots works several at once), else its process's."""
    return actor.data.get("job", actor.process.data.get("job"))


def _ledger_event(entry: dict, src: str, type_: str) -> hist.Event:
    event = {**entry, "t": entry["t_start"], "src": src, "type": type_}
    event.pop("server", None)
    return event
