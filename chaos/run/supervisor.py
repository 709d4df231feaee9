"""The supervisor: spawns engine processes with the commands the adapter gives, keeps the
asked-for number alive, records their lifecycle, and ends them all. And the same ownership for
every other process a harness command starts: pool workers (`OwnedPool`), and a clean stop on
SIGINT or SIGTERM (`stop_on_signals`, `Stopped`).

Whoever starts a process ends it: `close()` terminates, then kills, then reaps every child.
Every child is started with PR_SET_PDEATHSIG set before exec, so it dies with the runner
even when the runner itself is SIGKILLed, whatever the engine does.
"""
from __future__ import annotations

import ctypes
import functools
import multiprocessing
import os
import signal
import subprocess
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator

from chaos.contract import Command
from chaos.history import Event


@dataclass
class Child:
    """One spawned engine process."""

    name: str
    role: str
    slot: int
    proc: subprocess.Popen
    started: float
    log_path: str | None = None
    ended: float | None = None
    killed: bool = False       # the harness sent the signal that ended it

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass
class Supervisor:
    """Owns the engine processes of one run.

    command: (role, slot, spawn number) -> the Command to start (the adapter's argv and
    environment, from the runner's settings for that slot);
    record: where lifecycle events go.
    """

    command: Callable[[str, int, int], Command]
    log_dir: str | None = None
    record: Callable[[Event], None] = lambda event: None
    children: list[Child] = field(default_factory=list)
    spawned: int = 0
    closing: bool = False

    def spawn(self, role: str, slot: int = 0) -> Child:
        """Start one `worker` or `sender` process in `slot`."""
        self.spawned += 1
        name = f"{role}-{slot}.{self.spawned}"
        command = self.command(role, slot, self.spawned)
        log_path = os.path.join(self.log_dir, f"{name}.log") if self.log_dir else None
        out = open(log_path, "ab") if log_path else subprocess.DEVNULL
        try:
            proc = start_owned(command.argv, stdin=subprocess.DEVNULL, stdout=out,
                               stderr=out, env={**os.environ, **command.env})
        finally:
            if log_path:
                out.close()
        child = Child(name, role, slot, proc, time.time(), log_path)
        self.children.append(child)
        self.record({"t": child.started, "src": "process", "type": "spawn", "name": name,
                     "role": role, "slot": slot, "pid": child.pid, "code": None,
                     "signal": None})
        return child

    def signal(self, child: Child, sig: int) -> None:
        """Send `sig` to `child` on the harness's behalf (its exit then counts as caused)."""
        if sig in (signal.SIGKILL, signal.SIGTERM):
            child.killed = True
        _send(child.proc, sig)

    def reap(self) -> list[Child]:
        """Children that exited since the last call; each exit is recorded, with the tail
        of its log when the harness did not end it."""
        gone = []
        for child in self.children:
            if child.ended is None and child.proc.poll() is not None:
                child.ended = time.time()
                code = child.proc.returncode
                sig = signal.Signals(-code).name if code < 0 else None
                killed = child.killed or self.closing
                event = {"t": child.ended, "src": "process", "type": "exit",
                         "name": child.name, "role": child.role, "slot": child.slot,
                         "pid": child.pid, "code": code, "signal": sig, "killed": killed}
                if not killed:
                    event["log_tail"] = log_tail(child.log_path)
                self.record(event)
                gone.append(child)
        return gone

    def alive(self, role: str | None = None) -> list[Child]:
        return [c for c in self.children
                if c.ended is None and c.alive() and (role is None or c.role == role)]

    def keep(self, counts: dict[str, int]) -> list[Child]:
        """Respawn into every empty slot so that `counts[role]` processes run."""
        started = []
        for role, count in counts.items():
            busy = {c.slot for c in self.alive(role)}
            for slot in range(count):
                if slot not in busy:
                    started.append(self.spawn(role, slot))
        return started

    def close(self, grace: float = 3.0) -> None:
        """Terminate every child, kill those still alive after `grace` seconds, reap all."""
        self.closing = True
        for child in self.alive():
            _send(child.proc, signal.SIGCONT)  # a stopped process cannot act on SIGTERM
            _send(child.proc, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for child in self.children:
            try:
                child.proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.proc.kill()
                child.proc.wait()
        self.reap()

    def __enter__(self) -> "Supervisor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_owned(argv: list[str], **popen: Any) -> subprocess.Popen:
    """subprocess.Popen(argv, **popen) for a child that dies with this process
    (die_with_parent). A stop signal arriving meanwhile is raised once the child is started:
    with a preexec_fn, Python runs its at-fork hooks in this process, and an interrupt raised
    inside one of those is printed as "Exception ignored" and lost."""
    with signals_deferred():
        return subprocess.Popen(argv, preexec_fn=functools.partial(die_with_parent, os.getpid()),
                                **popen)


def run_owned(argv: list[str], check: bool = False, **popen: Any) -> subprocess.CompletedProcess:
    """subprocess.run for a child started by start_owned: waits for it, and kills it if this
    process is interrupted meanwhile."""
    if popen.pop("capture_output", False):
        popen.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc = start_owned(argv, **popen)
    try:
        out, err = proc.communicate()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    if check and proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, argv, out, err)
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def die_with_parent(parent: int | None = None) -> None:
    """In the child before exec: ask Linux to SIGKILL it when the runner dies, whatever
    engine it becomes (PR_SET_PDEATHSIG survives exec), so no engine process is orphaned.

    parent: the pid of the process that started this one. The request only covers a death
    after it, so a child whose parent is no longer `parent` (it died between the fork and
    the request, and the child was handed to another reaper) exits at once."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if parent is not None and os.getppid() != parent:
        os._exit(1)


# -- stopping on a signal -----------------------------------------------------------------

class Stopped(KeyboardInterrupt):
    """SIGTERM told this process to stop. Raised where the main thread was, like the
    KeyboardInterrupt of a Ctrl-C, so that every `finally` and `with` on the way ends what it
    started; a subclass of it, so that whatever handles a Ctrl-C handles this too."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# A stop signal that arrived while the main thread started a child, raised after it.
