"""The simulation's scheduler: threads that run one at a time, on a virtual clock that jumps.

Every engine worker, sender and heartbeat is an *actor*: a real thread that runs only while
the scheduler has handed it the turn. It gives the turn back at the engine's crash points
(the crash handler parks it there), when it sleeps on its clock (idle polls, waiting for the
write lock, a provider call in flight), where its driver passes the turn at no cost in time
(`pass_turn`: before each SQL statement of an engine run through its in-process hooks), and
when it ends. The scheduler then asks its choice
source which parked actor runs next, and whether a crash lands where it stands, so every
interleaving it picks is one that real processes could take.

Time is virtual, in whole microseconds, and actors run in parallel on it: a turn costs the
actor that takes it `tick` of its own time (it is due again a tick later, or a tick plus its
sleep), every actor due at the current time gets its turn in an order the choice source
picks, and when none is due the clock jumps to the next wake-up, so leases expire without
anyone sleeping. A pick may also *stall* an actor (it is not run for `stall` seconds, as an
overloaded machine would leave a thread waiting) or crash it: `SimCrash` (a BaseException,
like SIGKILL nothing catches it) is raised where it is parked, the store rolls back its
open transaction and the thread unwinds.

An actor is never preempted inside a write transaction, except to crash it: at a crash
point it reaches with a transaction open (`in_transaction()` says so), it takes the very
next pick, at no cost in time, and the only choice is whether it crashes there. Holding the
lock across other threads' turns would add no interleaving a real run could tell apart
(other writers wait, readers see the state before the transaction), only waits of a tick
that real commits never take. Lock waits still happen (a contention fault holds the lock):
a writer that finds it taken sleeps on the virtual clock, a scheduling point like any.
"""
from __future__ import annotations

import heapq
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from chaos import probe

INF = float("inf")
US = 1_000_000


class PointHook(Protocol):
    """Where an engine's scheduling points report to: `install(handler)` makes every point
    call `handler(name)` and returns what `restore` puts back."""

    def install(self, handler: Callable[[str], None]) -> Any: ...
    def restore(self, saved: Any) -> None: ...


class ProbeHook:
    """The points of an engine that marks them with `chaos.probe`."""

    @staticmethod
    def install(handler: Callable[[str], None]) -> Any:
        return probe.set_handler(lambda name, job: handler(name))

    @staticmethod
    def restore(saved: Any) -> None:
        probe.set_handler(saved)


class SimCrash(BaseException):
    """Raised at an actor's scheduling point when its process is killed there."""


class SimStop(BaseException):
    """Raised at every actor's scheduling point when the simulation ends."""


@dataclass
class Process:
    """What a real run would see as one OS process: a worker (with its heartbeat thread) or a
    sender. `pid` is unique per incarnation; killing or pausing it affects all its actors."""

    pid: int
    role: str              # "worker" | "sender" | "nemesis"
    slot: int
    name: str
    actors: list["Actor"] = field(default_factory=list)
    paused_until: int = 0  # virtual microseconds
    alive: bool = True
    data: dict[str, Any] = field(default_factory=dict)


class Actor:
    """One thread of the simulation. `body()` runs in the thread once it is first scheduled."""

    def __init__(self, sched: "Scheduler", aid: int, name: str, body: Callable[[], None],
                 process: Process, start: int) -> None:
        self.sched, self.id, self.name, self.body, self.process = sched, aid, name, body, process
        self.wake = start           # eligible from this virtual time on (INF: until woken)
        self.point: str | None = None  # the crash point it is parked at (None: sleeping)
        self.alive = True
        self.exit: str | None = None   # "done" | "crash" | "stop" | "error"
        self.error: str | None = None
        self.cleanup: list[Callable[[], None]] = []
        self.data: dict[str, Any] = {}  # what the simulation keeps per thread
        #: Says whether the actor holds an open write transaction (set by its owner).
        self.in_transaction: Callable[[], bool] = lambda: False
        self._instruction: type[BaseException] | None = None
        self._dying: type[BaseException] | None = None
        self._go = threading.Lock()
        self._go.acquire()
        self._thread: threading.Thread | None = None

    # -- in the actor's thread ------------------------------------------------------------

    def _main(self) -> None:
        self._go.acquire()
        try:
            self._obey()
            self.body()
            self.exit = "done"
        except SimCrash:
            self.exit = "crash"
        except SimStop:
            self.exit = "stop"
        except BaseException:  # the engine raised: in a real run the process would exit 1
            self.exit, self.error = "error", traceback.format_exc(limit=8)
        finally:
            self.alive = False
            for close in self.cleanup:
                try:
                    close()
                except Exception:
                    pass
            self.sched._back.release()

    def _obey(self) -> None:
        instruction, self._instruction = self._instruction, None
        if instruction is not None:
            self._dying = instruction
            raise instruction()

    def park(self) -> None:
        """Give the turn back and wait for it; raises what the scheduler says on return."""
        if self._dying is not None:  # unwinding: a dead thread gets no more turns
            raise self._dying()
        self.sched._back.release()
        self._go.acquire()
        self._obey()

    # -- in the scheduler's thread ------------------------------------------------------------

    def _resume(self, instruction: type[BaseException] | None = None) -> None:
        self._instruction = instruction
        if self._thread is None:
            self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)
            self._thread.start()
        self._go.release()
        self.sched._back.acquire()


