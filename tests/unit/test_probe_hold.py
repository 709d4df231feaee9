"""The probe's hold in a real child process, in both its forms: the harness's `chaos.probe`
(which an engine may copy) and the reference engine's own `engine.hooks`. A hold blocks the
thread that reached the aimed point until the harness releases it; the process's other
threads wait at their next point outside a write transaction, and none is ever stopped
inside one (a SIGSTOP of the whole process froze a thread mid-transaction, and with it every
other process's writes)."""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time

import pytest

from chaos.spec import aim as aims
from chaos.run.aim_watch import _stopped_or_gone
from timed import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: the engine's point names, which both probes are armed with here
HOLD, INSIDE, PAUSE, WATCH = ("worker.after_call", "worker.before_commit",
                              "worker.after_commit", "worker.after_claim")

#: how each probe is armed and passes a point, in the child
ARM = {
    "chaos.probe": """
from chaos import probe
from engine.hooks import CRASHPOINTS
probe.arm_from_env(CRASHPOINTS)
point = probe.point
""",
    "engine.hooks": """
from engine import hooks
hooks.arm_from_env()
def point(name, job):
    hooks.set_current_job(job)
    hooks.crashpoint(name)
"""}

SEQUENCE = """
point("worker.after_claim", "doc-1")
point("worker.after_call", "doc-2")
point("worker.after_call", "doc-1")
print("went on", flush=True)
"""

#: a second thread commits a write transaction while the first is held: it passes a point
#: inside the transaction, commits, then waits at a pause point until the hold ends
FREEZE = """
import os, sqlite3, sys, threading, time
db, log, after = sys.argv[1:4]
begun = threading.Event()

def held():
    return os.path.exists(log) and '"hold"' in open(log).read()

def writer():
    conn = sqlite3.connect(db, isolation_level=None, timeout=30)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO t VALUES (1)")
    begun.set()
    while not held():
        time.sleep(0.005)
    point("worker.before_commit", "doc-2")  # inside the transaction: goes on
    conn.execute("COMMIT")
    point("worker.after_commit", "doc-2")   # outside: waits while the other thread is held
    open(after, "w").close()

thread = threading.Thread(target=writer)
thread.start()
begun.wait()
point("worker.after_call", "doc-1")
thread.join()
print("went on", flush=True)
"""

#: two threads due at the same point: one hold at a time
TWO = """
import threading
threads = [threading.Thread(target=point, args=("worker.after_call", "doc-1"))
           for _ in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print("went on", flush=True)
"""

PROBES = pytest.mark.parametrize("probe", sorted(ARM))


def _child(probe, body, log, *args, at=f"{HOLD}=doc-1"):
    env = {**os.environ, "PYTHONPATH": ROOT, "NINELIVES_HOLD_LOG": str(log),
           "NINELIVES_HOLD_AT": at, "NINELIVES_HOLD_WATCH": WATCH,
           "NINELIVES_HOLD_PAUSE": ",".join((WATCH, HOLD, PAUSE))}
    return subprocess.Popen([sys.executable, "-c", ARM[probe] + body, *map(str, args)],
                            env=env, stdout=subprocess.PIPE, text=True)


def _lines(log):
    return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


def _holds(log):
    return [x for x in _lines(log) if x["action"] == "hold"]


def _release(log, hold):
    go = aims.release_file(str(log), hold["pid"], hold["hold"])
    open(go, "w").close()
    return go


def _end(child):
    if child.poll() is None:
        child.kill()
        child.wait()


@PROBES
def test_a_hold_blocks_the_thread_until_its_release_file_and_stops_nothing(tmp_path, probe):
    log = tmp_path / "holds.jsonl"
    child = _child(probe, SEQUENCE, log)
    try:
        assert wait_until(lambda: _holds(log))
        assert [(x["action"], x["point"], x["job"], x.get("hold")) for x in _lines(log)] == [
            ("reach", WATCH, "doc-1", None), ("hold", HOLD, "doc-1", 1)]
        time.sleep(0.2)  # were it going on, it would have ended by now
        assert child.poll() is None and not _stopped_or_gone(child.pid)  # held, not stopped
        go = _release(log, _holds(log)[0])
        out, _ = child.communicate(timeout=10)
        assert out.strip() == "went on" and child.returncode == 0
        assert not os.path.exists(go)  # the held thread removed its release file
    finally:
        _end(child)


@PROBES
def test_a_held_process_never_keeps_another_threads_transaction_open(tmp_path, probe):
    """While one thread is held, another thread of its process that is inside a write
    transaction finishes it (another process can write meanwhile), then waits at its next
    point outside a transaction until the hold ends."""
    log, db, after = tmp_path / "holds.jsonl", tmp_path / "t.db", tmp_path / "after"
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("CREATE TABLE t (x)")
    child = _child(probe, FREEZE, log, db, log, after)
    try:
        assert wait_until(lambda: _holds(log))
        other = sqlite3.connect(db, isolation_level=None, timeout=10)
        other.execute("BEGIN IMMEDIATE")  # waits for the held process's transaction: briefly
        other.execute("INSERT INTO t VALUES (2)")
        other.execute("COMMIT")
        other.close()
        time.sleep(0.2)
        assert not after.exists()  # the writer waits at its pause point
        _release(log, _holds(log)[0])
        out, _ = child.communicate(timeout=10)
        assert out.strip() == "went on" and after.exists()
    finally:
        _end(child)
    with sqlite3.connect(db) as conn:
        assert sorted(x for (x,) in conn.execute("SELECT x FROM t")) == [1, 2]


@PROBES
def test_one_thread_of_a_process_holds_at_a_time(tmp_path, probe):
    log = tmp_path / "holds.jsonl"
    child = _child(probe, TWO, log)
    try:
        assert wait_until(lambda: _holds(log))
        time.sleep(0.2)
        assert len(_holds(log)) == 1  # the other thread waits for the first hold's end
        _release(log, _holds(log)[0])
        assert wait_until(lambda: len(_holds(log)) == 2)
        assert [h["hold"] for h in _holds(log)] == [1, 2]
        _release(log, _holds(log)[1])
        out, _ = child.communicate(timeout=10)
        assert out.strip() == "went on"
    finally:
        _end(child)


@PROBES
def test_the_off_file_lets_a_held_thread_go_on(tmp_path, probe):
    log = tmp_path / "holds.jsonl"
    child = _child(probe, SEQUENCE, log)
    try:
        assert wait_until(lambda: _holds(log))
        open(aims.off_file(str(log)), "w").close()
        out, _ = child.communicate(timeout=10)
        assert out.strip() == "went on"
    finally:
        _end(child)


@PROBES
def test_the_probe_is_disarmed_by_the_off_file(tmp_path, probe):
    log = tmp_path / "holds.jsonl"
    open(aims.off_file(str(log)), "w").close()
    child = _child(probe, SEQUENCE, log)
    try:
        out, _ = child.communicate(timeout=30)
        assert out.strip() == "went on" and not log.exists()
    finally:
        _end(child)


def test_the_probe_refuses_an_unknown_pause_point():
    from chaos import probe
    with pytest.raises(ValueError, match="NINELIVES_HOLD_PAUSE names unknown crash point"):
        probe.Hold({"NINELIVES_HOLD_LOG": "x", "NINELIVES_HOLD_PAUSE": "w.nope"}, ["w.a"])
