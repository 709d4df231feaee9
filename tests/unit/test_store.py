"""The store contract, on every backend (a SQLite file, a PostgreSQL database): idempotent
submit, claims (resume, crash-loop cap), fencing of every write a worker makes after its
lease was taken, the completion transaction, the outbox's own leases, and the schema
version. Tests of what only SQLite has (query plans, its write lock) are marked so."""
from __future__ import annotations

import json
import sqlite3

import pytest

from engine.states import Step, build_pipeline
from engine.store import Effect, LeaseLost, Spend, SubmissionConflict, open_store
from engine.store.schema import SCHEMA_VERSION

from store_backends import BACKENDS

STORE_BACKENDS = BACKENDS
NOW = 1_000_000.0
LEASE = 5.0
LATER = NOW + LEASE + 1  # the first lease has expired


# -- helpers ---------------------------------------------------------------------------------

def claim(store, pipeline, now=NOW, worker="w1", max_claims=10):
    return store.claim(pipeline, worker, now, LEASE, max_claims)


def complete(store, pipeline, c, now=NOW, worker="w1", **kwargs):
    kwargs.setdefault("output", json.dumps({"step": c.step.name, "by": worker}))
    return store.complete(c, pipeline, worker, now, **kwargs)


def walk_to(store, pipeline, step, job_id="job-1", now=NOW):
    """Submit job_id and work it under one lease until it is in `step`'s working state."""
    store.submit(job_id, pipeline, {"doc": job_id}, now)
    c = claim(store, pipeline, now)
    while c.step.name != step:
        c = complete(store, pipeline, c, now, continue_lease=LEASE)
    return c


def deliver(store, pipeline, kinds=("charge",), job_id="job-1"):
    """A delivered job whose effects wait in the outbox."""
    c = walk_to(store, pipeline, "deliver", job_id)
    effects = tuple(Effect(kind, {"job": job_id, "kind": kind}) for kind in kinds)
    complete(store, pipeline, c, effects=effects)


def spend(c, worker="w1", outcome="ok", cost=0.01):
    return Spend(c.job_id, c.step.name, worker, c.lease_token, NOW, NOW, outcome, cost)


def rows(store, table, order="1"):
    return store.query(f"SELECT * FROM {table} ORDER BY {order}")


#: A trigger recording every committed state change in the same transaction, per backend.
TRANSITION_TRIGGER = {
    "sqlite": """
        CREATE TEMP TABLE transition (seq INTEGER PRIMARY KEY, job_id TEXT, frm TEXT, dest TEXT);
        CREATE TEMP TRIGGER record_transition AFTER UPDATE OF state ON main.job
        WHEN old.state != new.state
        BEGIN INSERT INTO transition (job_id, frm, dest) VALUES (new.id, old.state, new.state);
        END;
    """,
    "postgres": """
        CREATE TABLE transition (seq BIGSERIAL PRIMARY KEY, job_id TEXT, frm TEXT, dest TEXT);
        CREATE FUNCTION record_transition() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          IF old.state <> new.state THEN
            INSERT INTO transition (job_id, frm, dest) VALUES (new.id, old.state, new.state);
          END IF;
          RETURN new;
        END $$;
        CREATE TRIGGER record_transition AFTER UPDATE OF state ON job
        FOR EACH ROW EXECUTE FUNCTION record_transition();
    """,
}


@pytest.fixture
def transitions(store, backend):
    """Every committed state change, recorded by a trigger in the same transaction."""
    if backend == "sqlite":
        store.conn.executescript(TRANSITION_TRIGGER[backend])
    else:
        with store.write() as conn:
            conn.execute(TRANSITION_TRIGGER[backend])
    return lambda: [(r["frm"], r["dest"])
                    for r in store.query("SELECT * FROM transition ORDER BY seq")]


# -- submit ----------------------------------------------------------------------------------

def test_submit_creates_a_pending_job(store, pipeline):
    assert store.submit("job-1", pipeline, {"doc": 1}, NOW) is True
    job = store.job("job-1")
    assert (job["state"], job["payload"], job["next_run_at"], job["lease_token"]) == (
        "pending", '{"doc":1}', NOW, 0)


def test_submit_again_with_the_same_payload_changes_nothing(store, pipeline):
    store.submit("job-1", pipeline, {"a": 1, "b": {"x": 1, "y": 2}}, NOW)
    before = store.job("job-1")
    assert store.submit("job-1", pipeline, {"b": {"y": 2, "x": 1}, "a": 1}, NOW + 50) is False
    assert store.job("job-1") == before
    assert len(rows(store, "job")) == 1


