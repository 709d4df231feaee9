"""The PostgreSQL store rides out its server: a COMMIT whose answer was lost is resolved by
its transaction id (committed: kept, not run again; not committed: run again once), and a
server that is down, restarting or in recovery is waited for within the reconnect window,
past which the error names the server (never its password).

The connection is cut at COMMIT for real: with `synchronous_standby_names` naming a standby
that does not exist, a COMMIT (synchronous_commit on) commits locally and then waits for
that standby, and the test ends its server process (pg_terminate_backend) or crashes the
server while it waits: the server committed, the client never heard."""
from __future__ import annotations

import threading
import time
from typing import Callable

import psycopg
import pytest

from engine import DOCUMENT
from engine.store import DatabaseError, PostgresStore, Spend, open_store
from engine.store.postgres_session import PostgresSession

from store_backends import started_pg_server

LEASE = 5.0


def wait_for(condition: Callable[[], object], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout} s for {what}")
        time.sleep(0.01)


@pytest.fixture(scope="module")
def own_server():
    """A server of this module's own, to crash and restart without disturbing the others."""
    with started_pg_server() as server:
        yield server


@pytest.fixture
def own_url(own_server):
    made = own_server.create_database()
    yield made
    if not own_server.running:  # a test that failed with its server down
        own_server.restart()
    own_server.drop_database(made)


@pytest.fixture
def opened():
    """Opens stores (`opened(url, **options)`, on the caller's clock) and closes them all."""
    stores = []

    def open_one(target, **options):
        store = open_store(target, lease_clock="caller", **options)
        stores.append(store)
        return store

    yield open_one
    for store in stores:
        store.close()


def standby(server_url: str, names: str | None) -> None:
    """Set (or reset, with None) synchronous_standby_names on the server, on a connection
    of its own."""
    with psycopg.connect(server_url, autocommit=True) as admin:
        if names is None:
            admin.execute("ALTER SYSTEM RESET synchronous_standby_names")
        else:
            admin.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{names}'")
        admin.execute("SELECT pg_reload_conf()")


def cut_after_commit(server_url: str, store: PostgresStore, cut: Callable[[int], None],
                     call: Callable[[], object]) -> object:
    """Run `call` on `store` with its COMMITs held after they committed locally, and
    `cut(backend_pid)` once the store's COMMIT waits there. Returns what `call` returned."""
    pid = store.conn.info.backend_pid
    standby(server_url, "absent_standby")
    wait_for(lambda: store.conn.execute("SHOW synchronous_standby_names").fetchone()[0]
             == "absent_standby", "the store's session to hold its commits")
    # The store's backend has the setting, so the postmaster has signalled every process;
    # but a commit waits only once the checkpointer has read it too (it publishes that
    # standbys are defined). A checkpoint is a turn of its loop, which reads a pending reload
    # first.
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute("CHECKPOINT")

    def waiting() -> bool:
        with psycopg.connect(server_url, autocommit=True) as admin:
            return admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid=%s AND"
                                 " wait_event='SyncRep'", (pid,)).fetchone() is not None

    def cutter() -> None:
        try:
            wait_for(waiting, "the store's COMMIT to wait for the standby")
            cut(pid)
        finally:
            standby(server_url, None)  # later commits go through

    thread = threading.Thread(target=cutter)
    thread.start()
    try:
        return call()
    finally:
        thread.join(timeout=120)


def terminate(server_url: str) -> Callable[[int], None]:
    """A cut: pg_terminate_backend of the server process, waiting until it is gone."""
    def cut(pid: int) -> None:
        with psycopg.connect(server_url, autocommit=True) as admin:
            assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]
            wait_for(lambda: admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid=%s",
                                           (pid,)).fetchone() is None,
                     "the server process to end")
    return cut


def count_points(monkeypatch) -> list[str]:
    import engine.store.postgres as backend
    hits: list[str] = []
    monkeypatch.setattr(backend, "crashpoint", hits.append)
    return hits


# -- a COMMIT whose answer was lost ---------------------------------------------------------

def test_a_claim_cut_after_the_server_committed_it_is_kept_and_not_run_again(
        pg_server, url, opened, monkeypatch):
    store = opened(url)  # synchronous FULL: synchronous_commit on, so its COMMIT waits
    for job in ("job-1", "job-2"):
        store.submit(job, DOCUMENT, {}, 1.0)
    hits = count_points(monkeypatch)
    claim = cut_after_commit(pg_server.url, store, terminate(pg_server.url),
                             lambda: store.claim(DOCUMENT, "w1", 2.0, LEASE, 10))
    assert hits == ["claim.before_commit"] and store.reconnects == 1  # its body ran once
    assert (claim.job_id, claim.lease_token) == ("job-1", 1)
    job = store.job("job-1")
    assert (job["state"], job["lease_owner"], job["lease_token"], job["claims"]) == (
        "fetching", "w1", 1, 1)
    assert store.job("job-2")["state"] == "pending"  # no second job was claimed


def test_a_spend_cut_after_the_server_committed_it_is_recorded_once(pg_server, url, opened):
    store = opened(url)
    spend = Spend("job-1", "fetch", "w1", 1, 2.0, 3.0, "ok", 0.25)
    cut_after_commit(pg_server.url, store, terminate(pg_server.url),
                     lambda: store.record_spend(spend))
    assert store.reconnects == 1
    assert store.query("SELECT worker, cost FROM spend") == [{"worker": "w1", "cost": 0.25}]