class VirtualClock:
    """An engine Clock on the simulation's virtual time, shifted by `offset` seconds.

    `sleep` parks the calling actor until the virtual time has passed."""

    def __init__(self, sched: "Scheduler", offset: float = 0.0) -> None:
        self.sched, self.offset = sched, offset

    def now(self) -> float:
        return self.sched.now() + self.offset

    def sleep(self, seconds: float) -> None:
        self.sched.sleep(seconds)


RUN, STALL, CRASH = "run", "stall", "crash"

#: Decides each pick: given the actors due now, returns (index, RUN | STALL | CRASH).
#: Installed by the simulation (it owns the choice source and the fault plan).
Chooser = Callable[[list[Actor]], tuple[int, str]]


class Scheduler:
    """Runs actors one at a time. `start` is the virtual epoch (seconds), `tick` the cost of a
    turn, `stall` how long a stalled actor waits (seconds). `chooser` decides each pick;
    `on_exit(actor)` hears of every actor that ended in a turn, `on_exit_process(process)` of
    every killed process once its actors have unwound; `may_crash(actor)` says whether a
    crash could land where the actor stands (inside a transaction, one that cannot goes on
    without a pick); `hooks` are where the engine's scheduling points report (PointHook)."""

    def __init__(self, start: float, tick: float, stall: float, chooser: Chooser,
                 on_exit: Callable[[Actor], None] = lambda actor: None,
                 on_exit_process: Callable[[Process], None] = lambda process: None,
                 may_crash: Callable[[Actor], bool] = lambda actor: True,
                 hooks: tuple[PointHook, ...] = (ProbeHook(),)) -> None:
        self.hooks = hooks
        self.start, self.tick_us, self.stall_us = start, round(tick * US), round(stall * US)
        self.chooser, self.on_exit, self.on_exit_process = chooser, on_exit, on_exit_process
        self.may_crash = may_crash
        self.now_us = 0
        self.turns = 0
        self.stalls = 0
        self.actors: list[Actor] = []
        self.current: Actor | None = None
        self.last: Actor | None = None
        self._back = threading.Lock()
        self._back.acquire()
        self._timers: list[tuple[int, int, Callable[[], None]]] = []
        self._seq = 0
        self._kills: list[Process] = []
        self._atomic: Actor | None = None  # parked inside a transaction: runs next
        self.atomic_pick = False            # this pick is of that actor alone
        self.finished = False
        #: Hears of every point an actor reaches, in that actor's thread before it parks
        #: (aimed faults, chaos.sim.aim): `on_point(actor, name)`.
        self.on_point: Callable[[Actor, str], None] | None = None

    # -- time -------------------------------------------------------------------------------

    def now(self) -> float:
        return self.start + self.now_us / US

    def time_at(self, when_us: int) -> float:
        """The virtual time `when_us` microseconds after the start, in seconds."""
        return self.start + when_us / US

    def us(self, seconds: float) -> int:
        """A duration in whole virtual microseconds (rounded up: a sleep is never short)."""
        return -int(-seconds * US // 1) if seconds > 0 else 0

    def at(self, when_us: int, callback: Callable[[], None]) -> None:
        """Run `callback` in the scheduler's thread once the virtual time reaches `when_us`.
        Callbacks must not block: they change in-memory state and record events."""
        self._seq += 1
        heapq.heappush(self._timers, (when_us, self._seq, callback))

    # -- called from actors -----------------------------------------------------------------

    def sleep(self, seconds: float) -> None:
        """Park the calling actor: due again after its turn's tick and `seconds`."""
        actor = self._caller()
        actor.wake, actor.point = self.now_us + self.tick_us + self.us(seconds), None
        actor.park()

    def sleep_until(self, when_us: int) -> None:
        """Park the calling actor until the virtual time `when_us` (a tick at least)."""
        actor = self._caller()
        actor.wake, actor.point = max(when_us, self.now_us + self.tick_us), None
        actor.park()

    def pass_turn(self) -> None:
        """Give the turn back at no cost in time: any actor due now may run before the
        caller goes on (a statement boundary, where real processes interleave)."""
        actor = self._caller()
        actor.wake, actor.point = self.now_us, None
        actor.park()

    def wait(self) -> None:
        """Park the calling actor until someone calls `wake_at` for it."""
        actor = self._caller()
        actor.wake, actor.point = INF, None
        actor.park()

    def crashpoint(self, name: str) -> None:
        """The engine's crash handler: park the calling actor at `name` (others: nothing)."""
        actor = self.current
        if actor is None or actor._thread is not threading.current_thread():
            return  # the simulation's own set-up writes, outside any actor
        if self.on_point is not None:
            self.on_point(actor, name)
        if actor.in_transaction():
            actor.point = name
            if not self.may_crash(actor):
                return  # its next pick would be its own, with nothing to decide
            self._atomic = actor
            actor.wake = self.now_us
        else:
            actor.wake, actor.point = self.now_us + self.tick_us, name
        actor.park()

    def kill(self, process: Process) -> None:
        """Kill `process` (all its actors) as soon as the running turn ends."""
        if process.alive:
            process.alive = False
            self._kills.append(process)

    def _caller(self) -> Actor:
        actor = self.current
        if actor is None or actor._thread is not threading.current_thread():
            raise RuntimeError("a simulated clock slept outside the simulation's actors")
        return actor

    # -- called from the simulation's thread --------------------------------------------------

    def spawn(self, name: str, body: Callable[[], None], process: Process,
              delay: float = 0.0) -> Actor:
        actor = Actor(self, len(self.actors) + 1, name, body, process,
                      self.now_us + self.us(delay))
        self.actors.append(actor)
        process.actors.append(actor)
        return actor

    def wake_at(self, actor: Actor, when_us: int) -> None:
        """Make a waiting actor eligible at `when_us` (no effect on one that is not waiting)."""
        if actor.alive and actor.wake == INF and actor.point is None:
            actor.wake = when_us

    def hurry(self, actor: Actor) -> None:
        """Make a sleeping or waiting actor due now (no effect on one parked at a point, or
        already due)."""
        if actor.alive and actor.point is None and actor.wake > self.now_us:
            actor.wake = self.now_us

    def run(self, max_turns: int) -> None:
        """Run turns until `finished` is set, nothing can ever run again, or `max_turns`."""
        saved = self._install()
        try:
            while not self.finished and self.turns < max_turns:
                self._fire_timers()
                if self.finished:
                    break
                eligible = self._eligible()
                if not eligible:
                    nxt = self._next_event()
                    if nxt == INF:
                        break
                    self.now_us = max(self.now_us, nxt)
                    continue
                index, how = self.chooser(eligible)
                actor = eligible[index]
                if how == STALL:
                    actor.wake = self.now_us + self.stall_us
                    self.stalls += 1
                    continue
                self.turns += 1
                self._turn(actor, SimCrash if how == CRASH else None)
        finally:
            self._restore(saved)

    def stop_all(self) -> None:
        """End every actor still alive (SimStop unwinds each thread)."""
        saved = self._install()
        try:
            for actor in list(self.actors):
                if actor.alive:
                    self._turn(actor, SimStop)
        finally:
            self._restore(saved)

    def _install(self) -> list:
        return [hook.install(self.crashpoint) for hook in self.hooks]

    def _restore(self, saved: list) -> None:
        for hook, before in zip(self.hooks, saved):
            hook.restore(before)

    def _eligible(self) -> list[Actor]:
        atomic, self._atomic = self._atomic, None
        self.atomic_pick = atomic is not None and atomic.alive
        if self.atomic_pick:
            return [atomic]
        now, last = self.now_us, self.last
        eligible = [a for a in self.actors
                    if a.alive and a.wake <= now and a.process.paused_until <= now]
        # Index 0 is "let the actor that ran last go on" (the shrinker drives choices towards
        # 0, so minimal schedules switch threads only where it must), else the oldest.
        if last is not None and last in eligible and eligible[0] is not last:
            eligible.remove(last)
            eligible.insert(0, last)
        return eligible

    def _next_event(self) -> float:
        times = [max(a.wake, a.process.paused_until) for a in self.actors if a.alive]
        if self._timers:
            times.append(self._timers[0][0])
        return min(times, default=INF)

    def _fire_timers(self) -> None:
        while self._timers and self._timers[0][0] <= self.now_us:
            _, _, callback = heapq.heappop(self._timers)
            callback()

    def _turn(self, actor: Actor, instruction: type[BaseException] | None) -> None:
        self.current = self.last = actor
        try:
            actor._resume(instruction)
        finally:
            self.current = None
        if not actor.alive:
            self.actors.remove(actor)
            self.on_exit(actor)
        while self._kills:
            self._unwind(self._kills.pop(0))

    def _unwind(self, process: Process) -> None:
        for actor in list(process.actors):
            if not actor.alive:
                continue
            if actor._thread is None:  # never ran: nothing to unwind
                actor.alive, actor.exit = False, "crash"
                self.actors.remove(actor)
                continue
            self.current = actor
            try:
                actor._resume(SimCrash)
            finally:
                self.current = None
            self.actors.remove(actor)
        self.on_exit_process(process)
