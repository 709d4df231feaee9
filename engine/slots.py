"""Job slots: one worker process running several jobs at once, and committing them together.

A model call takes from half a second to tens of seconds, so a process that runs one job at a
time moves a few steps a second. `Slots` runs `slots` Workers in one process, each in its own
thread with its own connection and its own lease, so every safety property holds per slot
exactly as it does per process: each claim is fenced by its own token, each step is memoized
and paid for once. They share one heartbeat thread, which extends the lease of every slot in
a call, and, on SQLite, one `GroupCommit`.

Threads, not an event loop: the store drivers (sqlite3, psycopg's blocking connection) and the
provider's HTTP client block; an event loop would run each of them in a thread anyway. A
waiting thread costs its stack and a connection (see bench/latency_throughput.py for the
memory per job in flight), and the GIL is released while a slot waits for the model or the
disk, which is where a slot spends its time.

A SIGKILL of the process loses the step in flight in every slot at once; each is recovered by
the next owner of its job once its lease runs out, as after any crash.
"""
from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from .config import EngineConfig
from .hooks import Clock, SystemClock, crashpoint
from .store import DatabaseError, Store, StoreBusy
from .worker import WorkerStats

#: The longest wait between two tries of a group that found the database locked.
RETRY_DELAY_CAP = 0.5


