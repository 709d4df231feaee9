"""What only the PostgreSQL backend promises, on a real server: leases on the server's clock
(a skewed worker can neither steal nor keep one), claims that skip a row another claimer
holds, a dropped connection reopened without a fenced write landing twice, and versioned
migrations from an empty database, run again idempotently and by two processes at once."""
from __future__ import annotations

import threading
import time

import psycopg
import pytest

from engine import DOCUMENT
from engine.store import DatabaseError, LeaseLost, OperatorError, PostgresStore, open_store
from engine.store.postgres_schema import SCHEMA_VERSION

LEASE = 5.0
HOUR = 3600.0


@pytest.fixture
def opened():
    """Opens stores (`opened(url, **options)`) and closes them all at teardown."""
    stores = []

    def open_one(target, **options):
        store = open_store(target, **options)
        stores.append(store)
        return store

    yield open_one
    for store in stores:
        store.close()


def server_now(store: PostgresStore) -> float:
    return store.query("SELECT extract(epoch FROM clock_timestamp())::float8 AS t")[0]["t"]


# -- the factory -------------------------------------------------------------------------------

def test_open_store_opens_postgres_from_a_url_and_sqlite_from_a_path(url, opened, tmp_path):
    assert isinstance(opened(url), PostgresStore) and opened(url).backend == "postgres"
    assert opened(str(tmp_path / "e.db")).backend == "sqlite"
    with pytest.raises(DatabaseError, match="unsupported database URL scheme 'mysql'"):
        open_store("mysql://x/y")


def test_an_unreachable_server_is_a_database_error_naming_it_without_its_password():
    with pytest.raises(DatabaseError, match=r"cannot connect to database "
                                            r"postgresql://u:\*\*\*@127.0.0.1:1/db") as err:
        open_store("postgresql://u:secret@127.0.0.1:1/db", connect_timeout=2)
    assert "secret" not in str(err.value)


# -- the server's clock ------------------------------------------------------------------------

def test_a_worker_whose_clock_runs_ahead_cannot_steal_a_live_lease(url, opened):
    store = opened(url)
    store.submit("job-1", DOCUMENT, {"doc": 1}, time.time())
    first = store.claim(DOCUMENT, "w1", time.time(), LEASE, 10)
    assert first is not None
    # w2's clock says the lease ended an hour ago; the server's says it has seconds to go
    ahead = opened(url)
    assert ahead.claim(DOCUMENT, "w2", time.time() + HOUR, LEASE, 10) is None
    assert store.job("job-1")["lease_owner"] == "w1"


def test_a_worker_whose_clock_lags_still_claims_a_due_job_on_the_servers_clock(url, opened):
    store = opened(url)
    store.submit("job-1", DOCUMENT, {"doc": 1}, time.time())
    behind = time.time() - HOUR
    claim = store.claim(DOCUMENT, "w1", behind, LEASE, 10)
    assert claim is not None
    # the lease it holds is LEASE seconds of the server's time; the Claim says when that
    # ends on the worker's own clock, for its deadlines
    assert claim.lease_until == behind + LEASE
    job = store.job("job-1")
    assert job["lease_until"] == pytest.approx(server_now(store) + LEASE, abs=2.0)


def test_a_worker_whose_clock_runs_ahead_cannot_keep_a_lease_longer(url, opened):
    store = opened(url)
    store.submit("job-1", DOCUMENT, {"doc": 1}, time.time())
    claim = store.claim(DOCUMENT, "w1", time.time(), LEASE, 10)
    assert store.heartbeat("job-1", claim.lease_token, time.time() + HOUR, LEASE, "w1")
    assert store.job("job-1")["lease_until"] == pytest.approx(server_now(store) + LEASE,
                                                              abs=2.0)


def test_a_retry_time_is_kept_as_a_delay_on_the_servers_clock(url, opened):
    store = opened(url)
    store.submit("job-1", DOCUMENT, {"doc": 1}, 0.0)
    skewed = time.time() + HOUR
    claim = store.claim(DOCUMENT, "w1", skewed, LEASE, 10)
    store.fail(claim, DOCUMENT, "w1", skewed, error="503", retry_at=skewed + 30)
    assert store.job("job-1")["next_run_at"] == pytest.approx(server_now(store) + 30, abs=2.0)
    assert store.claim(DOCUMENT, "w2", skewed + 31, LEASE, 10) is None  # not due on the server


