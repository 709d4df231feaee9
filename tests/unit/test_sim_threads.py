"""The simulation of engines the harness did not write (chaos.sim.threads, chaos.sim.sqlite):
SQLite on the virtual clock (stamps that name the writing thread, lock waits that take
virtual time, a scheduling point at every statement, rollback when a thread dies), the
threading primitives an engine's helper threads use, and the contract's in_process hooks."""
from __future__ import annotations

import sqlite3

import pytest

from chaos import probe
from chaos.contract import ContractError, validate
from chaos.sim.scheduler import CRASH, RUN, Process, ProbeHook, Scheduler
from chaos.sim.sqlite import NOW_SQL, VirtualSQLite
from chaos.sim.threads import SimEvent, SimThread
from test_sim import Script


def world(*decisions):
    script = Script(*decisions)
    sched = Scheduler(0.0, 0.01, 0.1, script, hooks=(ProbeHook(),))
    return sched, VirtualSQLite(sched), script


def actor(sched: Scheduler, name: str, body, pid: int | None = None):
    process = Process(pid=pid or len(sched.actors) + 1, role="worker", slot=0, name=name)
    return sched.spawn(name, body, process)


@pytest.fixture
def db(tmp_path):
    path = str(tmp_path / "t.db")
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (x, t REAL)")
    conn.close()
    return path


def rows(db):
    conn = sqlite3.connect(db)
    try:
        return conn.execute("SELECT x, t FROM t ORDER BY rowid").fetchall()
    finally:
        conn.close()


def test_stamps_are_virtual_and_name_the_thread_that_wrote(db):
    sched, virtual, _ = world()

    def writer(x):
        def body():
            conn = sqlite3.connect(db, isolation_level=None)
            conn.execute(f"INSERT INTO t VALUES (?, {NOW_SQL})", (x,))
            conn.execute(f"INSERT INTO t VALUES (?, {NOW_SQL})", (x,))
        return body

    a, b = actor(sched, "a", writer("a")), actor(sched, "b", writer("b"))
    with virtual.patched():
        sched.run(max_turns=50)
    written = rows(db)
    assert len(written) == 4 and all(t < 1.0 for _, t in written)  # virtual, not the epoch
    by_thread = {x: {t for y, t in written if y == x} for x in "ab"}
    assert len(by_thread["a"]) == len(by_thread["b"]) == 1  # a thread's writes in a row share it
    assert by_thread["a"] != by_thread["b"]                 # two threads at one instant differ
    assert virtual.writer(by_thread["a"].pop()) is a.process
    assert virtual.writer(by_thread["b"].pop()) is b.process
    assert sqlite3.connect is not None and "SimConnection" not in repr(sqlite3.connect(db))


def test_stamps_follow_the_order_writes_commit_in_when_threads_interleave(db):
    sched = Scheduler(0.0, 0.01, 0.1, lambda due: (len(due) - 1, RUN))  # never the last one
    virtual = VirtualSQLite(sched)

    def writer(x):
        def body():
            conn = sqlite3.connect(db, isolation_level=None)
            for _ in range(2):
                conn.execute(f"INSERT INTO t VALUES (?, {NOW_SQL})", (x,))
        return body

    actor(sched, "a", writer("a"))
    actor(sched, "b", writer("b"))
    with virtual.patched():
        sched.run(max_turns=50)
    written = rows(db)  # in commit order
    assert [x for x, _ in written] == ["b", "a", "b", "a"]
    stamps = [t for _, t in written]
    assert stamps == sorted(stamps) and len(set(stamps)) == 4 and stamps[-1] < 0.001


