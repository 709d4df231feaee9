"""Test hooks the engine always carries: named crash points, the clock, the random source.

Disarmed, a crash point costs one global check. The harness arms them through the
environment (kill this process at the N-th hit of a point, or with probability p); the
simulation installs a handler that uses them as its scheduling points.
"""
from __future__ import annotations

import fnmatch
import json
import os
import random
import signal
import threading
import time
from typing import Callable, Protocol

#: Every named crash point the engine declares, in the order a job meets them.
CRASHPOINTS: tuple[str, ...] = (
    "submit.before_commit",        # inside the submit transaction
    "claim.before_commit",         # inside the claim transaction
    "worker.after_claim",          # lease taken, nothing done yet
    "worker.memo_hit.before_commit",  # memo found, advancing without a call
    "worker.before_call",          # about to call the provider (nothing billed yet)
    "worker.after_call",           # the call returned (billed) but nothing is written
    "worker.before_commit",        # inside the completion transaction (memo, outbox, state)
    "worker.after_commit",         # the step committed
    "worker.fail.before_commit",   # inside the failure / retry transaction
    "worker.heartbeat",            # a heartbeat is about to extend the lease
    "worker.group.before_commit",  # every write of a slot group is in, COMMIT not yet sent
    "worker.group.after_commit",   # a slot group committed, its slots not yet told
    "sender.after_claim",          # outbox row leased, not sent
    "sender.after_send",           # the receiver answered; sent_at not yet written
    "sender.before_commit",        # inside the transaction that marks sent_at
)

Handler = Callable[[str], None]
_handler: Handler | None = None

_local = threading.local()


def current_job() -> str | None:
    """The job this thread (one job slot of the worker) is working on, read by job-aware
    crash handlers: with several slots a process works several jobs at once."""
    return getattr(_local, "job", None)


def set_current_job(job_id: str | None) -> None:
    """Note the job this thread works on (see `current_job`)."""
    _local.job = job_id


def die(point: str) -> None:
    """SIGKILL this process at `point`, first noting where in NINELIVES_CRASH_LOG (if set),
    so a harness can tell which crash point a kill landed on."""
    log = os.environ.get("NINELIVES_CRASH_LOG")
    if log:
        line = f'{{"t": {time.time()}, "pid": {os.getpid()}, "point": "{point}", ' \
               f'"job": {json.dumps(current_job())}}}\n'
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())  # one write() of a short line: appends stay whole
        finally:
            os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)


def crashpoint(name: str) -> None:
    """Mark a boundary that matters; does nothing unless a handler is armed."""
    if _handler is not None:
        _handler(name)


def set_crash_handler(handler: Handler | None) -> Handler | None:
    """Install `handler` (called with the point's name at every hit); returns the old one."""
    global _handler
    old, _handler = _handler, handler
    return old


class KillAt:
    """A handler that SIGKILLs this process at the `nth` hit of `name` (or with probability p).

    `spec` is the value of NINELIVES_CRASH_AT: comma-separated items `point:N` (die at the
    N-th hit) or `point@P` (die with probability P at each hit, from `rng`). `*` as the point
    matches every declared point.
    """

    def __init__(self, spec: str, rng: random.Random | None = None) -> None:
        self.rng = rng or random.Random()
        self.nth: dict[str, int] = {}
        self.prob: dict[str, float] = {}
        self.hits: dict[str, int] = {}
        self._lock = threading.Lock()  # slots hit points from several threads
        for item in filter(None, (part.strip() for part in spec.split(","))):
            self._parse(item)

    def _parse(self, item: str) -> None:
        """One item; raises ValueError naming NINELIVES_CRASH_AT and the item."""
        try:
            if "@" in item:
                point, _, p = item.partition("@")
                self._known(point)
                self.prob[point] = float(p)
                if not 0.0 <= self.prob[point] <= 1.0:  # nan too: it would never fire
                    raise ValueError(p)
            else:
                point, _, n = item.partition(":")
                self._known(point)
                self.nth[point] = int(n or 1)
                if self.nth[point] < 1:
                    raise ValueError(n)
        except ValueError as exc:
            if "unknown crash point" in str(exc):
                raise
            raise ValueError(f"NINELIVES_CRASH_AT item {item!r}: `point:N` needs a whole "
                             "N >= 1, `point@P` a probability P in [0, 1]") from None

    @staticmethod
    def _known(point: str) -> None:
        if point != "*" and point not in CRASHPOINTS:
            raise ValueError(f"NINELIVES_CRASH_AT names unknown crash point {point!r}; "
                             f"known: {', '.join(CRASHPOINTS)}")

    def __call__(self, name: str) -> None:
        with self._lock:
            hits = self.hits[name] = self.hits.get(name, 0) + 1
        due = self.nth.get(name) == hits
        for key in (name, "*"):
            p = self.prob.get(key)
            if p is not None and self.rng.random() < p:
                due = True
        if due:
            die(name)


