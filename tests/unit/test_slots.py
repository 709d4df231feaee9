"""Job slots and group commit, in-process on a real SQLite file: a batch commits all or
nothing, a group carries the finishing writes of slots that arrive while a commit is under
way, a stale write fails its own slot only, a database error or a crash fails the whole group,
one heartbeat beats for every slot under its own id, and N slots work a queue to the end."""
from __future__ import annotations

import dataclasses
import threading
import time

import pytest

from engine import (DOCUMENT, LeaseLost, ManualClock, StoreBusy, SystemClock, Worker, load_config,
                    open_store)
from engine.hooks import set_crash_handler
from engine.slots import GroupCommit, Slots
from engine.store import DatabaseError
from engine.worker import Heartbeat

DOC = {"doc_id": "d", "title": "Invoice", "body": "pay forty two euros"}


class Crash(BaseException):
    """What a crash handler raises in-process: nothing uncommitted may survive it."""


@pytest.fixture
def crash_at():
    """crash_at(point): raise Crash at the first hit of `point` (the handler is removed after)."""
    def arm(point):
        def handler(name):
            if name == point:
                raise Crash(point)
        set_crash_handler(handler)
    yield arm
    set_crash_handler(None)


def claims(store, clock, n, lease=5.0):
    """n jobs submitted and claimed, each by its own slot id."""
    for i in range(n):
        store.submit(f"job-{i}", DOCUMENT, DOC, clock.now())
    return [store.claim(DOCUMENT, f"w/{i}", clock.now(), lease, 10) for i in range(n)]


def complete(claim, clock, who):
    """The finishing write of `claim`'s fetch step, as a slot hands it to the group."""
    return lambda store: store.complete(claim, DOCUMENT, who, clock.now(),
                                        output='{"title": "t", "text": "x", "chars": 1}')


def memos(store):
    return {r["job_id"] for r in store.query("SELECT job_id FROM step_result")}


def states(store):
    return {r["id"]: r["state"] for r in store.query("SELECT id, state FROM job")}


# --- the store's batch --------------------------------------------------------------------

def test_a_batch_commits_nothing_when_it_crashes_before_its_commit(store, clock, crash_at):
    a, b = claims(store, clock, 2)
    crash_at("worker.group.before_commit")
    with pytest.raises(Crash):
        GroupCommit(clock)._run(store, [_entry(complete(a, clock, "w/0")),
                                        _entry(complete(b, clock, "w/1"))])
    assert memos(store) == set() and set(states(store).values()) == {"fetching"}


def test_a_write_that_raises_in_a_batch_is_undone_alone(store, clock):
    a, b = claims(store, clock, 2)
    hits = []

    def first_fails(name):  # an error inside the first write's own transaction work
        if name == "worker.before_commit" and not hits:
            hits.append(name)
            raise ValueError("a bug in this slot's write")

    set_crash_handler(first_fails)
    try:
        results = GroupCommit(clock)._run(store, [_entry(complete(a, clock, "w/0")),
                                                  _entry(complete(b, clock, "w/1"))])
    finally:
        set_crash_handler(None)
    assert isinstance(results[0][1], ValueError) and results[1][1] is None
    assert memos(store) == {"job-1"}
    assert states(store) == {"job-0": "fetching", "job-1": "fetched"}


def _entry(write):
    from engine.slots import _Write
    return _Write(write, deadline=float("inf"))


# --- group commit across threads ----------------------------------------------------------

def held_lock(db):
    """Another connection holding the write lock until the returned event is set."""
    release, held = threading.Event(), threading.Event()

    def hold():
        other = open_store(db, synchronous="NORMAL")
        with other.write():
            held.set()
            release.wait(10)
        other.close()

    thread = threading.Thread(target=hold)
    thread.start()
    assert held.wait(10)
    return release, thread


def run_slots_writes(db, writes, group):
    """Each write from its own thread and connection, as slots do; their outcomes in order."""
    outcomes: list = [None] * len(writes)

    def slot(i, write):
        store = open_store(db, synchronous="NORMAL")
        try:
            outcomes[i] = group.commit(store, write, deadline=time.time() + 30)
        except Exception as exc:  # the slot's own outcome, looked at below
            outcomes[i] = exc
        finally:
            store.close()

    threads = [threading.Thread(target=slot, args=(i, w)) for i, w in enumerate(writes)]
    return threads, outcomes


