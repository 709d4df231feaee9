"""`ninelives sim` for an engine the harness did not write: its own worker and sender loops,
run as scheduled threads through the adapter's in-process hooks.

An adapter with the `in_process` capability and no `simulate` of its own gives `in_process`,
an object with (see `InProcess`):

  errors              what the engine's HTTP client raises for an error status, a dropped
                      connection and a timeout (`chaos.sim.world.ClientErrors`)
  route(post)         a context manager during which the engine's HTTP posts are answered by
                      `post(url, body, headers, timeout) -> (status, parsed JSON body)`, which
                      raises `errors`' exceptions instead of answering, as the client would
  install(db, now_sql)  the observer, stamping every write with the SQL expression `now_sql`
  worker(proc), sender(proc)
                      run one process's loop in the calling thread until the simulation
                      ends it (`proc` is a `SimProcess`: its settings, clock, random source,
                      and the threading primitives its helper threads must use)

and the adapter's `submit`, `operator` and `expire_leases` take `now=`, the time to write.

The engine's code runs as it would in a process of its own: its clock is the process's
virtual clock (`proc.now`), its threads are actors of the process (`proc.thread`, killed with
it), its waits are virtual (`proc.event`, `proc.condition`), its SQLite connections are the
simulation's (`chaos.sim.sqlite`: virtual timestamps and lock waits, rolled back when the
process dies), its crash points are the probe's (`chaos.probe`), where the scheduler may hand
the turn to another thread or kill the process. An engine that keeps settings or identity in
module globals needs a copy of its modules per process (the article engine's adapter shows
how).
"""
from __future__ import annotations

import os
import random
import shutil
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Protocol

from chaos import history as hist
from chaos import probe
from chaos.contract import ProcessContext, has, submitter
from chaos.run.expect import settled
from chaos.sim.choices import Choices
from chaos.sim.driver import Simulation
from chaos.sim.scheduler import INF, Actor, Process, Scheduler
from chaos.sim.spec import SimResult, SimSpec, scratch_dir
from chaos.sim.sqlite import NOW_FUNCTION, NOW_SQL, VirtualSQLite
from chaos.sim.world import PROVIDER_URL, RECEIVER_URL, ClientErrors


def park(sched: Scheduler, timeout: float | None) -> None:
    """Park the calling thread until it is woken, or for `timeout` virtual seconds at most."""
    if timeout is None:
        sched.wait()
    else:
        sched.sleep(timeout)