@dataclass
class _Write:
    """One slot's finishing write waiting in a group: its outcome once the group is done."""

    write: Callable[[Store], Any]
    deadline: Callable[[], float]  # read at each try: a heartbeat may renew the lease
    done: bool = False
    result: Any = None
    error: BaseException | None = None

    def settle(self, result: Any = None, error: BaseException | None = None) -> None:
        self.result, self.error, self.done = result, error, True

    def outcome(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.result


@dataclass
class GroupCommit:
    """Commits the finishing writes (completions, failures) of slots that are ready together
    in one transaction: at synchronous=FULL, one fsync for the group instead of one a step.

    Leader and followers, as databases do it: a slot that finds no commit under way leads,
    taking every write queued so far, itself included; slots that arrive while it commits
    queue for the next group. One slot alone commits at once, as without slots.

    Each write runs in a savepoint of the group's transaction (the store's `batch()`) and is
    fenced by its own lease token: a stale write raises LeaseLost for its own slot only, and
    any other exception of its own is its slot's alone. A database error, or a crash, fails
    the whole group: nothing of it committed, and each slot handles that as without a group.
    """

    clock: Clock = field(default_factory=SystemClock)
    #: counters for the bench: transactions, and the writes they carried
    groups: int = 0
    writes: int = 0
    #: guards the queue and wakes the followers; injectable (a simulation passes one whose
    #: waits are its own scheduling points), the standard library's by default
    condition: Any = field(default_factory=threading.Condition, repr=False)
    _queue: list[_Write] = field(default_factory=list, repr=False)
    _leading: bool = False

    def commit(self, store: Store, write: Callable[[Store], Any],
               deadline: float | Callable[[], float]) -> Any:
        """Run `write(store)` in the next group's transaction and return its result, or
        raise its error. `deadline` (clock time, or a function read at each try): past it,
        a group that cannot have the write lock gives this write up with StoreBusy (the
        slot's lease is gone)."""
        entry = _Write(write, deadline if callable(deadline) else (lambda: deadline))
        with self.condition:
            self._queue.append(entry)
            while self._leading and not entry.done:
                self.condition.wait()
            if entry.done:
                return entry.outcome()
            self._leading, group, self._queue = True, self._queue, []
        try:
            self._lead(store, group)
        finally:
            with self.condition:
                self._leading = False
                self.condition.notify_all()
        return entry.outcome()

    def _lead(self, store: Store, group: list[_Write]) -> None:
        """Commit `group` on the leader's own connection, retrying while the database is
        locked and a write's lease still holds."""
        delay = 0.01
        while group:
            try:
                results = self._run(store, group)
            except StoreBusy as exc:
                # Nothing committed. A write whose lease would end before the next try is
                # given up (its slot still records its spend, see Worker._write).
                late = self.clock.now() + delay
                for entry in group:
                    if late >= entry.deadline():
                        entry.settle(error=exc)
                group = [e for e in group if not e.done]
                if group:
                    self.clock.sleep(delay)
                    delay = min(delay * 2, RETRY_DELAY_CAP)
                continue
            except BaseException as exc:
                for entry in group:  # nothing committed: every write of the group failed
                    entry.settle(error=exc)
                raise
            crashpoint("worker.group.after_commit")
            for entry, (result, error) in zip(group, results):
                entry.settle(result, error)
            self.groups, self.writes = self.groups + 1, self.writes + len(group)
            return

    @staticmethod
    def _run(store: Store, group: list[_Write]) -> list[tuple[Any, BaseException | None]]:
        results: list[tuple[Any, BaseException | None]] = []
        with store.batch():  # type: ignore[attr-defined]
            for entry in group:
                try:
                    results.append((entry.write(store), None))
                except DatabaseError:
                    raise  # the database failed, not this write: the group is lost
                except Exception as exc:  # LeaseLost, or a bug: this slot's own
                    results.append((None, exc))
            crashpoint("worker.group.before_commit")
        return results


class Slots:
    """`config.slots` Workers in one process, each in its own thread with its own store
    connection, sharing one heartbeat and (on a store that can batch writes, with
    group_commit on) one GroupCommit.

    open_store_: opens one connection (called once per slot, here, so that a database that
    cannot be opened fails at start); worker_id: the process's id, each slot writing under
    `<id>/<k>`; make_worker: builds one slot's Worker (engine.worker.Worker's signature).
    With one slot the Worker runs in the calling thread under the process's own id.
    `thread` builds each slot's thread and `condition` the group commit's condition: the
    standard library's by default; a simulation passes its own, so that this very code runs
    on its virtual clock.
    """

    def __init__(self, config: EngineConfig, open_store_: Callable[[], Store],
                 make_worker: Callable[..., Any], *, clock: Clock | None = None,
                 worker_id: str, thread: Callable[..., Any] = threading.Thread,
                 condition: Callable[[], Any] = threading.Condition) -> None:
        self.config, self.id, self._thread = config, worker_id, thread
        self.stats = WorkerStats()
        stores = [open_store_() for _ in range(config.slots)]
        self.group = (GroupCommit(clock or SystemClock(), condition=condition())
                      if config.slots > 1
                      and config.group_commit and hasattr(stores[0], "batch") else None)
        self.workers = [make_worker(
            store, worker_id=worker_id if config.slots == 1 else f"{worker_id}/{k}",
            rng=random.Random(None if config.seed < 0 else config.seed + k),
            group=self.group, stats=self.stats) for k, store in enumerate(stores)]
        for worker in self.workers[1:]:  # one thread beats for every slot, each its own way
            worker.heartbeat = self.workers[0].heartbeat

    def run(self, stop: threading.Event | None = None, *, max_jobs: int | None = None,
            exit_when_idle: bool = False) -> WorkerStats:
        """Run every slot until `stop` is set, `max_jobs` jobs were claimed in all, or
        (exit_when_idle) nothing waits for a worker. A slot that dies of an error stops the
        others, which finish their step; the error is then raised here."""
        stop = stop or threading.Event()
        if len(self.workers) == 1:
            self.workers[0].run(stop, max_jobs=max_jobs, exit_when_idle=exit_when_idle)
            return self.stats
        errors: list[BaseException] = []

        def slot(worker: Any) -> None:
            try:
                worker.run(stop, max_jobs=max_jobs, exit_when_idle=exit_when_idle)
            except BaseException as exc:
                errors.append(exc)
                stop.set()

        threads = [self._thread(target=slot, args=(w,), name=f"slot-{k}", daemon=True)
                   for k, w in enumerate(self.workers)]
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.2)  # in slices: the main thread must stay free to take signals
        if errors:
            raise errors[0]
        return self.stats

    def close(self) -> None:
        """Close every slot's connection."""
        for worker in self.workers:
            worker.store.close()
