"""The PostgreSQL server the tests and the harness start (chaos.run.pgserver) leaves nothing behind: stopped at the end of a session,
and stopped by its watchdog when the process that started it is SIGKILLed."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from chaos.run import pgserver
from chaos.run.pgserver import PostgresServer
from timed import wait_until

TESTS = Path(__file__).resolve().parents[1]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is gone for our purpose: it runs nothing, holds no port
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def postmaster_pid(data: Path) -> int:
    return int((data / "postmaster.pid").read_text().split()[0])


def test_a_stopped_server_leaves_no_process_and_no_folder():
    server = PostgresServer().start()
    pid = postmaster_pid(server.data)
    server.stop()
    server.stop()  # twice is fine
    assert not alive(pid)
    assert not server.folder.exists()


def test_a_test_run_killed_outright_does_not_leave_its_server_running():
    script = textwrap.dedent("""
        import sys, time
        from chaos.run.pgserver import PostgresServer
        server = PostgresServer().start()
        print(server.data, flush=True)
        time.sleep(600)
    """)
    runner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(TESTS.parent)})
    try:
        data = Path(runner.stdout.readline().strip())
        assert data.name == "data", "the server did not start"
        pid = postmaster_pid(data)
        assert alive(pid)
    finally:
        runner.send_signal(signal.SIGKILL)  # ours: started above
        runner.wait()
    assert wait_until(lambda: not alive(pid), 30), f"postgres {pid} outlived its test run"
    assert wait_until(lambda: not data.parent.exists(), 10), f"{data.parent} was left behind"


def test_missing_binaries_fail_with_how_to_install_them(monkeypatch):
    monkeypatch.setattr(pgserver.glob, "glob", lambda pattern: [])
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(RuntimeError, match="`make test` installs them"):
        PostgresServer()
