"""The reference engine in a simulation: its workers and senders as scheduled threads against
a real SQLite file (the engine-neutral rest of a simulated run is `chaos.sim.driver`).

A worker process runs the engine's own job slots (`engine.slots.Slots`, `slots` of them): each
slot a thread of the process with its own store, the one heartbeat thread of the process, and
the group commit whose followers wait on a condition that is a scheduling point; all of them
actors of the process, killed with it at once, on the virtual clock, so a bug in any of them
shows in simulation too. A thread that finds the write lock taken (a contention fault holds
it) waits on the virtual clock (the store's `wait_clock`), a scheduling point like any
other. Databases use synchronous=NORMAL (a simulation tests interleavings, not
durability) and live in /dev/shm when there is one.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import random
import shutil
import sqlite3
import time
from typing import Any, Callable

from engine import Sender, hooks, load_config
from engine.slots import Slots
from engine.store import OperatorError, SubmissionConflict
from engine.worker import Worker

from chaos.sim.choices import Choices
from chaos.sim.driver import Simulation
from chaos.sim.scheduler import Process, VirtualClock
from chaos.sim.spec import SimResult, SimSpec, scratch_dir
from chaos.sim.threads import SimCondition, SimThread
from chaos.reference import audit, observer
from chaos.reference.leases import expire_leases
from chaos.reference.inprocess.patches import in_process
from chaos.reference.inprocess.world import (EngineErrors, EngineHooks, PROVIDER_URL, RECEIVER_URL,
                    install_audit, routed, sim_store)


class SimWorker(Worker):
    """The engine's worker (one job slot), tying its store to the thread that runs it and
    noting the job it works on where the crash handler can see it."""

    process: Process
    sim: "ReferenceSimulation"

    def run(self, *args, **kwargs):
        self.actor = self.sim.sched.current
        self.sim.own(self.store)  # Slots opened it in the process's main thread
        return super().run(*args, **kwargs)

    def work(self, claim):
        self.process.data["job"] = self.actor.data["job"] = claim.job_id
        return super().work(claim)


class ReferenceSimulation(Simulation):
    """One schedule of the reference engine; `workdir` holds the database."""

    def __init__(self, spec: SimSpec, choices: Choices, workdir: str) -> None:
        db = os.path.join(workdir, "engine.db")
        self.pipeline = spec.engine.engine_pipeline  # the engine's own, for its classes
        self.config = load_config(env={}, overrides={
            **spec.scenario.engine, "db": db,
            "synchronous": "NORMAL", "seed": spec.seed, "provider_url": PROVIDER_URL,
            "receiver_url": RECEIVER_URL})
        super().__init__(spec, choices, db, spec.engine.settings(spec.scenario.engine),
                         (EngineHooks(),), EngineErrors())

    def point_job(self, actor) -> str | None:
        """The job the engine notes for the calling thread (a worker's slot, a sender's
        row), else the one the simulation noted."""
        return hooks.current_job() or super().point_job(actor)

    # -- set-up ---------------------------------------------------------------------------------

    def open_store(self, who: str):
        return sim_store(self.db, self.sched, self.config.busy_timeout,
                         f"{self.spec.seed}:store:{who}")

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
            self.record_submit(job, payload, "created" if created else "exists", False)

    def _start(self) -> None:
        super()._start()
        self.nemesis.actor.in_transaction = lambda: self.nemesis_store.conn.in_transaction

    def _slot_config(self, slot: int):
        if not self.heartbeat_off(slot):
            return self.config
        timeout = min(self.config.call_timeout, self.config.lease * 0.8)
        return dataclasses.replace(self.config, heartbeat=False, call_timeout=timeout).validate()

    # -- engine processes -----------------------------------------------------------------------

    def _worker_body(self, process: Process) -> Callable[[], None]:
        def body() -> None:
            slot, pid = process.slot, process.pid
            config = self._slot_config(slot)
            clock = VirtualClock(self.sched, self.skew(slot))
            # The engine's own job slots (engine.slots): its slot threads, group commit and
            # shared heartbeat, as a real worker process runs them; the simulation gives it
            # only its threads, condition, stores and clocks.
            workers = self._slot_workers(process, config, clock)
            slots = Slots(config, self._slot_stores(process), workers, clock=clock,
                          worker_id=f"worker:sim:{pid}:{slot}", thread=self._thread_of(process),
                          condition=lambda: SimCondition(self.sched))
            slots.run()
        return body

    def _slot_stores(self, process: Process) -> Callable[[], Any]:
        """Opens each slot's store in the process's main thread (as Slots does), each with a
        lock-wait source of its own; closed with the main thread unless the slot's own thread
        took it over (SimWorker.run): a slot killed before it ran leaves no open file."""
        opened = []
        main = self.sched.current

        def open_store():
            who = f"worker:{process.pid}" + (f"/{len(opened)}" if opened else "")
            store = self.open_store(who)
            opened.append(store)
            main.cleanup.append(lambda: getattr(store, "sim_owner", main) is main
                                and store.close())
            return store
        return open_store

    def _slot_workers(self, process: Process, config, clock) -> Callable[..., SimWorker]:
        """Builds each slot's Worker as engine.slots.Slots asks; its random source is the
        process's own (slot 0, as with one slot) or fixed by seed, pid and slot."""
        made: list[SimWorker] = []

        def make_worker(store, *, rng, **kwargs) -> SimWorker:
            k = len(made)
            rng = self.rng(process) if k == 0 else random.Random(
                f"{self.spec.seed}:worker:{process.pid}/{k}")
            worker = SimWorker(store, config, pipeline=self.pipeline, clock=clock, rng=rng,
                               **self._heartbeat_parts(process), **kwargs)
            worker.process, worker.sim = process, self
            made.append(worker)
            return worker
        return make_worker

    def _thread_of(self, process: Process) -> Callable[..., SimThread]:
        """The engine's threads (a slot, the heartbeat) as actors of `process`; a join (the
        main thread's, of its slots) is woken when the thread ends."""
        def thread(target, name=None, args=(), kwargs=None, daemon=None):
            return SimThread(self.sched, process, target, name, args, kwargs, wake_joiners=True)
        return thread

    def _heartbeat_parts(self, process: Process) -> dict[str, Any]:
        """What the engine's own heartbeat runs on here: a thread that is an actor of the
        worker's process, its own store, and the virtual clock for its intervals."""
        def open_store():  # in the heartbeat's thread, as the engine opens it
            store = self.open_store(f"heartbeat:{process.pid}")
            self.own(store)
            return store

        return {"beat_store": open_store, "beat_thread": self._thread_of(process),
                "monotonic": self.sched.now}

    def _sender_body(self, process: Process) -> Callable[[], None]:
        def body() -> None:
            pid, slot = process.pid, process.slot
            store = self.open_store(f"sender:{pid}")
            self.own(store)
            sender = Sender(store, self.config, clock=VirtualClock(self.sched),
                            rng=self.rng(process), sender_id=f"sender:sim:{pid}:{slot}")
            sender.run()
        return body

    def own(self, store) -> None:
        """Tie `store` to the running thread, which opened it or works with it: its open
        transaction keeps the thread from being preempted, and it is closed when the thread
        ends (as a dead process's files are, which rolls back what it had not committed)."""
        actor = self.sched.current
        if actor is not None:
            store.sim_owner = actor
            actor.cleanup.append(store.close)
            actor.in_transaction = lambda: store.conn.in_transaction

    # -- the store ------------------------------------------------------------------------------

    def _settled(self) -> bool:
        conn = self.runner_store.conn
        done = set(self.pipeline.terminal) | set(self.pipeline.parked_states)
        states = [s for (s,) in conn.execute("SELECT DISTINCT state FROM job")]
        unsent = conn.execute("SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL AND"
                              " dead_at IS NULL").fetchone()[0]
        return unsent == 0 and all(s in done for s in states)

    def _integrity(self) -> str:
        return "; ".join(r[0] for r in self.runner_store.conn.execute("PRAGMA integrity_check"))

    def operations(self):
        rows = audit.read_audit(self.runner_store.conn)
        return observer.operations(rows, self.engine.pipeline)

    def _snapshot(self) -> dict[str, Any]:
        snap = super()._snapshot()
        with self.runner_store.write() as conn:  # a saved engine.db must take engine writes,
            audit.uninstall(conn)                # which no virtual clock will stamp
        return snap

    # -- the nemesis's controls -----------------------------------------------------------------

    def expire_leases(self) -> int:
        with self.nemesis_store.write() as conn:
            return expire_leases(conn, self.sched.now())

    def hold_write_lock(self, seconds: float, held, released) -> None:
        sched = self.sched
        conn = sqlite3.connect(self.db, timeout=0, isolation_level=None)
        try:
            while True:
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    break
                except sqlite3.OperationalError:
                    sched.sleep(0.002)
            held()
            sched.sleep(seconds)
            conn.execute("ROLLBACK")
            released()
        finally:
            conn.close()

    def submit(self, job: str, payload: Any) -> str:
        try:
            created = self.nemesis_store.submit(job, self.pipeline, payload, self.sched.now())
            return "created" if created else "exists"
        except SubmissionConflict:
            return "rejected"

    def operate(self, action: str, job: str) -> str:
        try:
            getattr(self.nemesis_store, action)(job, "operator:chaos", self.sched.now())
            return "done"
        except OperatorError as exc:
            return f"refused: {exc}"


def simulate(spec: SimSpec, choices: Choices, *, keep_db: str | None = None) -> SimResult:
    """Run one schedule of `spec` with decisions from `choices`; return its result.

    keep_db: copy the finished database to this path (the scratch copy is always removed).
    """
    started = time.perf_counter()
    engine = in_process(spec.engine, spec.engine_spec)
    quiet = logging.NullHandler()  # the engine's log lines (a lost lease) are its own, not
    logging.getLogger("ninelives").addHandler(quiet)  # the sim's output
    workdir = scratch_dir()
    try:
        sim = ReferenceSimulation(spec, choices, workdir)
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
        logging.getLogger("ninelives").removeHandler(quiet)
        shutil.rmtree(workdir, ignore_errors=True)
