"""One simulated run: the real engine's workers and senders as scheduled threads against a
real SQLite file, the fault plan applied on virtual time, then the same history, snapshot
and checkers as a real run.

A schedule is fixed by (scenario, seed, engine) and the choices it made (see `choices`):
first which jobs, worker slots, sender slots and timeline faults take part (a seeded run
keeps them all; the shrinker leaves some out), then at every turn which thread runs and
whether an armed crash point fires where it stands.

Heartbeats are simulated (`world.SimHeartbeat`: an actor per worker on the virtual clock),
never the engine's real-time thread. A thread is never preempted inside a write transaction
except to crash it there (see `scheduler`); a thread that finds the write lock taken (a
contention fault holds it) waits on the virtual clock (the store's `wait_clock`), a
scheduling point like any other. Databases use synchronous=NORMAL (a simulation tests
interleavings, not durability) and live in /dev/shm when there is one.
"""
from __future__ import annotations

import dataclasses
import os
import random
import shutil
import time
from typing import Any, Callable

from engine import Sender, load_config
from engine.worker import Worker

from ... import history as hist
from ...checkers import run_checkers
from ...expect import harness_snapshot
from ...nemesis import FaultPolicy
from ...sim.choices import Choices, everything
from ...sim.scheduler import (CRASH, RUN, STALL as STALLED, Actor, Process, Scheduler,
                              VirtualClock)
from ...sim.spec import START, SimResult, SimSpec, plan_for, scratch_dir
from .. import audit, observer
from .nemesis import SimNemesis
from .patches import in_process
from .world import (EngineErrors, EngineHooks, PROVIDER_URL, RECEIVER_URL, SimHeartbeat, SimProvider, SimReceiver,
                    install_audit, routed, sim_store)

TICK = 0.01           # virtual seconds a turn takes: more than the checkers' 5 ms tolerance
STALL = 0.1           # virtual seconds a stalled thread is left waiting
STALL_CHANCE = 0.02   # a seeded schedule stalls a thread at this share of its picks
POLL = 0.02           # how often the drain looks for a settled database (as the runner does)
RESPAWN = 0.05        # virtual seconds before a dead process's slot is filled again
MAX_TURNS = 300_000   # a schedule that runs longer is cut (and reported as not drained)


class SimWorker(Worker):
    """The engine's worker, noting the job it works on where the crash handler can see it."""

    process: Process

    def work(self, claim):
        self.process.data["job"] = claim.job_id
        return super().work(claim)