class SimEvent:
    """`threading.Event` on the virtual clock: `wait` parks the calling thread until the
    event is set or the virtual timeout has passed."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        self._set = False
        self._waiting: set[Actor] = set()

    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        self._set = True
        for actor in list(self._waiting):
            self.sched.hurry(actor)

    def clear(self) -> None:
        self._set = False

    def wait(self, timeout: float | None = None) -> bool:
        if self._set:
            return True
        actor = self.sched.current
        self._waiting.add(actor)
        try:
            park(self.sched, timeout)
        finally:
            self._waiting.discard(actor)
        return self._set


class SimThread:
    """`threading.Thread` as an actor of its process: scheduled like the others, killed with
    the process. `join` waits on the virtual clock: it looks again every tick, or (with
    `wake_joiners`) is woken when the thread ends, one turn instead of one a tick (the
    examples' schedules, and the seeds their READMEs name, are the polling join's)."""

    def __init__(self, sched: Scheduler, process: Process, target: Callable[..., Any],
                 name: str | None = None, args: tuple = (), kwargs: dict | None = None,
                 daemon: bool | None = None, *, wake_joiners: bool = False) -> None:
        self.sched, self.process, self.name = sched, process, name or "thread"
        self._target, self._args, self._kwargs = target, args, kwargs or {}
        self._ended = SimEvent(sched) if wake_joiners else None
        self.actor: Actor | None = None

    def _body(self) -> None:
        try:
            self._target(*self._args, **self._kwargs)
        finally:
            if self._ended is not None:
                self._ended.set()  # wakes its joiners, however it ended

    def start(self) -> None:
        self.actor = self.sched.spawn(f"{self.process.name}/{self.name}", self._body,
                                      self.process)

    def is_alive(self) -> bool:
        return self.actor is not None and self.actor.alive

    def join(self, timeout: float | None = None) -> None:
        deadline = INF if timeout is None else self.sched.now_us + self.sched.us(timeout)
        while self.is_alive() and self.sched.now_us < deadline:
            if self._ended is None:
                self.sched.sleep(0)
            else:  # a thread killed before it ran sets nothing: look again now and then
                self._ended.wait(min(1.0, (deadline - self.sched.now_us) / 1_000_000))


class SimCondition:
    """`threading.Condition` for actors. Its lock is never held across a scheduling point but
    `wait`, which lets it go and parks the calling thread until `notify` or `notify_all`
    (or the virtual timeout), a scheduling point like any other: a real Condition's wait
    would block the scheduler's one running thread. Releasing the lock after a notify passes
    the turn: the threads woken may run before the notifier goes on, as they would on a
    machine that runs them in parallel."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched
        self._owner: Actor | None = None
        self._waiting: list[Actor] = []  # in the order they began to wait
        self._woke = False

    def acquire(self) -> bool:
        actor = self.sched.current
        while self._owner is not None and self._owner is not actor and self._owner.alive:
            self.sched.sleep(0)  # held by a thread parked inside: try again a tick later
        self._owner = actor
        return True

    def release(self) -> None:
        self._owner = None
        if self._woke:
            self._woke = False
            self.sched.pass_turn()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def wait(self, timeout: float | None = None) -> bool:
        """Release the lock, park until notified (or `timeout` virtual seconds), take the
        lock again; whether it was notified."""
        actor = self.sched.current
        self._waiting.append(actor)
        self.release()
        try:
            park(self.sched, timeout)
        finally:
            notified = actor not in self._waiting
            if not notified:
                self._waiting.remove(actor)
            self.acquire()
        return notified

    def notify(self, n: int = 1) -> None:
        """Wake the `n` threads that have waited longest."""
        woken, self._waiting = self._waiting[:n], self._waiting[n:]
        for actor in woken:
            self.sched.hurry(actor)
        self._woke = self._woke or bool(woken)

    def notify_all(self) -> None:
        self.notify(len(self._waiting))


@dataclass
class SimProcess:
    """One simulated engine process, as its loop sees it."""

    context: ProcessContext      # the settings a real run's command() would get for it
    pid: int                     # unique per incarnation, as an OS pid is
    name: str
    role: str
    rng: random.Random           # fixed by the seed and the pid
    sched: Scheduler = field(repr=False)
    process: Process = field(repr=False)
    #: never set: the simulation ends a loop by unwinding its thread
    stop: SimEvent = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.stop = SimEvent(self.sched)

    def now(self) -> float:
        """The process's clock: virtual time, skewed by context.clock_skew."""
        return self.sched.now() + self.context.clock_skew

    def sleep(self, seconds: float) -> None:
        self.sched.sleep(seconds)

    def event(self) -> SimEvent:
        return SimEvent(self.sched)

    def thread(self, target: Callable[..., Any], name: str | None = None, args: tuple = (),
               kwargs: dict | None = None, daemon: bool | None = None) -> SimThread:
        """A thread of this process (start() it); the engine's helper threads must be these."""
        return SimThread(self.sched, self.process, target, name, args, kwargs, daemon)


class InProcess(Protocol):
    """The in-process hooks of an adapter (see the module docstring)."""

    errors: ClientErrors

    def route(self, post: Callable[[str, Any, dict, float], tuple[int, Any]]
              ) -> ContextManager[None]: ...
    def install(self, db: str, now_sql: str) -> None: ...
    def worker(self, proc: SimProcess) -> None: ...
    def sender(self, proc: SimProcess) -> None: ...


class JobProbe:
    """The probe's points as scheduling points, noting the job each names on its process
    (a crash-looping job kills the process that carries it past the crash-loop point)."""

    def __init__(self, sched: Scheduler) -> None:
        self.sched = sched

    def install(self, handler: Callable[[str], None]) -> Any:
        def at_point(name: str, job: str | None) -> None:
            actor = self.sched.current
            if job is not None and actor is not None \
                    and actor._thread is threading.current_thread():
                actor.process.data["job"] = actor.data["job"] = job
            handler(name)
        return probe.set_handler(at_point)

    @staticmethod
    def restore(saved: Any) -> None:
        probe.set_handler(saved)