def test_writes_that_arrive_during_a_commit_go_in_the_next_group_and_a_stale_one_fails_alone(
        store, db_path):
    clock = ManualClock(time.time())
    jobs = claims(store, clock, 5, lease=0.5)
    # job-2's lease ran out and another worker took it: the slot's token is stale
    clock.advance(1.0)
    taker = store.claim(DOCUMENT, "other", clock.now(), 5.0, 10)
    assert taker.job_id == "job-0"  # the oldest due job first
    stale_slot = 0
    for claim in jobs[1:]:  # the other four renew in time
        assert store.heartbeat(claim.job_id, claim.lease_token, clock.now(), 30.0)
    group = GroupCommit(clock)
    release, holder = held_lock(db_path)
    threads, outcomes = run_slots_writes(
        db_path, [complete(c, clock, f"w/{i}") for i, c in enumerate(jobs)], group)
    for t in threads:
        t.start()
    deadline = time.time() + 10
    while len(group._queue) < len(jobs) - 1 and time.time() < deadline:
        time.sleep(0.005)  # one leads (waiting for the lock), the rest queue behind it
    release.set()
    for t in threads + [holder]:
        t.join(10)
    assert isinstance(outcomes[stale_slot], LeaseLost), outcomes
    assert all(o is None for i, o in enumerate(outcomes) if i != stale_slot), outcomes
    assert (group.groups, group.writes) == (2, 5)
    assert states(store) == {"job-0": "fetching", **{f"job-{i}": "fetched" for i in range(1, 5)}}
    # first writer wins: the stale slot's paid-for memo is kept, its transition is not
    assert memos(store) == {f"job-{i}" for i in range(5)}
    assert store.job("job-0")["lease_owner"] == "other"


def test_a_database_error_fails_every_write_of_the_group_and_commits_none(store, clock):
    a, b = claims(store, clock, 2)

    def disk_full(s):
        raise DatabaseError("database x: disk is full")

    group = GroupCommit(clock)
    with pytest.raises(DatabaseError):
        group._lead(store, entries := [_entry(complete(a, clock, "w/0")), _entry(disk_full)])
    assert all(isinstance(e.error, DatabaseError) for e in entries)
    assert memos(store) == set()


def test_a_write_whose_lease_ends_while_the_database_is_locked_is_given_up_alone(
        store, db_path):
    clock = SystemClock()  # the lock is held in real time
    a, b = claims(store, clock, 2)
    store.busy_timeout, store.wait_clock = 0.05, None
    release, holder = held_lock(db_path)
    soon, later = _entry(complete(a, clock, "w/0")), _entry(complete(b, clock, "w/1"))
    now = clock.now()
    soon.deadline, later.deadline = (lambda: now + 0.01), (lambda: now + 60)
    try:
        done = threading.Event()
        threading.Thread(target=lambda: (GroupCommit(clock)._lead(store, [soon, later]),
                                         done.set())).start()
        deadline = time.time() + 10
        while not soon.done and time.time() < deadline:
            time.sleep(0.01)
        assert isinstance(soon.error, StoreBusy) and not later.done
    finally:
        release.set()
        holder.join(10)
    assert done.wait(10) and later.error is None
    assert states(store) == {"job-0": "fetching", "job-1": "fetched"}


# --- one heartbeat for every slot ---------------------------------------------------------