@pytest.mark.parametrize("other", [{"a": 2}, {"a": 1, "b": None}, [1], "a"])
def test_submit_with_another_payload_is_refused_and_the_original_kept(store, pipeline, other):
    store.submit("job-1", pipeline, {"a": 1}, NOW)
    before = store.job("job-1")
    with pytest.raises(SubmissionConflict, match="'job-1'.*different payload"):
        store.submit("job-1", pipeline, other, NOW + 1)
    assert store.job("job-1") == before


def test_submit_under_another_pipeline_is_refused(store, pipeline):
    other = build_pipeline("other", [Step("only", "todo", "doing", "done", "stuck")])
    store.submit("job-1", pipeline, {"a": 1}, NOW)
    with pytest.raises(SubmissionConflict, match="different pipeline"):
        store.submit("job-1", other, {"a": 1}, NOW)
    assert store.job("job-1")["pipeline"] == "document"


# -- claim -----------------------------------------------------------------------------------

def test_claim_moves_pending_to_fetching_in_one_transaction(store, pipeline, commits,
                                                             transitions):
    store.submit("job-1", pipeline, {"doc": 1}, NOW)
    del commits[:]
    c = claim(store, pipeline)
    assert len(commits) == 1
    assert transitions() == [("pending", "fetching")]
    job = store.job("job-1")
    assert (job["state"], job["lease_token"], job["claims"], job["lease_owner"]) == (
        "fetching", 1, 1, "w1")
    assert job["lease_until"] == job["next_run_at"] == NOW + LEASE
    assert (c.job_id, c.step.name, c.lease_token, c.payload) == ("job-1", "fetch", 1, '{"doc":1}')


def test_a_live_lease_is_not_claimable(store, pipeline):
    store.submit("job-1", pipeline, {}, NOW)
    claim(store, pipeline)
    before = store.job("job-1")
    assert claim(store, pipeline, NOW + LEASE - 0.01, worker="w2") is None
    assert store.job("job-1") == before


def test_an_expired_working_job_is_resumed_where_it_stands(store, pipeline, transitions):
    first = walk_to(store, pipeline, "extract")
    moves = len(transitions())
    again = claim(store, pipeline, LATER, worker="w2")
    assert (again.step.name, again.lease_token, again.claims) == ("extract", first.lease_token + 1, 2)
    assert "fetch" in again.memos
    job = store.job("job-1")
    assert (job["state"], job["lease_owner"], job["lease_until"]) == ("extracting", "w2",
                                                                      LATER + LEASE)
    assert len(transitions()) == moves  # resumed in place, not moved back


def test_claims_take_the_job_due_soonest(store, pipeline):
    store.submit("late", pipeline, {}, NOW)
    store.submit("early", pipeline, {}, NOW - 10)
    store.submit("future", pipeline, {}, NOW + 100)
    assert [claim(store, pipeline).job_id for _ in range(2)] == ["early", "late"]
    assert claim(store, pipeline) is None  # not due yet
    assert store.job("future")["state"] == "pending"


@pytest.mark.sqlite_only
def test_claim_is_an_index_seek_among_thousands_of_finished_jobs(store, pipeline):
    with store.write() as conn:
        conn.executemany(
            "INSERT INTO job (id, pipeline, state, payload, next_run_at, created, updated)"
            " VALUES (?, 'document', ?, '{}', NULL, ?, ?)",
            [(f"done-{i}", "delivered" if i % 10 else "failed_fetch", NOW - i, NOW - i)
             for i in range(5000)])
    store.submit("job-1", pipeline, {}, NOW)
    statements = []
    store.conn.set_trace_callback(statements.append)
    try:
        assert claim(store, pipeline).job_id == "job-1"
    finally:
        store.conn.set_trace_callback(None)
    plans = {sql: [row[3] for row in store.conn.execute("EXPLAIN QUERY PLAN " + sql)]
             for sql in statements if sql.lstrip().upper().startswith("SELECT")}
    assert any("job_claim" in " ".join(plan) for plan in plans.values()), plans
    for sql, plan in plans.items():
        assert not [line for line in plan if line.startswith("SCAN") or "TEMP B-TREE" in line], (
            sql, plan)


@pytest.mark.parametrize("step,parked", [("fetch", "failed_fetch"), ("extract", "failed_extract")])
def test_a_crash_loop_parks_the_job_after_max_claims(store, pipeline, transitions, step, parked):
    walk_to(store, pipeline, step)                     # claim 1 of this step
    now = NOW
    for n in (2, 3):                                   # each worker dies holding the lease
        now += LEASE + 1
        assert claim(store, pipeline, now, max_claims=3).claims == n
    assert claim(store, pipeline, now + LEASE + 1, max_claims=3) is None
    job = store.job("job-1")
    assert job["state"] == parked
    assert "crash loop" in job["last_error"] and repr(step) in job["last_error"]
    assert (job["next_run_at"], job["lease_until"], job["lease_owner"]) == (None, 0, None)
    assert job["lease_token"] == 4  # the last claim's holder is fenced out too
    assert transitions()[-1] == (pipeline.step_named(step).working, parked)