_deferring = 0
_deferred: int | None = None


@contextmanager
def signals_deferred() -> Iterator[None]:
    """On the main thread: a SIGINT or SIGTERM (under stop_on_signals) arriving in the block is
    raised when the block ends rather than inside it. Elsewhere: nothing (the handler runs on
    the main thread, never inside another thread's fork)."""
    global _deferring, _deferred
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _deferring += 1
    try:
        yield
    finally:
        _deferring -= 1
        if not _deferring and _deferred is not None:
            signum, _deferred = _deferred, None
            _raise_stopped(signum, None)


def stop_on_signals() -> Callable[[], None]:
    """From now on SIGTERM raises Stopped in the main thread, and SIGINT KeyboardInterrupt
    (as Python does by default). Returns what puts the previous handlers back. Off the main
    thread, where no handler can be set, it changes nothing."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    signal.signal(signal.SIGTERM, _raise_stopped)
    signal.signal(signal.SIGINT, _raise_stopped)

    def restore() -> None:
        for sig, handler in before.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
    return restore


def _raise_stopped(signum: int, frame: Any) -> None:
    global _deferred
    if _deferring:
        _deferred = signum
        return
    raise Stopped(signum) if signum == signal.SIGTERM else KeyboardInterrupt()


def exit_code_of(interrupt: KeyboardInterrupt) -> int:
    """128 + the signal that stopped the command: 130 for SIGINT, 143 for SIGTERM."""
    return 128 + getattr(interrupt, "signum", signal.SIGINT)


@contextmanager
def evidence_in(folder: str) -> Iterator[None]:
    """While the block runs, an interrupt leaving it says that `folder` holds the evidence
    written so far (`interrupt.evidence`; the innermost block's folder is kept)."""
    try:
        yield
    except KeyboardInterrupt as exc:
        if getattr(exc, "evidence", None) is None:
            exc.evidence = folder
        raise


# -- pools of worker processes ------------------------------------------------------------

class OwnedPool:
    """A ProcessPoolExecutor whose workers are owned like the supervisor's children.

    Each worker dies when this process dies (PR_SET_PDEATHSIG, and an exit if this process
    was gone before that took effect), and so does whatever a worker starts: its runs' own
    children die with it the same way. A worker leaves Ctrl-C to this process; a SIGTERM
    during a task unwinds the task (its runs stop their processes) and ends the worker.
    Leaving the block by an exception (Ctrl-C, SIGTERM, a bug) cancels what has not started
    and stops every worker: SIGTERM, then SIGKILL after `grace` seconds.

    workers: how many processes; context: the multiprocessing context ("fork" or "spawn").
    Use it from the main thread: Linux sends the death signal when the *thread* that forked
    a worker ends (prctl(2)), and the pool forks from the thread that submits.
    """

    def __init__(self, workers: int, context: Any, grace: float = 8.0) -> None:
        self.workers, self.context, self.grace = workers, context, grace
        self.pool: ProcessPoolExecutor | None = None
        self._before: set[int] = set()

    def __enter__(self) -> "OwnedPool":
        self._before = {p.pid for p in multiprocessing.active_children()}
        self.pool = ProcessPoolExecutor(self.workers, mp_context=self.context,
                                        initializer=_pool_worker_starts,
                                        initargs=(os.getpid(),))
        return self

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Any]:
        """`fn` over `items` in the workers, results in order (ProcessPoolExecutor.map);
        `fn` must be a module-level function."""
        with signals_deferred():  # the pool forks its workers here: see start_owned
            return self.pool.map(functools.partial(_owned_task, fn), items)

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        if exc_type is None:
            self.pool.shutdown(wait=True)
        else:
            self.stop()

    def stop(self) -> None:
        """Cancel the tasks not started, SIGTERM every worker, SIGKILL those still alive
        after the grace period, and reap them all."""
        workers = [p for p in multiprocessing.active_children() if p.pid not in self._before]
        self.pool.shutdown(wait=False, cancel_futures=True)
        for proc in workers:
            proc.terminate()
        deadline = time.monotonic() + self.grace
        for proc in workers:
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()  # its own children die with it (PR_SET_PDEATHSIG)
                proc.join()