# -- SKIP LOCKED -------------------------------------------------------------------------------

def test_a_claim_skips_a_job_another_transaction_holds_instead_of_waiting(url, opened):
    store = opened(url, lease_clock="caller", busy_timeout=30.0)
    store.submit("held", DOCUMENT, {}, 1.0)    # due first
    store.submit("free", DOCUMENT, {}, 2.0)
    other = opened(url)
    with other.write() as conn:
        conn.execute("SELECT 1 FROM job WHERE id='held' FOR UPDATE")
        started = time.monotonic()
        got = store.claim(DOCUMENT, "w1", 10.0, LEASE, 10)
        assert time.monotonic() - started < 5.0  # no wait for the lock
        assert got.job_id == "free"
    assert store.claim(DOCUMENT, "w1", 10.0, LEASE, 10).job_id == "held"


def waiting_on_a_lock(store: PostgresStore, deadline: float = 10.0) -> None:
    """Returns once some backend of this database waits for a lock (fails past `deadline`)."""
    until = time.monotonic() + deadline
    while not store.query("SELECT 1 FROM pg_stat_activity WHERE datname=current_database()"
                          " AND wait_event_type='Lock'"):
        assert time.monotonic() < until, "no statement came to wait for the row lock"
        time.sleep(0.01)


def test_an_operator_action_waits_for_a_worker_writing_the_job_and_judges_it_as_it_is_then(
        url, opened):
    store = opened(url, lease_clock="caller", busy_timeout=30.0)
    store.submit("j", DOCUMENT, {}, 1.0)
    outcome: list = []
    worker = opened(url)
    with worker.write() as conn:  # a claim under way: the job leaves 'pending' when it commits
        conn.execute("UPDATE job SET state='fetching', lease_token=lease_token+1 WHERE id='j'")
        action = threading.Thread(target=lambda: outcome.append(
            _outcome_of(lambda: opened(url).cancel("j", "operator", 5.0))))
        action.start()
        waiting_on_a_lock(store)
    action.join(10.0)
    # answered as the job stands after the claim (a working job cannot be cancelled), not
    # "changed under the operator" from a read taken before it
    assert outcome and isinstance(outcome[0], OperatorError), outcome
    assert "'fetching'" in str(outcome[0])
    assert store.query("SELECT state FROM job WHERE id='j'")[0]["state"] == "fetching"


def _outcome_of(call):
    try:
        return call()
    except Exception as exc:  # the test reads which exception it was
        return exc