# -- fencing ---------------------------------------------------------------------------------

@pytest.fixture
def taken_over(store, pipeline):
    """(stale, fresh): w1's lease on the deliver step expired and w2 re-claimed the job."""
    stale = walk_to(store, pipeline, "deliver")
    fresh = claim(store, pipeline, LATER, worker="w2")
    assert fresh.lease_token == stale.lease_token + 1
    return stale, fresh


def test_stale_complete_is_fenced_but_its_memo_is_kept(store, pipeline, taken_over):
    stale, fresh = taken_over
    before = store.job("job-1")
    with pytest.raises(LeaseLost, match="job-1"):
        complete(store, pipeline, stale, LATER, output='{"by":"w1"}',
                 effects=(Effect("charge", {"n": 1}),), spend=spend(stale))
    assert store.job("job-1") == before
    assert rows(store, "outbox") == []
    assert store.memo("job-1", "deliver") == '{"by":"w1"}'   # the work is valid
    assert [s["worker"] for s in rows(store, "spend")] == ["w1"]
    # The new owner finishes; the first writer's memo wins and becomes the result.
    complete(store, pipeline, fresh, LATER, worker="w2", output='{"by":"w2"}',
             effects=(Effect("charge", {"n": 1}),))
    job = store.job("job-1")
    assert (job["state"], job["result"]) == ("delivered", '{"by":"w1"}')
    assert store.memo("job-1", "deliver") == '{"by":"w1"}'
    assert len(rows(store, "outbox")) == 1


@pytest.mark.parametrize("retry_at", [LATER + 10, None], ids=["retry", "park"])
def test_stale_fail_is_fenced_and_changes_nothing(store, pipeline, taken_over, retry_at):
    stale, _ = taken_over
    before = store.job("job-1")
    with pytest.raises(LeaseLost):
        store.fail(stale, pipeline, "w1", LATER, error="boom", retry_at=retry_at,
                   spend=spend(stale, outcome="retryable"))
    assert store.job("job-1") == before
    assert [s["outcome"] for s in rows(store, "spend")] == ["retryable"]  # billed all the same


def test_stale_heartbeat_returns_false_and_the_new_one_extends(store, taken_over):
    stale, fresh = taken_over
    before = store.job("job-1")
    assert store.heartbeat("job-1", stale.lease_token, LATER + 1, LEASE) is False
    assert store.job("job-1") == before
    assert store.heartbeat("job-1", fresh.lease_token, LATER + 1, LEASE) is True
    job = store.job("job-1")
    assert job["lease_until"] == job["next_run_at"] == LATER + 1 + LEASE


def test_heartbeat_after_the_step_finished_returns_false(store, pipeline):
    c = walk_to(store, pipeline, "deliver")
    complete(store, pipeline, c)
    assert store.heartbeat("job-1", c.lease_token, NOW, LEASE) is False
    assert store.job("job-1")["lease_until"] == 0


# -- completing a step -----------------------------------------------------------------------

def test_continue_lease_records_both_transitions_in_one_transaction(store, pipeline, commits,
                                                                    transitions):
    store.submit("job-1", pipeline, {"doc": 1}, NOW)
    c = claim(store, pipeline)
    del commits[:]
    nxt = complete(store, pipeline, c, NOW + 1, output='{"text":"t"}', cost=0.25,
                   continue_lease=LEASE)
    assert len(commits) == 1
    assert transitions()[-2:] == [("fetching", "fetched"), ("fetched", "extracting")]
    job = store.job("job-1")
    assert (job["state"], job["lease_token"], job["claims"], job["lease_until"]) == (
        "extracting", c.lease_token, 1, NOW + 1 + LEASE)
    assert (nxt.step.name, nxt.lease_token, nxt.memos["fetch"]) == ("extract", c.lease_token,
                                                                    '{"text":"t"}')
    memo = rows(store, "step_result")[0]
    assert (memo["step"], memo["cost"], memo["worker"]) == ("fetch", 0.25, "w1")


