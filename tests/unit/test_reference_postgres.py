"""The reference adapter on PostgreSQL: the PL/pgSQL audit gives the same operations as the
SQLite triggers for the same store calls, commits with the change (or not at all), and the
controls (progress, snapshot, expire_leases, hold_write_lock, integrity) work on a server."""
from __future__ import annotations

import threading
import time

import psycopg
import pytest

from chaos.reference import REFERENCE, audit, pg_audit
from engine import DOCUMENT
from engine.store import Effect, Spend, StoreBusy, open_store

W1, W2 = "worker:host:101:aaaa", "worker:host:102:bbbb"
SENDER = "sender:host:103:cccc"
T = 1_000.0


@pytest.fixture
def pg_db(pg_server):
    url = pg_server.create_database()
    yield url
    pg_server.drop_database(url)


def drive(target: str) -> None:
    """The same store calls on either backend, on the caller's clock: two jobs, a failed
    attempt and its retry, a step completed with a memo and its spend, a job kept into the
    next step, a heartbeat, an effect queued and sent, an operator's cancel."""
    options = {"lease_clock": "caller"} if target.startswith("postgresql://") else {}
    store = open_store(target, **options)
    try:
        store.submit("a", DOCUMENT, {"doc": 1}, T)
        store.submit("b", DOCUMENT, {"doc": 2}, T + 0.1)
        claim = store.claim(DOCUMENT, W1, T + 1, 5.0, 8)
        store.fail(claim, DOCUMENT, W1, T + 1.5, error="503 upstream", retry_at=T + 2,
                   spend=Spend("a", "fetch", W1, claim.lease_token, T + 1.1, T + 1.4,
                               "error", 0.001, "503"))
        claim = store.claim(DOCUMENT, W2, T + 3, 5.0, 8)  # b, due before a's retry
        assert store.heartbeat(claim.job_id, claim.lease_token, T + 3.5, 5.0, W2)
        store.complete(claim, DOCUMENT, W2, T + 4, output='{"text": "b"}', cost=0.002,
                       spend=Spend(claim.job_id, "fetch", W2, claim.lease_token, T + 3.1,
                                   T + 3.9, "ok", 0.002),
                       effects=(Effect("notify", {"to": "x"}),))
        row = store.claim_outbox(SENDER, T + 5, 5.0, 5)
        assert store.mark_sent(row, SENDER, T + 5.5)
        store.cancel("a", "operator:test", T + 6)
    finally:
        store.close()


def operations_without_times(target: str) -> list[dict]:
    """The operations less their audit times; leases and due times to the millisecond
    (SQLite ages the caller's clock by the microseconds its lock wait took)."""
    neutral = [{k: round(v, 3) if isinstance(v, float) else v for k, v in e.items()
                if k not in ("t", "seq")} for e in REFERENCE.operations(target)]
    assert neutral, "no operation read"
    return neutral


def test_the_postgres_audit_reads_as_the_same_operations_as_sqlites(pg_db, tmp_path):
    lite = str(tmp_path / "engine.db")
    for target in (lite, pg_db):
        REFERENCE.install(target)
        drive(target)
    assert operations_without_times(pg_db) == operations_without_times(lite)


def test_both_dialects_record_the_same_fields():
    lite, pg = audit.triggers(audit.SQLITE), audit.triggers(audit.POSTGRES)
    assert lite.keys() == pg.keys() == audit.TRIGGERS.keys()
    for key in lite:
        assert pg[key].startswith("json_build_object(") and lite[key].startswith("json_object(")
        assert pg[key].replace("json_build_object(", "").replace("right(NEW.payload, 40)", "") \
            .replace("right(OLD.payload, 40)", "") == lite[key].replace("json_object(", "") \
            .replace("substr(NEW.payload, -40)", "").replace("substr(OLD.payload, -40)", "")


def test_an_audit_row_commits_with_its_change_or_not_at_all(pg_db):
    REFERENCE.install(pg_db)
    with psycopg.connect(pg_db) as conn:  # a transaction, rolled back
        conn.execute("INSERT INTO job (id, pipeline, state, payload, created, updated)"
                     " VALUES ('gone', 'document', 'pending', '{}', 0, 0)")
        assert conn.execute("SELECT COUNT(*) FROM audit").fetchone()[0] == 1  # same txn
        conn.rollback()
    assert REFERENCE.operations(pg_db) == []
    drive(pg_db)
    with pg_audit.connect(pg_db) as conn:
        jobs = conn.execute("SELECT COUNT(*) FROM job").fetchone()[0]
    assert jobs == 2 and sum(e["type"] == "submitted" for e in REFERENCE.operations(pg_db)) == 2


def test_the_audit_is_dated_by_the_servers_clock(pg_db):
    REFERENCE.install(pg_db)
    drive(pg_db)  # the caller's clock said 1970: the audit does not believe it
    with pg_audit.connect(pg_db) as conn:
        now = pg_audit.server_now(conn)
    assert all(now - 60 < e["t"] <= now for e in REFERENCE.operations(pg_db))


