"""Ctrl-C at any moment of a command's life, its imports included: every entry point
(`ninelives`, `python -m chaos...`, `python -m engine`, `python -m chaos.fakes`) ends with one
line and exit 130, never a traceback (a SIGINT during the imports had printed one and died of
the signal). A worker and a fake server, once serving, stop as they document: exit 0.

The first few tens of milliseconds of a process are the interpreter's own start-up, which no
code of the project reaches: a SIGINT there ends it by the signal (-2 here, 130 in a shell)
or with Python's own traceback (its `site` module, an editable install's finder, runpy). Such a try is told
apart by its stderr and counted apart; each entry must have most of its tries in the
project's own code, and every one of those must be clean.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NINELIVES = os.path.join(os.path.dirname(sys.executable), "ninelives")
DELAYS = (0.0, 0.05, 0.1, 0.2, 0.3)
#: Later moments, tried only while fewer than 3 signals reached the project's code: on a
#: loaded machine the interpreter's own start-up can outlast every one of DELAYS.
LATER = (0.5, 1.0, 2.0)

#: entry -> (argv given a scratch folder, the exit codes of a clean stop once it serves)
ENTRIES = {
    "ninelives sim": (lambda tmp: [NINELIVES, "sim", "smoke", "--seed", "1", "--out", tmp],
                      (130,)),
    "python -m chaos.commands.cli sim": (lambda tmp: [sys.executable, "-m", "chaos.commands.cli", "sim", "smoke",
                                             "--seed", "1", "--out", tmp], (130,)),
    "python -m chaos.score kill": (lambda tmp: [sys.executable, "-m", "chaos.score", "kill",
                                                "--seeds", "1"], (130,)),
    "python -m engine worker": (lambda tmp: [sys.executable, "-m", "engine", "worker", "--db",
                                             os.path.join(tmp, "engine.db")], (0, 130)),
    "ninelives engine worker": (lambda tmp: [NINELIVES, "engine", "worker", "--db",
                                             os.path.join(tmp, "engine.db")], (0, 130)),
    "python -m chaos.fakes": (lambda tmp: [sys.executable, "-m", "chaos.fakes", "provider",
                                           "--ledger", os.path.join(tmp, "ledger.jsonl"),
                                           "--ignore-stdin"], (0, 130)),
}


def interrupted_after(argv: list[str], delay: float, cwd: str) -> tuple[int, str]:
    """Start `argv` with SIGINT at its default (a background shell would have it ignored),
    send SIGINT after `delay` seconds; its exit code and stderr."""
    proc = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        time.sleep(delay)  # the moment itself, not a wait for a condition
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err


def before_any_project_code(code: int, err: str) -> bool:
    """The interpreter's own start-up took the signal (see the module's docstring): it died
    of it saying nothing, or its traceback holds no frame of the project's files (Python's
    `site`, or runpy's own imports before it imports the package)."""
    ours = [os.path.join(ROOT, package) + os.sep for package in ("chaos", "engine")]
    return (code == -signal.SIGINT and not err) or (
        code in (1, -signal.SIGINT) and "KeyboardInterrupt" in err
        and not any(path in err for path in ours))


@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_sigint_at_any_moment_gives_one_line_and_exit_130_never_a_traceback(entry, tmp_path):
    argv, serving_codes = ENTRIES[entry]
    ours = tried = 0
    for delay in DELAYS + LATER:
        if delay in LATER and ours >= 3:
            break
        tried += 1
        code, err = interrupted_after(argv(str(tmp_path)), delay, ROOT)
        if before_any_project_code(code, err):
            continue
        ours += 1
        said = f"{entry} after {delay} s: exit {code}\n{err[-3000:]}"
        assert "Traceback" not in err, said
        assert code in serving_codes + (130,), said
        if code == 130:
            lines = err.strip().splitlines()
            assert [line for line in lines if line.startswith("interrupted (SIGINT)")] \
                == lines[-1:], said
            assert len([line for line in lines if not line.startswith(
                ("ninelives sim", "worker "))]) == 1, said  # a banner, then the one line
    assert ours >= 3, f"{entry}: only {ours} of {tried} signals reached its own code"


@pytest.mark.parametrize("orig_argv,package,command", [
    (["python", "-m", "chaos.commands.cli", "run"], "chaos", True),
    (["python", "-X", "importtime", "-mchaos.fakes"], "chaos", True),
    (["python", "-u", "-m", "engine", "worker"], "engine", True),
    (["python", "/venv/bin/ninelives", "sim"], "chaos", True),
    (["python", "-m", "chaoslike"], "chaos", False),
    (["python", "-m", "pytest", "tests"], "chaos", False),
    (["python", "-c", "import engine", "-m", "engine"], "engine", False),
    (["python", "/venv/bin/pytest"], "chaos", False),
    (["python", "/venv/bin/ninelives"], "engine", False),   # the harness's, not the engine's
])
def test_only_a_command_of_the_package_changes_how_an_interrupt_ends(monkeypatch, orig_argv,
                                                                     package, command):
    """Imported as a library (a host program, pytest, a pool's `-c` child), nothing changes."""
    from chaos.commands.interrupts import is_command as harness
    from engine.interrupts import is_command as engine
    monkeypatch.setattr(sys, "orig_argv", orig_argv)
    assert harness(package, ("ninelives",) if package == "chaos" else ()) is command
    assert engine(package, ("ninelives",) if package == "chaos" else ()) is command


@pytest.mark.parametrize("module", ["chaos.commands.interrupts", "engine.interrupts"])
def test_an_interrupt_python_could_not_raise_still_ends_the_command(module):
    """A Ctrl-C that lands in a weakref callback (as one did in the import system's module
    lock on CI) is dropped by Python with an "Exception ignored" traceback, and the command
    had gone on to exit 0. It must end the command as any other interrupt does."""
    script = (f"from {module} import quiet; quiet()\n"
              "import time, weakref\n"
              "class Thing: pass\n"
              "def callback(ref): raise KeyboardInterrupt\n"
              "thing = Thing(); ref = weakref.ref(thing, callback); del thing\n"
              "for _ in range(500): time.sleep(0.01)\n"
              "print('went on')\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=60,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert (done.returncode, done.stdout) == (130, ""), done
    assert done.stderr.strip().splitlines() == [
        "interrupted (SIGINT): stopped before it finished"], done
