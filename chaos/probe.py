"""The crash-point probe: the one piece of the harness an engine may import.

It has no dependency beyond the standard library and imports nothing else of `chaos`, so an
engine can import it (or copy this file) without taking the harness with it. An engine marks
the boundaries that matter with `point(name, job)`; disarmed, a point costs one check.

The harness arms the probe through the environment of each process it spawns:

  NINELIVES_CRASH_AT         comma-separated `point:N` (die at the N-th hit) or `point@P` (die
                             with probability P at each hit); `*` matches every point
  NINELIVES_CRASH_SEED       the seed of those probabilities, so a run replays
  NINELIVES_CRASH_JOBS       comma-separated globs of job ids that kill their process every
                             time they pass NINELIVES_CRASH_JOBS_AT (a crash loop)
  NINELIVES_CRASH_JOBS_AT    the point where such jobs die
  NINELIVES_CRASH_LOG        a file to append {"t","pid","point","job"} to before dying
  NINELIVES_TRACE            a file to append {"t","pid","thread","point","job"} to at every point
                             (how the harness tells which process made a write, for an
                             engine whose rows do not say)
  NINELIVES_HOLD_AT          comma-separated `point`, `point=JOB` (that job only, a glob) or
                             either with `/N` (every N-th such pass): at each, append
                             {"t","pid","point","job","action":"hold","hold":N} to
                             NINELIVES_HOLD_LOG (N counts this process's holds from 1) and
                             block the thread there until the harness releases it (an aimed
                             fault, chaos.spec.aim); one thread of a process holds at a time
  NINELIVES_HOLD_PAUSE       comma-separated points outside any write transaction: while a
                             thread of this process is held, every other thread that passes
                             one of them waits there until the hold ends, so the process
                             stands still as if stopped, except that no thread is ever
                             stopped inside a transaction (it would keep the store's locks
                             from every other process); other points are passed as usual
  NINELIVES_HOLD_WATCH       comma-separated points whose passing is appended to the hold log
                             ("action":"reach"), without holding: a rendezvous's other side
  NINELIVES_HOLD_LOG         the hold log. The harness releases hold N of process PID by
                             creating the file `<log>.release.<PID>.<N>` (the held thread
                             removes it); while a file of the log's name plus `.off` exists,
                             holds and watches are disarmed and a held thread goes on

The simulation installs a handler instead (`set_handler`) and uses the points as the moments
it may hand the turn to another thread.
"""
from __future__ import annotations

import fnmatch
import json
import os
import random
import signal
import threading
import time
from typing import Callable, Iterable

Handler = Callable[[str, "str | None"], None]
_handler: Handler | None = None


def point(name: str, job: str | None = None) -> None:
    """Mark the boundary `name` (while working on `job`); does nothing unless armed."""
    if _handler is not None:
        _handler(name, job)


def set_handler(handler: Handler | None) -> Handler | None:
    """Install `handler(name, job)`, called at every point; returns the previous one."""
    global _handler
    old, _handler = _handler, handler
    return old


def die(name: str, job: str | None) -> None:
    """SIGKILL this process at point `name`, first noting where in NINELIVES_CRASH_LOG."""
    log = os.environ.get("NINELIVES_CRASH_LOG")
    if log:
        line = json.dumps({"t": time.time(), "pid": os.getpid(), "point": name, "job": job})
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())  # one short write(): appends stay whole
        finally:
            os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)