def _pool_worker_starts(parent: int) -> None:
    """A pool worker's initializer: die with `parent`, which started it; leave Ctrl-C (which
    a terminal sends to the whole foreground group) to `parent`, which stops its workers;
    die at once on SIGTERM while idle (see _owned_task for a task under way)."""
    die_with_parent(parent)
    signal.signal(signal.SIGINT, _ignore)  # not SIG_IGN: the processes it starts keep Ctrl-C
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _ignore(signum: int, frame: Any) -> None:
    pass


def _owned_task(fn: Callable[[Any], Any], item: Any) -> Any:
    """Run one task in a pool worker. SIGTERM meanwhile raises Stopped inside it, so that
    its `finally` clauses end the processes it started; then the worker exits (it must not
    take the next task from the queue)."""
    signal.signal(signal.SIGTERM, _raise_stopped)
    try:
        return fn(item)
    except Stopped as stop:
        os._exit(exit_code_of(stop))
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def log_tail(path: str | None, lines: int = 20) -> str | None:
    """The last `lines` lines of a child's log (what it said before it died), or None."""
    if not path:
        return None
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 8192))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return None
    return "\n".join(text.splitlines()[-lines:])


def _send(proc: subprocess.Popen, sig: int) -> None:
    try:
        proc.send_signal(sig)
    except ProcessLookupError:
        pass