def test_progress_snapshot_and_integrity_on_postgres(pg_db):
    REFERENCE.install(pg_db)
    drive(pg_db)
    assert REFERENCE.progress(pg_db) == {"states": {"cancelled": 1, "fetched": 1}, "unsent": 0}
    snap = REFERENCE.snapshot(pg_db)
    assert snap["jobs"]["a"]["state"] == "cancelled" and len(snap["spend"]) == 2
    assert snap["orphans"] == {"memos_without_job": 0, "outbox_without_job": 0,
                               "spend_without_job": 0}
    assert REFERENCE.integrity(pg_db) == "ok"
    with pg_audit.connect(pg_db) as conn:
        conn.execute("DROP TRIGGER audit_outbox_update ON outbox")
    assert REFERENCE.integrity(pg_db) == "audit triggers missing: audit_outbox_update"


def test_expire_leases_ends_the_live_leases_on_the_servers_clock(pg_db):
    REFERENCE.install(pg_db)
    store = open_store(pg_db)  # leases on the server's clock, as in a run
    try:
        store.submit("a", DOCUMENT, {"doc": 1}, 0.0)
        claim = store.claim(DOCUMENT, W1, 0.0, 600.0, 8)
        assert claim is not None
        assert REFERENCE.expire_leases(pg_db) == 1
        assert store.claim(DOCUMENT, W2, 0.0, 600.0, 8).job_id == "a"  # due again at once
        assert not store.heartbeat("a", claim.lease_token, 0.0, 600.0, W1)
    finally:
        store.close()


def test_the_held_write_lock_stops_writes_and_lets_reads_through(pg_db):
    REFERENCE.install(pg_db)
    drive(pg_db)
    store = open_store(pg_db, busy_timeout=0.3)
    try:
        with REFERENCE.hold_write_lock(pg_db):
            assert REFERENCE.progress(pg_db)["states"]  # reads go through
            with pytest.raises(StoreBusy):
                store.submit("c", DOCUMENT, {"doc": 3}, T)
            with pytest.raises(StoreBusy):
                store.claim(DOCUMENT, W1, T + 10, 5.0, 8)
        assert store.submit("c", DOCUMENT, {"doc": 3}, T)  # released
    finally:
        store.close()


def test_a_write_waiting_on_the_held_lock_goes_through_once_it_is_released(pg_db):
    REFERENCE.install(pg_db)
    done = threading.Event()

    def submit() -> None:
        store = open_store(pg_db, busy_timeout=10.0)
        try:
            store.submit("late", DOCUMENT, {"doc": 9}, T)
        finally:
            store.close()
        done.set()

    with REFERENCE.hold_write_lock(pg_db):
        writer = threading.Thread(target=submit)
        writer.start()
        assert not done.wait(0.5)  # held back by the lock
    writer.join(timeout=10)
    assert done.is_set() and REFERENCE.progress(pg_db)["states"] == {"pending": 1}


def test_store_settings_name_the_backends_clock():
    assert REFERENCE.store_settings("postgresql://u@127.0.0.1:1/db") == {
        "lease_clock": "store", "claim_order": "due-unless-locked"}
    assert REFERENCE.store_settings("/tmp/x/engine.db") == {}


def test_the_write_lock_is_taken_whole_or_not_at_all_and_never_held_while_it_waits(pg_db):
    # A transaction holds a later table (spend) and then writes an earlier one (job): a
    # LOCK TABLE that waited held job meanwhile, deadlocked with it, and kept the store
    # locked for the server's deadlock_timeout before the fault's window was recorded.
    REFERENCE.install(pg_db)
    held = threading.Event()

    def hold() -> None:
        with REFERENCE.hold_write_lock(pg_db):
            held.set()

    with pg_audit.connect(pg_db, autocommit=False) as writer:
        writer.execute("SET lock_timeout = 2000")
        writer.execute("INSERT INTO spend (job_id, step, worker, lease_token, started, ended,"
                       " outcome, cost) VALUES ('j', 'fetch', 'w', 1, 0, 0, 'ok', 0)")
        nemesis = threading.Thread(target=hold)
        nemesis.start()
        with pg_audit.connect(pg_db) as watch:  # the harness has tried for the lock
            deadline = time.monotonic() + 10
            while not watch.execute("SELECT 1 FROM pg_stat_activity WHERE query LIKE"
                                    " 'LOCK TABLE%'").fetchall():
                assert time.monotonic() < deadline, "the harness never asked for the lock"
        writer.execute("UPDATE job SET state = state WHERE id = 'j'")  # not held back
        assert not held.is_set()
        writer.commit()
    nemesis.join(timeout=10)
    assert held.is_set()  # taken once the writer was done