def test_complete_without_continue_releases_the_job_in_the_next_ready_state(store, pipeline):
    store.submit("job-1", pipeline, {}, NOW)
    assert complete(store, pipeline, claim(store, pipeline), NOW + 1) is None
    job = store.job("job-1")
    assert (job["state"], job["lease_until"], job["lease_owner"], job["next_run_at"]) == (
        "fetched", 0, None, NOW + 1)
    assert claim(store, pipeline, NOW + 1).step.name == "extract"


def test_completing_the_last_step_puts_its_effects_in_the_outbox(store, pipeline):
    c = walk_to(store, pipeline, "deliver")
    effects = (Effect("charge", {"cents": 5}), Effect("notify", {"to": "x"}))
    assert complete(store, pipeline, c, effects=effects, continue_lease=LEASE) is None
    job = store.job("job-1")
    assert (job["state"], job["next_run_at"], job["lease_until"]) == ("delivered", None, 0)
    assert [(r["kind"], r["idempotency_key"], r["payload"]) for r in rows(store, "outbox")] == [
        ("charge", "job-1:charge", '{"cents":5}'), ("notify", "job-1:notify", '{"to":"x"}')]
    assert claim(store, pipeline) is None


def test_a_park_reason_parks_the_job_with_its_memo(store, pipeline):
    c = walk_to(store, pipeline, "verify")
    complete(store, pipeline, c, output='{"ok":false}', park_reason="flagged",
             continue_lease=LEASE)
    job = store.job("job-1")
    assert (job["state"], job["last_error"], job["next_run_at"]) == ("needs_human", "flagged", None)
    assert store.memo("job-1", "verify") == '{"ok":false}'


# -- outbox ----------------------------------------------------------------------------------

def claim_row(store, now=NOW, sender="s1", max_attempts=8):
    return store.claim_outbox(sender, now, LEASE, max_attempts)


def test_a_leased_outbox_row_is_not_claimable_until_its_lease_expires(store, pipeline):
    deliver(store, pipeline)
    row = claim_row(store)
    assert (row.idempotency_key, row.attempts, row.lease_token) == ("job-1:charge", 1, 1)
    assert claim_row(store, NOW + LEASE - 0.01, sender="s2") is None
    again = claim_row(store, LATER, sender="s2")
    assert (again.id, again.attempts, again.lease_token) == (row.id, 2, 2)


def test_mark_sent_is_fenced_by_the_row_lease(store, pipeline):
    deliver(store, pipeline)
    stale = claim_row(store)
    fresh = claim_row(store, LATER, sender="s2")
    assert store.mark_sent(stale, "s1", LATER) is False
    assert rows(store, "outbox")[0]["sent_at"] is None
    assert store.mark_sent(fresh, "s2", LATER) is True
    assert store.mark_sent(fresh, "s2", LATER + 1) is False  # sent once
    assert rows(store, "outbox")[0]["sent_at"] == LATER
    assert store.unsent_rows() == 0 and claim_row(store, LATER + 100) is None


def test_outbox_failure_schedules_a_retry(store, pipeline):
    deliver(store, pipeline)
    row = claim_row(store)
    assert store.outbox_failed(row, "s1", NOW, error="503", retry_at=NOW + 20) is True
    assert claim_row(store, NOW + 19) is None
    assert claim_row(store, NOW + 20).attempts == 2


def test_outbox_failure_without_retry_dead_letters(store, pipeline):
    deliver(store, pipeline)
    row = claim_row(store)
    assert store.outbox_failed(row, "s1", NOW, error="400 bad", retry_at=None) is True
    out = rows(store, "outbox")[0]
    assert (out["dead_at"], out["sent_at"], out["last_error"]) == (NOW, None, "400 bad")
    assert store.unsent_rows() == 0 and claim_row(store, NOW + 1000) is None


def test_stale_outbox_failure_is_fenced(store, pipeline):
    deliver(store, pipeline)
    stale = claim_row(store)
    claim_row(store, LATER, sender="s2")
    before = rows(store, "outbox")
    assert store.outbox_failed(stale, "s1", LATER, error="x", retry_at=None) is False
    assert rows(store, "outbox") == before


def test_rows_past_the_attempt_cap_are_dead_lettered_by_the_claim(store, pipeline):
    deliver(store, pipeline, kinds=("charge", "notify"))
    now = NOW
    for _ in range(2):
        for _kind in range(2):
            store.outbox_failed(claim_row(store, now, max_attempts=2), "s1", now, error="503",
                                retry_at=now)
    assert claim_row(store, now, max_attempts=2) is None
    for out in rows(store, "outbox"):
        assert out["dead_at"] == now and out["attempts"] == 2
        assert "dead-lettered after 2 attempts" in out["last_error"]
    assert store.unsent_rows() == 0


