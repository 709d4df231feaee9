"""How an engine command ends when Ctrl-C (or SIGTERM) stops it outside its own handling
(a worker and a sender stop at their next safe point and exit 0; this is for the rest):
one line and exit 130 (143 for SIGTERM), never a traceback, from its first import on.

The package installs this first thing when the process is `python -m engine...`, before
its other imports: a Ctrl-C during them had printed a traceback and died of the signal
(exit -2 to its parent). The interrupt still unwinds as Python's KeyboardInterrupt does (a
write transaction rolls back); only its report changes. Embedded as a library, the engine
changes nothing in its host's signal handling. A signal that arrives before the interpreter
runs any code at all ends the process by the signal's default action (a shell shows 130).

The harness keeps its own copy (chaos/commands/interrupts.py): the engine never imports the
harness, and this module imports only the standard library.
"""
from __future__ import annotations

import _thread
import atexit
import os
import signal
import sys
import time

#: The exit code of a process whose main code an interrupt ended (None: none did).
_ended_by: int | None = None


def is_command(package: str, scripts: tuple[str, ...] = ()) -> bool:
    """Whether this process was started as `python [options] -m <package>[.module]` or as
    one of `scripts` (a console script's path), read from the interpreter's own argv."""
    argv = list(getattr(sys, "orig_argv", []))[1:]
    while argv:
        arg = argv.pop(0)
        if arg in ("-X", "-W"):  # an option that takes the next word
            argv[:1] = []
        elif arg.startswith("-m"):
            module = arg[2:] or (argv[0] if argv else "")
            return module == package or module.startswith(package + ".")
        elif arg == "-c" or arg == "-":
            return False
        elif not arg.startswith("-"):
            return os.path.basename(arg) in scripts
    return False


def quiet_when_a_command(package: str, scripts: tuple[str, ...] = ()) -> None:
    """In a process that is one of the package's commands (see is_command): an interrupt
    that no code caught prints one line and exits 128 + its signal. Call it before any
    other import."""
    if is_command(package, scripts):
        quiet()


def quiet() -> None:
    """From now on, an interrupt that no code caught prints one line and exits 128 + its
    signal, and one that landed where Python cannot raise it still stops the process."""
    report, unraisable = sys.excepthook, sys.unraisablehook
    main = _thread.get_ident()

    def hook(kind, value, tb) -> None:
        if issubclass(kind, KeyboardInterrupt):
            ended(value)
        else:
            report(kind, value, tb)

    def lost(info) -> None:
        # A Ctrl-C that lands in a weakref callback or a __del__ (the import system's module
        # locks have one) is printed as "Exception ignored" and dropped, and the command
        # went on to exit 0: send it again to the main thread, where it ends the command.
        # From another thread, once this hook has returned: raised inside it, it is dropped.
        if isinstance(info.exc_value, KeyboardInterrupt):
            signum = getattr(info.exc_value, "signum", signal.SIGINT)
            _thread.start_new_thread(_signal_again, (main, signum))
        else:
            unraisable(info)
    sys.excepthook, sys.unraisablehook = hook, lost
    atexit.register(_exit_as_interrupted)  # registered first: it runs last


def _signal_again(thread: int, signum: int) -> None:
    """Send `signum` to `thread` a moment from now (the hook that calls this has returned)."""
    time.sleep(0.01)
    signal.pthread_kill(thread, signum)


def ended(interrupt: BaseException) -> None:
    """Say in one line that `interrupt` stopped the command, and make its exit code 128 + the
    signal once the interpreter has run its exit handlers."""
    global _ended_by
    _ended_by = 128 + getattr(interrupt, "signum", signal.SIGINT)
    try:
        sys.stderr.write(f"interrupted ({signal.Signals(_ended_by - 128).name}): stopped "
                         "before it finished\n")
    except (OSError, ValueError):
        pass  # stderr is gone: the exit code says it


def _exit_as_interrupted() -> None:
    """The last exit handler: an interrupted command exits 130 (143), not by the signal."""
    if _ended_by is not None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError, AttributeError):
                pass
        os._exit(_ended_by)
