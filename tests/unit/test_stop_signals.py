"""A stop signal that lands while the main thread starts a child is raised after it, never
inside Python's at-fork hooks (where it would be printed as "Exception ignored" and lost)."""
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from chaos.run.supervisor import Stopped, signals_deferred, stop_on_signals

SCRIPT = textwrap.dedent("""
    import os, signal, sys
    from chaos.run.supervisor import Stopped, start_owned, stop_on_signals
    stop_on_signals()
    armed = []
    def hook():  # runs in this process after the fork, as logging's own hook does
        if armed:
            armed.clear()
            os.kill(os.getpid(), signal.SIGTERM)
            sum(range(10000))  # bytecode for the handler to run in
    os.register_at_fork(after_in_parent=hook)
    armed.append(1)
    try:
        child = start_owned([sys.executable, "-c", "pass"])
    except Stopped:
        print("stopped after the start")
        sys.exit(0)
    child.wait()
    print("the stop was lost")
    sys.exit(1)
""")


def test_a_sigterm_during_a_childs_start_is_raised_after_it():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "stopped after the start" in done.stdout
    assert "Exception ignored" not in done.stderr, done.stderr


def test_a_deferred_signal_is_raised_once_at_the_end_of_the_block():
    restore = stop_on_signals()
    try:
        reached = False
        with pytest.raises(Stopped):
            with signals_deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                sum(range(10000))
                reached = True
        assert reached
        with signals_deferred():  # nothing left pending
            sum(range(10000))
    finally:
        restore()