class Simulation:
    """Builds and runs one schedule; `result()` collects it. `workdir` holds the database."""

    def __init__(self, spec: SimSpec, choices: Choices, workdir: str) -> None:
        self.spec, self.scenario, self.choices = spec, spec.scenario, choices
        self.plan, self.all_documents = plan_for(spec.scenario, spec.seed, spec.engine.pipeline)
        self.db = os.path.join(workdir, "engine.db")
        self.pipeline = spec.engine.engine_pipeline  # the engine's own, for its classes
        self.config = load_config(env={}, overrides={
            **self.scenario.engine, "db": self.db,
            "synchronous": "NORMAL", "seed": spec.seed, "provider_url": PROVIDER_URL,
            "receiver_url": RECEIVER_URL})
        self.sched = Scheduler(START, TICK, STALL, self._choose, self._actor_ended,
                               self._process_ended, lambda a: self._crash_chance(a) > 0,
                               hooks=(EngineHooks(),))
        self.policy = FaultPolicy(self.scenario, self.plan, self.config.send_timeout)
        self.provider = SimProvider(self.sched, self.policy, EngineErrors())
        self.receiver = SimReceiver(self.sched, self.policy, EngineErrors())
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
        self.sender_slots = [s for s in range(run.senders) if keep()] or (
            [0] if run.senders else [])
        self.timeline = [e for e in self.plan.timeline
                         if e.get("job", self.job_ids[0]) in self.documents and keep()]
        self.shape_choices = len(self.choices.record)

    # -- set-up ---------------------------------------------------------------------------------

    def open_store(self, who: str):
        return sim_store(self.db, self.sched, self.config.busy_timeout,
                         f"{self.spec.seed}:store:{who}")

    def record(self, event: hist.Event) -> None:
        event.setdefault("seq", len(self.events))
        self.events.append(event)

    def open_harness_stores(self) -> None:
        """The stores of the harness's own roles (the runner, the nemesis), opened before the
        engine under test is patched in: in a real run they live in the harness's process,
        which no mutant changes."""
        self.runner_store = self.open_store("runner")
        self.nemesis_store = self.open_store("nemesis")

    def close_harness_stores(self) -> None:
        self.runner_store.close()
        self.nemesis_store.close()

    def _prepare(self) -> None:
        with self.runner_store.write() as conn:
            install_audit(conn)
        now = self.sched.now()
        for job, payload in self.documents.items():
            created = self.runner_store.submit(job, self.pipeline, payload, now)
            self.record({"t": now, "src": "runner", "type": "submit", "job": job,
                         "payload_hash": hist.payload_hash(payload),
                         "result": "created" if created else "exists", "duplicate": False})

    def _start(self) -> None:
        for slot in self.worker_slots:
            self._spawn("worker", slot)
        for slot in self.sender_slots:
            self._spawn("sender", slot)
        self._phase("chaos")
        self.nemesis = SimNemesis(self, self.timeline, self.nemesis_store)
        process = self.internal_process("nemesis")
        actor = self.sched.spawn(process.name, self.nemesis.run, process)
        actor.in_transaction = lambda: self.nemesis_store.conn.in_transaction
        self.sched.at(self.heal_us, self._heal)
        self.sched.at(self.drain_us, self._drain)

    def _slot_events(self, slot: int) -> None:
        """The runner's per-slot records: a skewed clock, heartbeat off."""
        now = self.sched.now()
        if self._skew(slot):
            self.record({"t": now, "src": "nemesis", "type": "skew", "slot": slot,
                         "seconds": self._skew(slot)})
        if self._heartbeat_off(slot):
            self.record({"t": now, "src": "nemesis", "type": "heartbeat_off", "slot": slot,
                         "call_timeout": self._slot_config(slot).call_timeout})

    def _skew(self, slot: int) -> float:
        return self.plan.skewed[slot] if slot < len(self.plan.skewed) else 0.0

    def _heartbeat_off(self, slot: int) -> bool:
        run, f = self.scenario.run, self.scenario.faults
        return slot >= run.workers - f.heartbeat_off_workers

    def _slot_config(self, slot: int):
        if not self._heartbeat_off(slot):
            return self.config
        timeout = min(self.config.call_timeout, self.config.lease * 0.8)
        return dataclasses.replace(self.config, heartbeat=False, call_timeout=timeout).validate()

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

    def _worker_body(self, process: Process) -> Callable[[], None]:
        def body() -> None:
            slot, pid, seed = process.slot, process.pid, self.spec.seed
            config = self._slot_config(slot)
            clock = VirtualClock(self.sched, self._skew(slot))
            store = self.open_store(f"worker:{pid}")
            self.own(store)
            worker = SimWorker(store, config, pipeline=self.pipeline, clock=clock,
                               rng=random.Random(f"{seed}:worker:{pid}"),
                               worker_id=f"worker:sim:{pid}:{slot}")
            worker.process = process
            if config.heartbeat:
                worker.heartbeat = self._heartbeat(process, clock, config, worker.id)
            worker.run()
        return body

    def _heartbeat(self, process: Process, clock: VirtualClock, config,
                   worker_id: str) -> SimHeartbeat:
        beat = SimHeartbeat(self.sched, clock, config.lease, config.beat_every, worker_id)

        def open_store():  # at the first beat: most steps end before one is due
            store = self.open_store(f"heartbeat:{process.pid}")
            self.own(store)
            return store

        def body() -> None:
            beat.open_store = open_store
            beat.run()

        beat.actor = self.sched.spawn(f"{process.name}/heartbeat", body, process)
        return beat

    def _sender_body(self, process: Process) -> Callable[[], None]:
        def body() -> None:
            pid, slot = process.pid, process.slot
            store = self.open_store(f"sender:{pid}")
            self.own(store)
            sender = Sender(store, self.config, clock=VirtualClock(self.sched),
                            rng=random.Random(f"{self.spec.seed}:sender:{pid}"),
                            sender_id=f"sender:sim:{pid}:{slot}")
            sender.run()
        return body

    def own(self, store) -> None:
        """Tie `store` to the running thread, which opened it: its open transaction keeps the
        thread from being preempted, and it is closed when the thread ends (as a dead
        process's files are)."""
        actor = self.sched.current
        if actor is not None:
            actor.cleanup.append(store.close)
            actor.in_transaction = lambda: store.conn.in_transaction

    def live(self) -> list[Process]:
        return [p for p in self.processes.values() if p.alive]

    def kill(self, process: Process, point: str | None) -> None:
        """SIGKILL `process` (at crash point `point`, when one fired)."""
        if not process.alive:
            return
        if point is not None:
            self.record({"t": self.sched.now(), "src": "process", "type": "crashpoint",
                         "pid": process.pid, "role": process.role, "point": point,
                         "job": process.data.get("job")})
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
            self.kill(actor.process, actor.point)
            return index, CRASH
        return index, how

    def _crash_chance(self, actor: Actor) -> float:
        f, process = self.scenario.faults, actor.process
        if (actor.point is None or not f.crash_points or process.role == "nemesis"
                or not process.data.get("armed")):
            return 0.0
        if "*" in f.crash_points or actor.point in f.crash_points:
            return f.crash_point_probability
        return 0.0

    def _crash_loops(self, actor: Actor) -> bool:
        """A crash-looping document kills its worker after every call (engine.hooks.KillOnJobs)."""
        return (actor.point == "worker.after_call" and actor.process.role == "worker"
                and actor.process.data.get("job") in self.plan.crash_loop)

    def _actor_ended(self, actor: Actor) -> None:
        process = actor.process
        if actor.exit == "error":
            self.errors.append({"t": self.sched.now(), "process": process.name,
                                "thread": actor.name, "traceback": actor.error})
        if actor.exit == "stop" or process.role == "nemesis" or not process.alive:
            return
        process.data.setdefault("exit", (1, None) if actor.exit == "error" else (0, None))
        self.sched.kill(process)

    def _process_ended(self, process: Process) -> None:
        if process.role == "nemesis":
            return
        code, sig = process.data.get("exit", (0, None))
        now = self.sched.now()
        self.record({"t": now, "src": "process", "type": "exit", "name": process.name,
                     "role": process.role, "pid": process.pid, "code": code, "signal": sig,
                         "killed": True})
        if sig == "SIGKILL":
            self.integrity.append({"t": now, "after": f"kill of {process.name}",
                                   "result": self._integrity()})
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

    def _settled(self) -> bool:
        conn = self.runner_store.conn
        done = set(self.pipeline.terminal) | set(self.pipeline.parked_states)
        states = [s for (s,) in conn.execute("SELECT DISTINCT state FROM job")]
        unsent = conn.execute("SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL AND"
                              " dead_at IS NULL").fetchone()[0]
        return unsent == 0 and all(s in done for s in states)

    def _end(self, drained: bool) -> None:
        self._phase("check")
        self.phases["drain_end"] = self.phases["check_start"]
        self.phases["drained"] = drained
        self.ended = True
        self.sched.finished = True

    def _integrity(self) -> str:
        return "; ".join(r[0] for r in self.runner_store.conn.execute("PRAGMA integrity_check"))

    # -- the run --------------------------------------------------------------------------------

    def run(self) -> None:
        self._decide_shape()
        self._prepare()
        self._start()
        self.sched.run(MAX_TURNS)
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
        rows = audit.read_audit(self.runner_store.conn)
        history = hist.merge(observer.operations(rows, self.spec.engine.pipeline), provider,
                             receiver, self.events)
        snapshot = self._snapshot()
        with self.runner_store.write() as conn:  # a saved engine.db must take engine writes,
            audit.uninstall(conn)                # which no virtual clock will stamp
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
        engine = self.spec.engine
        snap = engine.snapshot(self.db)
        self.integrity.append({"t": self.sched.now(), "after": "end",
                               "result": self._integrity()})
        snap.update(harness_snapshot(self.scenario, self.plan, engine,
                                     engine.settings(self.scenario.engine),
                                     integrity=self.integrity,
                                     receiver_applied=self.receiver.effects,
                                     phases=self.phases, jobs=self.job_ids))
        return snap


def _ledger_event(entry: dict, src: str, type_: str) -> hist.Event:
    event = {**entry, "t": entry["t_start"], "src": src, "type": type_}
    event.pop("server", None)
    return event


def simulate(spec: SimSpec, choices: Choices, *, keep_db: str | None = None) -> SimResult:
    """Run one schedule of `spec` with decisions from `choices`; return its result.

    keep_db: copy the finished database to this path (the scratch copy is always removed).
    """
    started = time.perf_counter()
    engine = in_process(spec.engine, spec.engine_spec)
    workdir = scratch_dir()
    try:
        sim = Simulation(spec, choices, workdir)
        sim.open_harness_stores()
        try:
            with engine, routed(sim.provider, sim.receiver):
                try:
                    sim.run()
                finally:
                    sim.sched.stop_all()
            result = sim.result(started)
        finally:
            sim.close_harness_stores()
        if keep_db:
            shutil.copyfile(sim.db, keep_db)
        result.db = keep_db
        return result
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