class Armed:
    """The handler the environment asks for (see the module docstring).

    `points` are the names the engine declares; an unknown name in the environment raises
    ValueError naming it, so a typo in a scenario cannot disarm a run silently."""

    def __init__(self, env: dict[str, str], points: Iterable[str]) -> None:
        known = set(points)
        self.nth: dict[str, int] = {}
        self.prob: dict[str, float] = {}
        self.hits: dict[str, int] = {}
        seed = env.get("NINELIVES_CRASH_SEED")
        self.rng = random.Random(_whole(seed, "NINELIVES_CRASH_SEED", 0)) if seed \
            else random.Random()
        for item in filter(None, (p.strip() for p in env.get("NINELIVES_CRASH_AT", "").split(","))):
            name, sep, value = item.partition("@") if "@" in item else item.partition(":")
            _known(name, known, "NINELIVES_CRASH_AT")
            where = f"NINELIVES_CRASH_AT item {item!r}"
            if sep == "@":
                self.prob[name] = _probability(value, where)
            else:
                self.nth[name] = _whole(value or "1", where, 1)
        self.jobs = [p.strip() for p in env.get("NINELIVES_CRASH_JOBS", "").split(",") if p.strip()]
        self.jobs_at = env.get("NINELIVES_CRASH_JOBS_AT", "")
        if self.jobs:
            _known(self.jobs_at, known, "NINELIVES_CRASH_JOBS_AT")

    def __call__(self, name: str, job: str | None) -> None:
        if self.jobs and name == self.jobs_at and job is not None and any(
                fnmatch.fnmatchcase(job, p) for p in self.jobs):
            die(name, job)
        hits = self.hits[name] = self.hits.get(name, 0) + 1
        due = self.nth.get(name) == hits
        for key in (name, "*"):
            p = self.prob.get(key)
            if p is not None and self.rng.random() < p:
                due = True
        if due:
            die(name, job)


def _whole(text: str, where: str, low: int) -> int:
    """A whole number of at least `low`, or ValueError naming `where`."""
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{where}: {text!r} is not a whole number") from None
    if value < low:
        raise ValueError(f"{where}: {value} is below {low}")
    return value