# -- schema ----------------------------------------------------------------------------------

@pytest.mark.sqlite_only
def test_a_new_database_is_at_the_current_schema_version(store):
    assert store.schema_version() == SCHEMA_VERSION
    tables = {r["name"] for r in store.query("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"job", "step_result", "outbox", "spend"} <= tables


@pytest.mark.sqlite_only
def test_reopening_a_current_database_writes_nothing(store, pipeline, db_path):
    store.submit("job-1", pipeline, {"doc": 1}, NOW)
    schema = store.query("SELECT type, name, sql FROM sqlite_master ORDER BY name")
    job = store.job("job-1")
    # Another connection holds the write lock: a reopen that tried to migrate would fail.
    lock = sqlite3.connect(db_path, isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")
    try:
        again = open_store(db_path, busy_timeout=0.05)
        try:
            assert again.schema_version() == SCHEMA_VERSION
            assert again.query("SELECT type, name, sql FROM sqlite_master ORDER BY name") == schema
            assert again.job("job-1") == job
        finally:
            again.close()
    finally:
        lock.execute("ROLLBACK")
        lock.close()


class LockedFor:
    """A wait clock on which another connection holds the write lock for `seconds`."""

    def __init__(self, path: str, seconds: float) -> None:
        self.t, self.seconds = 0.0, seconds
        self.holder = sqlite3.connect(path, isolation_level=None)
        self.holder.execute("BEGIN IMMEDIATE")

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds
        if self.t >= self.seconds and self.holder.in_transaction:
            self.holder.execute("ROLLBACK")


@pytest.mark.sqlite_only
@pytest.mark.parametrize("write", ["claim", "continue", "heartbeat"])
def test_a_lease_written_after_a_wait_for_the_lock_runs_from_the_write(store, pipeline, write):
    # The worker read its clock (NOW), then waited 3 s for the lock: the lease it writes
    # runs from the write, not from the stale read, or it would be over 3 s early.
    store.submit("job-1", pipeline, {"doc": 1}, NOW)
    c = None if write == "claim" else claim(store, pipeline)
    store.wait_clock = LockedFor(store.path, 3.0)
    if write == "claim":
        until = claim(store, pipeline).lease_until
    elif write == "continue":
        until = complete(store, pipeline, c, continue_lease=LEASE).lease_until
    else:
        assert store.heartbeat("job-1", c.lease_token, NOW, LEASE, "w1")
        until = store.job("job-1")["lease_until"]
    assert store.waited >= 3.0
    assert until == pytest.approx(NOW + store.waited + LEASE)
    assert store.job("job-1")["lease_until"] == pytest.approx(until)


def test_a_heartbeat_that_read_its_clock_before_a_delay_never_moves_the_lease_back(store,
                                                                                   pipeline):
    store.submit("job-1", pipeline, {"doc": 1}, NOW)
    c = claim(store, pipeline)  # lease to NOW + LEASE
    assert store.heartbeat("job-1", c.lease_token, NOW + 3, LEASE, "w1")
    # a beat that read NOW, was held up, and writes after the one above
    assert store.heartbeat("job-1", c.lease_token, NOW, LEASE, "w1")
    assert store.job("job-1")["lease_until"] == NOW + 3 + LEASE


# -- a lease runs from its write, however long the lock kept the writer out -----------------

def held_for(db_path, seconds):
    """Another process's transaction holding the write lock for `seconds` (a thread here)."""
    import threading
    import time
    holder = sqlite3.connect(db_path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    release = threading.Timer(seconds, lambda: (holder.execute("ROLLBACK"), holder.close()))
    release.start()
    return release, time


@pytest.mark.sqlite_only
@pytest.mark.parametrize("what", ["job", "outbox row"])
def test_a_claim_that_waited_for_the_lock_in_sqlites_own_busy_handler_runs_from_its_write(
        db_path, pipeline, what):
    """The wait happens inside SQLite (busy_timeout longer than the hold), on the first try:
    the lease still runs from the commit, not from the clock read before the wait."""
    store = open_store(db_path, synchronous="NORMAL", busy_timeout=5.0)
    if what == "job":
        store.submit("job-1", pipeline, {"doc": "job-1"}, NOW)
    else:
        deliver(store, pipeline)
    release, time = held_for(db_path, 0.3)
    started = time.monotonic()
    got = (claim(store, pipeline) if what == "job" else
           store.claim_outbox("s1", LATER, LEASE, 5))
    waited = time.monotonic() - started
    release.join()
    asked = NOW if what == "job" else LATER
    assert waited >= 0.25
    assert got.lease_until >= asked + LEASE + 0.25
    store.close()