class ThreadedSimulation(Simulation):
    """One schedule of an engine through its in-process hooks; `workdir` holds its store."""

    def __init__(self, spec: SimSpec, choices: Choices, workdir: str) -> None:
        self.hooks: InProcess = spec.engine.in_process
        super().__init__(spec, choices, os.path.join(workdir, "engine.db"),
                         spec.engine.settings(spec.scenario.engine), (), self.hooks.errors)
        self.sched.hooks = (JobProbe(self.sched),)  # it needs the scheduler it reports to
        self.virtual = VirtualSQLite(self.sched)
        self._submit = submitter(spec.engine, spec.scenario.engine)

    def post(self, url: str, body: Any, headers: dict, timeout: float) -> tuple[int, Any]:
        """The network as the engine's HTTP function sees it: the two in-process fakes."""
        if url.startswith(PROVIDER_URL):
            return self.provider.post(url, body, headers, timeout)
        if url.startswith(RECEIVER_URL):
            return self.receiver.post(url, body, headers, timeout)
        raise self.hooks.errors.reset(url)  # nothing else is reachable from a simulation

    # -- set-up and processes -------------------------------------------------------------------

    def _prepare(self) -> None:
        self.hooks.install(self.db, NOW_SQL)
        for job, payload in self.documents.items():
            result = self._submit(self.db, job, payload, now=self.sched.now())
            self.record_submit(job, payload, result, False)

    def _process(self, process: Process) -> SimProcess:
        ctx = self.slot_context(process.slot, process.role)
        return SimProcess(ctx, process.pid, process.name, process.role, self.rng(process),
                          self.sched, process)

    def _worker_body(self, process: Process) -> Callable[[], None]:
        return lambda: self.hooks.worker(self._process(process))

    def _sender_body(self, process: Process) -> Callable[[], None]:
        return lambda: self.hooks.sender(self._process(process))

    # -- the store ------------------------------------------------------------------------------

    def _settled(self) -> bool:
        return settled(self.engine, self.engine.progress(self.db))

    def _integrity(self) -> str | None:
        return self.engine.integrity(self.db) if has(self.engine, "integrity") else None

    def operations(self) -> list[hist.Event]:
        """The observer's operations, each write the engine's rows do not attribute tied to
        the process that made it (its virtual stamp names the thread that ran)."""
        ops = self.engine.operations(self.db)
        named = {e["pid"]: e["worker"] for e in ops if e.get("pid") and e.get("worker")}
        for e in ops:
            if e.get("worker") is not None or e.get("actor") not in ("worker", "sender"):
                continue
            process = self.virtual.writer(e["t"])
            if process is not None and process.role in ("worker", "sender"):
                e.update(pid=process.pid, worker=named.get(process.pid, process.name),
                         attributed="sim")
        return ops

    # -- the nemesis's controls -----------------------------------------------------------------

    def expire_leases(self) -> int:
        return self.engine.expire_leases(self.db, now=self.sched.now())

    def hold_write_lock(self, seconds: float, held, released) -> None:
        with self.engine.hold_write_lock(self.db):
            held()
            self.sched.sleep(seconds)
        released()

    def submit(self, job: str, payload: Any) -> str:
        return self._submit(self.db, job, payload, now=self.sched.now())

    def operate(self, action: str, job: str) -> str:
        return self.engine.operator(self.db, action, job, now=self.sched.now())


def simulate(spec: SimSpec, choices: Choices, *, keep_db: str | None = None) -> SimResult:
    """Run one schedule of `spec` (an adapter with in-process hooks); return its result.

    keep_db: copy the finished store to this path, its virtual-clock triggers removed (the
    scratch copy is always removed)."""
    started = time.perf_counter()
    workdir = scratch_dir()
    try:
        sim = ThreadedSimulation(spec, choices, workdir)
        with sim.virtual.patched(), sim.hooks.route(sim.post):
            try:
                sim.run()
            finally:
                sim.sched.stop_all()
            result = sim.result(started)
        if keep_db:
            shutil.copyfile(sim.db, keep_db)
            _drop_virtual_triggers(keep_db)
        result.db = keep_db
        return result
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _drop_virtual_triggers(db: str) -> None:
    """A kept store must take writes outside the simulation, where no virtual clock is."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type='trigger'"
                                    " AND sql LIKE ?", (f"%{NOW_FUNCTION}%",)).fetchall():
            conn.execute(f'DROP TRIGGER "{name}"')
    finally:
        conn.close()