class KillOnJobs:
    """A handler that SIGKILLs this process at `point` whenever the current job's id matches
    one of `patterns` (fnmatch globs): a payload that crashes its worker every time."""

    def __init__(self, patterns: str, point: str = "worker.after_call",
                 then: Handler | None = None) -> None:
        KillAt._known(point)
        self.patterns = [p.strip() for p in patterns.split(",") if p.strip()]
        self.point, self.then = point, then

    def __call__(self, name: str) -> None:
        job = current_job()
        if name == self.point and job is not None and any(
                fnmatch.fnmatchcase(job, p) for p in self.patterns):
            die(name)
        if self.then is not None:
            self.then(name)


#: Seconds between two looks of a held thread for its release.
HOLD_POLL = 0.005


class HoldAt:
    """A handler that holds the thread passing a point `at` names, after appending
    {"t","pid","point","job","action":"hold","hold":N} to `log` (N counts this process's
    holds from 1), until the harness creates `<log>.release.<pid>.<N>` (removed here) or
    `<log>.off`; notes the points of `watch` there ("action":"reach") without holding; then
    hands the point on. An aimed fault: the harness's chaos.spec.aim.

    While a thread is held, every other thread of the process that passes a point of
    `pause` (points outside any write transaction) waits there until the hold ends: the
    process stands still as a stopped one would, except that no thread waits inside a
    transaction. A SIGSTOP of the whole process stopped the heartbeat or another slot
    wherever it stood, inside its write transaction too, and every other process's writes
    then waited for that transaction's lock as long as the hold lasted.

    `at` is NINELIVES_HOLD_AT: items `point`, `point=JOB` (a glob of the current job), either
    with `/N` (every N-th such pass). While a file named `log` + ".off" exists it is
    disarmed."""

    def __init__(self, at: str, watch: str, log: str, then: Handler | None = None,
                 pause: str = "") -> None:
        self.log, self.off, self.then = log, log + ".off", then
        self.at: dict[str, list[tuple[str | None, int]]] = {}
        self.hits: dict[tuple[str, str | None, int], int] = {}
        self._lock = threading.Lock()
        self._turn = threading.Condition()
        self.holder: int | None = None  # the thread held now
        self.holds = 0
        for item in filter(None, (part.strip() for part in at.split(","))):
            rest, _, every = item.rpartition("/") if "/" in item else (item, "", "1")
            point, _, job = rest.partition("=")
            self._known(point, "NINELIVES_HOLD_AT")
            if not every.isdigit() or int(every) < 1:
                raise ValueError(f"NINELIVES_HOLD_AT item {item!r}: `/N` needs a whole N >= 1")
            self.at.setdefault(point, []).append((job or None, int(every)))
        self.watch = {p.strip() for p in watch.split(",") if p.strip()}
        self.pause = {p.strip() for p in pause.split(",") if p.strip()}
        for variable, points in (("NINELIVES_HOLD_WATCH", self.watch),
                                 ("NINELIVES_HOLD_PAUSE", self.pause)):
            for point in points:
                self._known(point, variable)

    @staticmethod
    def _known(point: str, variable: str) -> None:
        if point not in CRASHPOINTS:
            raise ValueError(f"{variable} names unknown crash point {point!r}; "
                             f"known: {', '.join(CRASHPOINTS)}")

    def __call__(self, name: str) -> None:
        if self.holder is not None and name in self.pause:
            self._wait_turn()
        if (name in self.at or name in self.watch) and not os.path.exists(self.off):
            job = current_job()
            if name in self.watch:
                self._note(name, job, "reach")
            if self._due(name, job):
                self._hold(name, job)
        if self.then is not None:
            self.then(name)

    def _wait_turn(self) -> None:
        """Wait while another thread of this process is held."""
        me = threading.get_ident()
        with self._turn:
            while self.holder is not None and self.holder != me:
                self._turn.wait()

    def _hold(self, name: str, job: str | None) -> None:
        me = threading.get_ident()
        with self._turn:
            while self.holder is not None and self.holder != me:
                self._turn.wait()  # one hold at a time: another thread's first
            self.holder, self.holds = me, self.holds + 1
            number = self.holds
        try:
            self._note(name, job, "hold", number)
            go = f"{self.log}.release.{os.getpid()}.{number}"
            while not os.path.exists(go) and not os.path.exists(self.off):
                time.sleep(HOLD_POLL)
            try:
                os.unlink(go)
            except OSError:
                pass  # released by the .off file
        finally:
            with self._turn:
                self.holder = None
                self._turn.notify_all()

    def _due(self, name: str, job: str | None) -> bool:
        for pattern, every in self.at.get(name, ()):
            if pattern is None or (job is not None and fnmatch.fnmatchcase(job, pattern)):
                with self._lock:
                    key = (name, pattern, every)
                    hits = self.hits[key] = self.hits.get(key, 0) + 1
                if hits % every == 0:
                    return True
        return False

    def _note(self, name: str, job: str | None, action: str, hold: int = 0) -> None:
        entry = {"t": time.time(), "pid": os.getpid(), "point": name, "job": job,
                 "action": action, **({"hold": hold} if hold else {})}
        fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(entry) + "\n").encode())  # one write(): stays whole
        finally:
            os.close(fd)