def test_one_heartbeat_beats_for_every_slot_under_its_own_id_and_tells_only_the_lost_one(
        store, db_path):
    clock = ManualClock(time.time())
    a, b, c = claims(store, clock, 3)
    # c's job is taken by another worker after its lease ran out: its beat must find no row
    clock.advance(6.0)
    for claim in (a, b):
        assert store.heartbeat(claim.job_id, claim.lease_token, clock.now(), 5.0)
    assert store.claim(DOCUMENT, "other", clock.now(), 5.0, 10).job_id == "job-2"
    ticks = iter(range(3))

    def sleep(_):
        if next(ticks, None) is None:
            raise Crash("done")

    clock.sleep = sleep
    tick = iter(range(0, 1000, 10))
    heartbeat = Heartbeat(lambda: open_store(db_path, synchronous="NORMAL"), clock, 5.0, 2.0,
                          "w", thread=lambda **_: type("Idle", (), {"start": lambda s: None})(),
                          monotonic=lambda: float(next(tick)))
    with heartbeat.watching(a, "w/0") as watch_a, heartbeat.watching(b, "w/1") as watch_b, \
            heartbeat.watching(c, "w/2") as watch_c:
        with pytest.raises(Crash):
            heartbeat._run()
        assert watch_c.lost.is_set() and not watch_a.lost.is_set() \
            and not watch_b.lost.is_set()
        # each kept lease's slot knows its renewal, the lost one keeps its claim's end
        assert watch_a.until == watch_b.until == clock.now() + 5.0
        assert watch_c.until == c.lease_until
    rows = {r["id"]: r for r in store.query("SELECT id, updated_by, lease_until FROM job")}
    assert rows["job-0"]["updated_by"] == "w/0" and rows["job-1"]["updated_by"] == "w/1"
    assert rows["job-2"]["updated_by"] == "other"
    assert rows["job-0"]["lease_until"] >= clock.now() + 5.0 - 1e-6


# --- slots end to end ---------------------------------------------------------------------

def make_slots(db, config, **overrides):
    config = dataclasses.replace(config, **overrides)
    return Slots(config, lambda: open_store(db, synchronous="NORMAL"),
                 lambda store, **kw: Worker(store, config, **kw), worker_id="worker:h:1:ab")


def test_slots_work_a_queue_to_the_end_each_slot_under_its_own_id(store, db_path, config):
    for i in range(24):
        store.submit(f"job-{i}", DOCUMENT, DOC, time.time())
    slots = make_slots(db_path, config, slots=4, poll_interval=0.002)
    stats = slots.run(exit_when_idle=True)
    slots.close()
    assert set(states(store).values()) == {"delivered"}
    assert stats.claims == 24 and stats.steps == 24 * 4
    ids = {f"worker:h:1:ab/{k}" for k in range(4)}
    assert {w.id for w in slots.workers} == ids
    # Which slots got work is the scheduler's to say (on a loaded machine the first slot
    # may empty the queue before the others start): each write is under a slot's own id.
    writers = {r["worker"] for r in store.query("SELECT DISTINCT worker FROM spend")}
    assert writers and writers <= ids
    assert slots.group is not None and slots.group.writes == 24 * 4


def test_one_slot_is_the_plain_worker_under_the_process_id(store, db_path, config):
    store.submit("job-0", DOCUMENT, DOC, time.time())
    slots = make_slots(db_path, config, slots=1)
    slots.run(exit_when_idle=True)
    slots.close()
    assert slots.group is None and slots.workers[0].id == "worker:h:1:ab"
    assert store.job("job-0")["state"] == "delivered"


def test_a_slot_that_dies_of_an_error_stops_the_others_and_the_error_is_raised(
        store, db_path, config):
    for i in range(8):
        store.submit(f"job-{i}", DOCUMENT, DOC, time.time())
    slots = make_slots(db_path, config, slots=3)
    broken = slots.workers[1]
    broken.run_once = lambda: (_ for _ in ()).throw(DatabaseError("database x: gone"))
    with pytest.raises(DatabaseError, match="gone"):
        slots.run(exit_when_idle=False)  # would run forever if the others did not stop
    slots.close()


def test_without_group_commit_each_slot_commits_on_its_own(store, db_path, config):
    store.submit("job-0", DOCUMENT, DOC, time.time())
    slots = make_slots(db_path, config, slots=2, group_commit=False)
    slots.run(exit_when_idle=True)
    slots.close()
    assert slots.group is None and store.job("job-0")["state"] == "delivered"


@pytest.mark.parametrize("value", [0, 1025])
def test_slots_out_of_range_is_refused_naming_the_setting(value):
    with pytest.raises(ValueError, match="'slots' must be from 1 to 1024"):
        load_config(env={}, overrides={"slots": value})


def test_seeded_slots_draw_from_different_random_sources(db_path, config):
    slots = make_slots(db_path, config, slots=3)
    draws = {w.rng.random() for w in slots.workers}
    slots.close()
    assert len(draws) == 3