def _probability(text: str, where: str) -> float:
    """A probability in [0, 1] (not NaN), or ValueError naming `where`."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{where}: {text!r} is not a number") from None
    if not 0.0 <= value <= 1.0:  # NaN fails both comparisons
        raise ValueError(f"{where}: a probability must be within 0..1, got {text}")
    return value


def _known(name: str, known: set[str], variable: str) -> None:
    if name != "*" and name not in known:
        raise ValueError(f"{variable} names unknown crash point {name!r}; "
                         f"known: {', '.join(sorted(known))}")


class Trace:
    """A handler that appends every point passed to a trace file, then hands the point on."""

    def __init__(self, path: str, then: Handler | None = None) -> None:
        self.path, self.then, self.fd = path, then, None
        self.pid = os.getpid()

    def __call__(self, name: str, job: str | None) -> None:
        if self.fd is None:
            self.fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        line = json.dumps({"t": time.time(), "pid": self.pid, "thread": threading.get_ident(),
                           "point": name, "job": job})
        os.write(self.fd, (line + "\n").encode())  # one short write(): appends stay whole
        if self.then is not None:
            self.then(name, job)


#: Seconds between two looks of a held thread for its release.
HOLD_POLL = 0.005


def release_file(log: str, pid: int, hold: int) -> str:
    """The file whose creation releases hold number `hold` of process `pid` (see above)."""
    return f"{log}.release.{pid}.{hold}"


class Hold:
    """A handler that holds the thread that passes a point NINELIVES_HOLD_AT names, pauses
    the process's other threads at the points NINELIVES_HOLD_PAUSE names while it holds, and
    notes those NINELIVES_HOLD_WATCH names; then hands the point on (see the module
    docstring).

    The line goes to the hold log before the thread blocks, in one write(), so the harness
    that releases it knows where and for which job it stands. No signal stops anything: a
    process stopped whole (SIGSTOP) stopped its other threads wherever they stood, a
    heartbeat or another job slot inside its write transaction among them, and every other
    process's writes then waited for the lock that transaction held, for as long as the hold
    lasted."""

    def __init__(self, env: dict[str, str], points: Iterable[str],
                 then: Handler | None = None) -> None:
        known = set(points)
        self.log, self.then = env["NINELIVES_HOLD_LOG"], then
        self.off = self.log + ".off"
        self.at: dict[str, list[tuple[str | None, int]]] = {}
        self.hits: dict[tuple[str, str | None, int], int] = {}
        self.lock = threading.Lock()  # job slots pass points from several threads
        self.turn = threading.Condition()
        self.holder: int | None = None  # the thread held now
        self.holds = 0
        for item in filter(None, (p.strip() for p in env.get("NINELIVES_HOLD_AT", "").split(","))):
            where = f"NINELIVES_HOLD_AT item {item!r}"
            rest, slash, every = item.rpartition("/") if "/" in item else (item, "", "1")
            name, _, job = rest.partition("=")
            _known(name, known - {"*"}, "NINELIVES_HOLD_AT")
            self.at.setdefault(name, []).append((job or None, _whole(every, where, 1)))
        self.watch = _names(env, "NINELIVES_HOLD_WATCH", known)
        self.pause = _names(env, "NINELIVES_HOLD_PAUSE", known)

    def __call__(self, name: str, job: str | None) -> None:
        if self.holder is not None and name in self.pause:
            self._pause()
        if (name in self.at or name in self.watch) and not os.path.exists(self.off):
            if name in self.watch:
                self._note(name, job, "reach")
            if self._due(name, job):
                self._hold(name, job)
        if self.then is not None:
            self.then(name, job)

    def _pause(self) -> None:
        """Wait while another thread of this process is held."""
        me = threading.get_ident()
        with self.turn:
            while self.holder is not None and self.holder != me:
                self.turn.wait()

    def _hold(self, name: str, job: str | None) -> None:
        """Note the hold, then block until the harness releases it or disarms the probe."""
        me = threading.get_ident()
        with self.turn:
            while self.holder is not None and self.holder != me:
                self.turn.wait()  # one hold at a time: this one waits for the other's end
            self.holder, self.holds = me, self.holds + 1
            number = self.holds
        try:
            self._note(name, job, "hold", hold=number)
            go = release_file(self.log, os.getpid(), number)
            while not os.path.exists(go) and not os.path.exists(self.off):
                time.sleep(HOLD_POLL)
            try:
                os.unlink(go)
            except OSError:
                pass  # released by the .off file
        finally:
            with self.turn:
                self.holder = None
                self.turn.notify_all()

    def _due(self, name: str, job: str | None) -> bool:
        for pattern, every in self.at.get(name, ()):
            if pattern is None or (job is not None and fnmatch.fnmatchcase(job, pattern)):
                with self.lock:
                    key = (name, pattern, every)
                    hits = self.hits[key] = self.hits.get(key, 0) + 1
                if hits % every == 0:
                    return True
        return False

    def _note(self, name: str, job: str | None, action: str, **more: int) -> None:
        line = json.dumps({"t": time.time(), "pid": os.getpid(), "point": name, "job": job,
                           "action": action, **more})
        fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (line + "\n").encode())  # one short write(): appends stay whole
        finally:
            os.close(fd)


def _names(env: dict[str, str], variable: str, known: set[str]) -> set[str]:
    """The comma-separated point names of `variable`, each one the engine declares."""
    names = set(filter(None, (p.strip() for p in env.get(variable, "").split(","))))
    for name in names:
        _known(name, known - {"*"}, variable)
    return names


def arm_from_env(points: Iterable[str], environ: dict[str, str] | None = None) -> bool:
    """Arm the probe from the environment if it asks for anything; True when armed."""
    env = os.environ if environ is None else environ
    handler: Handler | None = None
    points = tuple(points)
    if env.get("NINELIVES_CRASH_AT") or env.get("NINELIVES_CRASH_JOBS"):
        handler = Armed(dict(env), points)
    if env.get("NINELIVES_HOLD_LOG") and (env.get("NINELIVES_HOLD_AT")
                                          or env.get("NINELIVES_HOLD_WATCH")):
        handler = Hold(dict(env), points, then=handler)
    if env.get("NINELIVES_TRACE"):
        handler = Trace(env["NINELIVES_TRACE"], then=handler)
    if handler is None:
        return False
    set_handler(handler)
    return True