def test_concurrent_claimers_take_every_job_exactly_once(url, opened):
    jobs = 40
    store = opened(url, lease_clock="caller")
    for i in range(jobs):
        store.submit(f"job-{i}", DOCUMENT, {"n": i}, 1.0)
    claimers = [opened(url, lease_clock="caller") for _ in range(4)]
    taken: list[list[str]] = [[] for _ in claimers]
    start = threading.Barrier(len(claimers))

    def claim_all(i: int) -> None:
        start.wait()
        while (got := claimers[i].claim(DOCUMENT, f"w{i}", 10.0, 1000.0, 10)) is not None:
            taken[i].append(got.job_id)

    threads = [threading.Thread(target=claim_all, args=(i,)) for i in range(len(claimers))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    everything = sorted(j for part in taken for j in part)
    assert everything == sorted(f"job-{i}" for i in range(jobs))  # none twice, none missed
    assert {r["lease_token"] for r in store.query("SELECT lease_token FROM job")} == {1}


def test_concurrent_senders_take_every_outbox_row_exactly_once(url, opened):
    store = opened(url, lease_clock="caller")
    from engine.store import Effect
    for i in range(10):
        store.submit(f"job-{i}", DOCUMENT, {}, 1.0)
        claim = store.claim(DOCUMENT, "w", 1.0, LEASE, 10)
        while claim is not None and claim.step.name != "deliver":
            claim = store.complete(claim, DOCUMENT, "w", 1.0, output="{}", continue_lease=LEASE)
        store.complete(claim, DOCUMENT, "w", 1.0, output="{}", effects=(Effect("charge", i),))
    senders = [opened(url, lease_clock="caller") for _ in range(3)]
    taken: list[int] = []
    lock = threading.Lock()

    def send_all(i: int) -> None:
        while (row := senders[i].claim_outbox(f"s{i}", 2.0, 1000.0, 8)) is not None:
            with lock:
                taken.append(row.id)

    threads = [threading.Thread(target=send_all, args=(i,)) for i in range(len(senders))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(taken) == sorted(r["id"] for r in store.query("SELECT id FROM outbox"))
    assert len(taken) == 10


# -- a dropped connection ----------------------------------------------------------------------

def terminate(url: str, store: PostgresStore) -> None:
    """pg_terminate_backend on the store's own server process, from another connection."""
    pid = store.conn.info.backend_pid
    with psycopg.connect(url, autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone()[0]
        for _ in range(100):  # wait until the server process is gone
            if not admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid=%s",
                                 (pid,)).fetchone():
                break
            time.sleep(0.05)


def test_a_write_after_pg_terminate_backend_reconnects_and_lands_once(url, opened):
    store = opened(url, lease_clock="caller")
    store.submit("job-1", DOCUMENT, {}, 1.0)
    claim = store.claim(DOCUMENT, "w1", 1.0, LEASE, 10)
    terminate(url, store)
    # the drop is found by BEGIN, before anything was sent: the completion is run again
    store.complete(claim, DOCUMENT, "w1", 2.0, output='{"x":1}')
    assert store.reconnects == 1
    job = store.job("job-1")
    assert (job["state"], job["result"]) == ("fetched", '{"x":1}')
    assert len(store.query("SELECT * FROM step_result")) == 1


def test_a_read_after_pg_terminate_backend_reconnects(url, opened):
    store = opened(url, lease_clock="caller")
    store.submit("job-1", DOCUMENT, {}, 1.0)
    terminate(url, store)
    assert store.job("job-1")["state"] == "pending" and store.reconnects == 1


def test_a_completion_whose_commit_dropped_before_the_server_had_it_is_run_again_once(
        url, opened, monkeypatch):
    """Its connection dies just before COMMIT: whether it committed is unknown to the client.
    Its transaction id says: aborted (the server rolled it back with the session), so the
    completion is run once more, on a new connection, and lands once."""
    store = opened(url, lease_clock="caller")
    store.submit("job-1", DOCUMENT, {}, 1.0)
    claim = store.claim(DOCUMENT, "w1", 1.0, LEASE, 10)
    import engine.store.postgres as backend
    hits = []

    def drop_once(point: str) -> None:
        if point == "worker.before_commit":
            hits.append(point)
            if len(hits) == 1:
                terminate(url, store)

    monkeypatch.setattr(backend, "crashpoint", drop_once)
    assert store.complete(claim, DOCUMENT, "w1", 2.0, output='{"x":1}') is None
    assert hits == ["worker.before_commit"] * 2 and store.reconnects == 1  # run twice
    job = store.job("job-1")
    assert (job["state"], job["lease_token"]) == ("fetched", claim.lease_token)
    assert len(store.query("SELECT * FROM step_result")) == 1


def test_a_heartbeat_whose_connection_dropped_is_run_again(url, opened):
    store = opened(url, lease_clock="caller")
    store.submit("job-1", DOCUMENT, {}, 1.0)
    claim = store.claim(DOCUMENT, "w1", 1.0, LEASE, 10)
    terminate(url, store)
    assert store.heartbeat("job-1", claim.lease_token, 3.0, LEASE, "w1") is True
    assert store.job("job-1")["lease_until"] == 3.0 + LEASE


def test_a_fenced_write_after_a_reconnect_is_still_fenced(url, opened):
    store, other = opened(url, lease_clock="caller"), opened(url, lease_clock="caller")
    store.submit("job-1", DOCUMENT, {}, 1.0)
    stale = store.claim(DOCUMENT, "w1", 1.0, LEASE, 10)
    other.claim(DOCUMENT, "w2", 1.0 + LEASE + 1, LEASE, 10)
    terminate(url, store)
    with pytest.raises(LeaseLost):
        store.complete(stale, DOCUMENT, "w1", 8.0, output="{}")
    assert store.job("job-1")["lease_owner"] == "w2"


# -- migrations --------------------------------------------------------------------------------

@pytest.fixture
def empty_url(pg_server):
    made = pg_server.create_database(empty=True)
    yield made
    pg_server.drop_database(made)


def tables(store) -> set[str]:
    return {r["tablename"] for r in store.query(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}


def test_an_empty_database_is_migrated_to_the_current_version(empty_url, opened):
    store = opened(empty_url)
    assert store.schema_version() == SCHEMA_VERSION
    assert tables(store) == {"job", "step_result", "outbox", "spend", "ninelives_schema"}
    assert [r["version"] for r in store.query("SELECT version FROM ninelives_schema")] == list(
        range(1, SCHEMA_VERSION + 1))
    assert store.integrity_check() == "ok"


def test_reopening_a_current_database_changes_nothing(empty_url, opened):
    store = opened(empty_url)
    store.submit("job-1", DOCUMENT, {}, 1.0)
    versions = store.query("SELECT * FROM ninelives_schema")
    again = opened(empty_url, read_only=True)  # read-only: a migration would fail
    assert again.schema_version() == SCHEMA_VERSION
    assert again.query("SELECT * FROM ninelives_schema") == versions
    assert again.job("job-1") == store.job("job-1")
    with pytest.raises(DatabaseError, match="read-only"):
        again.submit("job-2", DOCUMENT, {}, 1.0)


def test_two_processes_opening_an_empty_database_together_migrate_it_once(empty_url, opened):
    start, errors = threading.Barrier(4), []

    def open_one() -> None:
        start.wait()
        try:
            opened(empty_url)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    store = opened(empty_url)
    assert len(store.query("SELECT * FROM ninelives_schema")) == SCHEMA_VERSION


def test_a_newer_schema_is_refused_and_left_alone(empty_url, opened):
    store = opened(empty_url)
    with store.write() as conn:
        conn.execute("INSERT INTO ninelives_schema (version) VALUES (?)", (SCHEMA_VERSION + 1,))
    with pytest.raises(DatabaseError, match=f"schema version {SCHEMA_VERSION + 1}, newer"):
        open_store(empty_url)
    assert store.schema_version() == SCHEMA_VERSION + 1


def test_a_read_only_open_of_an_empty_database_is_refused(empty_url):
    with pytest.raises(DatabaseError, match="needs migrating.*read-only"):
        open_store(empty_url, read_only=True)


def with_a_next_version(monkeypatch, *statements: str) -> None:
    """Make this engine one schema version newer, its migration being `statements`."""
    import engine.store.postgres as backend
    monkeypatch.setattr(backend, "MIGRATIONS", (*backend.MIGRATIONS, statements))
    monkeypatch.setattr(backend, "SCHEMA_VERSION", SCHEMA_VERSION + 1)


def test_an_older_database_is_migrated_forward_keeping_its_rows(empty_url, opened, monkeypatch):
    opened(empty_url).submit("job-1", DOCUMENT, {"doc": 1}, 1.0)
    with_a_next_version(monkeypatch, "ALTER TABLE job ADD COLUMN priority INTEGER NOT NULL"
                                     " DEFAULT 0")
    store = opened(empty_url)
    assert store.schema_version() == SCHEMA_VERSION + 1
    job = store.job("job-1")
    assert (job["state"], job["priority"]) == ("pending", 0)


def test_a_migration_that_fails_halfway_leaves_the_version_it_started_at(empty_url, opened,
                                                                        monkeypatch):
    opened(empty_url).submit("job-1", DOCUMENT, {"doc": 1}, 1.0)
    with_a_next_version(monkeypatch, "ALTER TABLE job ADD COLUMN priority INTEGER",
                        "ALTER TABLE no_such_table ADD COLUMN x INTEGER")
    with pytest.raises(DatabaseError, match="no_such_table"):
        open_store(empty_url)
    monkeypatch.undo()
    store = opened(empty_url)  # DDL is transactional: the first ALTER was rolled back too
    assert store.schema_version() == SCHEMA_VERSION
    assert "priority" not in store.job("job-1")