def test_a_claim_cut_before_the_server_committed_it_is_run_again_once(url, opened, monkeypatch):
    store = opened(url)
    for job in ("job-1", "job-2"):
        store.submit(job, DOCUMENT, {}, 1.0)
    import engine.store.postgres as backend
    hits = []

    def cut_once(point: str) -> None:
        hits.append(point)
        if len(hits) == 1:  # inside the transaction, before COMMIT is sent
            terminate(url)(store.conn.info.backend_pid)

    monkeypatch.setattr(backend, "crashpoint", cut_once)
    claim = store.claim(DOCUMENT, "w1", 2.0, LEASE, 10)
    assert hits == ["claim.before_commit"] * 2 and store.reconnects == 1
    assert (claim.job_id, claim.lease_token) == ("job-1", 1)  # the first was rolled back
    assert store.job("job-1")["claims"] == 1 and store.job("job-2")["state"] == "pending"


def test_a_claim_cut_by_a_server_crash_after_it_committed_is_kept_checked_by_its_row(
        own_server, own_url, opened, monkeypatch):
    """The server restarted: its id's status could be another transaction's (an id whose
    log was lost in a crash is given out again), so the row decides: it is ours."""
    store = opened(own_url, reconnect_window=60.0)
    for job in ("job-1", "job-2"):
        store.submit(job, DOCUMENT, {}, 1.0)
    hits, checked = count_points(monkeypatch), []
    holds = store._holds
    monkeypatch.setattr(store, "_holds", lambda *a: checked.append(a) or holds(*a))

    def crash(pid: int) -> None:
        own_server.crash()
        own_server.restart()

    claim = cut_after_commit(own_server.url, store, crash,
                             lambda: store.claim(DOCUMENT, "w1", 2.0, LEASE, 10))
    assert hits == ["claim.before_commit"] and len(checked) == 1
    assert (claim.job_id, claim.lease_token) == ("job-1", 1)
    assert store.job("job-1")["lease_owner"] == "w1"
    assert store.job("job-2")["state"] == "pending"


# -- a server out of reach ------------------------------------------------------------------

@pytest.fixture
def attempts(monkeypatch) -> list[float]:
    """The time of every connection attempt any store makes from now on."""
    made: list[float] = []
    original = PostgresSession._open

    def counted(self):
        made.append(time.monotonic())
        return original(self)

    monkeypatch.setattr(PostgresSession, "_open", counted)
    return made


def restart_after_failed_attempts(server, attempts: list[float], failed: int = 2):
    """A thread that starts the crashed server again once `failed` attempts have failed."""
    before = len(attempts)

    def restart() -> None:
        wait_for(lambda: len(attempts) >= before + failed, "connection attempts")
        server.restart()

    thread = threading.Thread(target=restart)
    thread.start()
    return thread


def test_a_write_while_the_server_restarts_waits_for_it_and_succeeds(own_server, own_url,
                                                                     opened, attempts):
    store = opened(own_url, reconnect_window=60.0)
    store.submit("job-1", DOCUMENT, {}, 1.0)
    own_server.crash()
    restarter = restart_after_failed_attempts(own_server, attempts)
    try:
        claim = store.claim(DOCUMENT, "w1", 2.0, LEASE, 10)
    finally:
        restarter.join(timeout=120)
    assert claim is not None and claim.job_id == "job-1" and store.reconnects == 1
    assert len(attempts) >= 3  # two refused, then the restarted server


def test_a_process_starting_while_the_server_restarts_waits_for_it(own_server, own_url,
                                                                   opened, attempts):
    own_server.crash()
    restarter = restart_after_failed_attempts(own_server, attempts)
    try:
        store = opened(own_url, reconnect_window=60.0)
    finally:
        restarter.join(timeout=120)
    assert store.submit("job-1", DOCUMENT, {}, 1.0) is True and len(attempts) >= 3


def test_a_server_down_past_the_window_is_a_database_error_naming_it_not_its_password(
        own_server, own_url, opened):
    secret = own_url.replace("postgres@", "postgres:hunter2-secret@")  # trust: accepted
    store = opened(secret, reconnect_window=1.0)
    own_server.crash()
    try:
        says = (r"cannot connect to database postgresql://postgres:\*\*\*@127\.0\.0\.1:\d+/"
                r"\w+ \(tried for 1 s\): .*refused")
        started = time.monotonic()
        with pytest.raises(DatabaseError, match=says) as err:
            store.submit("job-1", DOCUMENT, {}, 1.0)
        assert time.monotonic() - started >= 1.0 and "hunter2" not in str(err.value)
        with pytest.raises(DatabaseError, match=says) as err:  # at a process's start
            open_store(secret, reconnect_window=1.0)
        assert "hunter2" not in str(err.value)
    finally:
        own_server.restart()
    assert store.submit("job-1", DOCUMENT, {}, 1.0) is True  # and back once it is up


def test_a_wrong_database_is_refused_at_once_not_waited_for(own_server, attempts):
    started = time.monotonic()
    with pytest.raises(DatabaseError, match='database "no_such_db" does not exist'):
        open_store(own_server.url_for("no_such_db"), reconnect_window=60.0)
    assert len(attempts) == 1 and time.monotonic() - started < 30