def arm_from_env(environ: dict[str, str] | None = None) -> None:
    """Arm crash points from the environment, if asked:

    NINELIVES_CRASH_AT   `point:N` / `point@P` items (see KillAt), seeded by NINELIVES_CRASH_SEED;
    NINELIVES_CRASH_JOBS globs of job ids whose every `worker.after_call` kills the process;
    NINELIVES_HOLD_AT, NINELIVES_HOLD_WATCH, NINELIVES_HOLD_PAUSE, NINELIVES_HOLD_LOG: points
    to hold a thread at, to note, and where the other threads wait meanwhile (see HoldAt).
    """
    env = os.environ if environ is None else environ
    handler: Handler | None = None
    spec = env.get("NINELIVES_CRASH_AT", "")
    if spec:
        seed = env.get("NINELIVES_CRASH_SEED")
        try:
            rng = random.Random(int(seed)) if seed else None
        except ValueError:
            raise ValueError(f"NINELIVES_CRASH_SEED must be a whole number, got {seed!r}") from None
        handler = KillAt(spec, rng)
    jobs = env.get("NINELIVES_CRASH_JOBS", "")
    if jobs:
        handler = KillOnJobs(jobs, then=handler)
    log = env.get("NINELIVES_HOLD_LOG", "")
    if log and (env.get("NINELIVES_HOLD_AT") or env.get("NINELIVES_HOLD_WATCH")):
        handler = HoldAt(env.get("NINELIVES_HOLD_AT", ""), env.get("NINELIVES_HOLD_WATCH", ""),
                         log, then=handler, pause=env.get("NINELIVES_HOLD_PAUSE", ""))
    if handler is not None:
        set_crash_handler(handler)


class Clock(Protocol):
    """Where the engine reads time. System, skewed and virtual clocks plug in here."""

    def now(self) -> float: ...
    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The machine's wall clock."""

    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class SkewedClock(SystemClock):
    """The wall clock shifted by `offset` seconds (a worker whose clock is wrong)."""

    def __init__(self, offset: float) -> None:
        self.offset = offset

    def now(self) -> float:
        return time.time() + self.offset


class ManualClock:
    """A clock that moves only when told to; `sleep` advances it (for tests)."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        self.t += max(0.0, seconds)