def holder(db: str, sched: Scheduler, seconds: float):
    """A thread that holds the write lock for `seconds` virtual seconds."""
    def body():
        conn = sqlite3.connect(db, isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")
        sched.sleep(seconds)
        conn.execute("ROLLBACK")
    return body


def test_a_locked_database_is_waited_for_on_the_virtual_clock(db):
    sched, virtual, _ = world()
    done = []

    def writer():
        conn = sqlite3.connect(db, timeout=5.0, isolation_level=None)
        conn.execute("INSERT INTO t VALUES ('w', 0)")
        done.append(sched.now())

    actor(sched, "holder", holder(db, sched, 2.0))  # the writer must wait these out
    actor(sched, "writer", writer)
    with virtual.patched():
        sched.run(max_turns=5000)
    assert len(done) == 1 and 2.0 <= done[0] < 2.1
    assert rows(db) == [("w", 0)]


def test_a_lock_held_past_the_busy_timeout_raises_as_sqlite_would(db):
    sched, virtual, _ = world()
    errors = []

    def writer():
        conn = sqlite3.connect(db, isolation_level=None)
        conn.execute("PRAGMA busy_timeout=500")  # the engine's own setting is honoured
        try:
            conn.execute("INSERT INTO t VALUES ('w', 0)")
        except sqlite3.OperationalError as exc:
            errors.append((str(exc), sched.now()))

    actor(sched, "holder", holder(db, sched, 10.0))
    actor(sched, "writer", writer)
    with virtual.patched():
        sched.run(max_turns=5000)
    assert len(errors) == 1 and "locked" in errors[0][0] and 0.5 <= errors[0][1] < 0.6


def test_another_thread_may_run_between_any_two_statements(db):
    sched = Scheduler(0.0, 0.01, 0.1, lambda due: (len(due) - 1, RUN))  # never the last one
    virtual, order = VirtualSQLite(sched), []

    def reader(name):
        def body():
            conn = sqlite3.connect(db, isolation_level=None)
            for _ in range(2):
                conn.execute("SELECT COUNT(*) FROM t").fetchone()
                order.append(name)
        return body

    actor(sched, "a", reader("a"))
    actor(sched, "b", reader("b"))
    with virtual.patched():
        sched.run(max_turns=50)
    # without a turn at each statement, each would run both of its statements in one go
    assert order == ["b", "a", "b", "a"]


def test_a_thread_that_dies_inside_a_transaction_leaves_nothing_behind(db):
    sched, virtual, _ = world((0, RUN), (0, RUN), (0, CRASH))
    written = []

    def doomed():
        conn = sqlite3.connect(db)  # Python's implicit transactions, as the article uses
        conn.execute("INSERT INTO t VALUES ('lost', 0)")
        probe.point("worker.before_commit")
        conn.commit()

    def writer():
        conn = sqlite3.connect(db, isolation_level=None)
        conn.execute("INSERT INTO t VALUES ('kept', 0)")
        written.append(True)

    dead = actor(sched, "doomed", doomed)
    actor(sched, "writer", writer)
    with virtual.patched():
        sched.run(max_turns=500)
    assert dead.exit == "crash" and written == [True]
    assert rows(db) == [("kept", 0)]


def test_an_event_wakes_its_waiter_early_and_a_thread_joins_on_virtual_time():
    sched, _, _ = world()
    process = Process(pid=1, role="worker", slot=0, name="p")
    seen = []

    def main():
        stop = SimEvent(sched)

        def beat():
            while not stop.wait(1.0):
                seen.append(("beat", round(sched.now(), 2)))

        thread = SimThread(sched, process, beat, name="heartbeat")
        thread.start()
        sched.sleep(2.5)
        stop.set()
        thread.join()
        seen.append(("joined", round(sched.now(), 2), thread.is_alive()))

    sched.spawn("main", main, process)
    sched.run(max_turns=100)
    assert [s[0] for s in seen] == ["beat", "beat", "joined"]
    assert seen[-1][1] < 2.6 and seen[-1][2] is False


def test_an_adapter_declaring_in_process_needs_hooks_or_its_own_simulate():
    from examples.toy_engine.adapter import ToyEngine
    view = type("View", (), {n: getattr(ToyEngine, n) for n in dir(ToyEngine)
                             if not n.startswith("_") and n != "in_process"})()
    with pytest.raises(ContractError, match="'in_process' or 'simulate'"):
        validate(view, "toy without hooks")
