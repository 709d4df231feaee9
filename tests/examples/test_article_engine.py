"""The design article's engine as published, through its adapter: real worker and sender
processes against the fakes, and the operations its observer reads from its own rows."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import threading
import time
from pathlib import Path

import pytest

from chaos.contract import Command, ProcessContext, validate
from chaos.spec.documents import make_documents
from chaos.fakes import FakeProvider, FakeReceiver, ScriptedFaults
from chaos.reports.progress import progress_latency
from chaos.run.supervisor import Supervisor
from examples.article_engine import engine
from examples.article_engine.adapter import ARTICLE, ARTICLE_CLAIM_MOVES, PIPELINE, read_settings

#: Short enough for a test run, in the article's formula: uniform(base, min(cap, base * 2^n)).
FAST = {"lease": 3.0, "call_timeout": 1.0, "max_attempts": 3, "backoff_base": 0.05,
        "backoff_cap": 0.2}


def wait_for(condition, timeout: float, what: str):
    """Poll `condition` until it returns something truthy; fail the test at the deadline."""
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        pause.wait(0.05)


class Processes:
    """Engine processes started from an adapter's commands under the harness's own
    supervisor; `close()` ends every one of them (terminate, then kill) and reaps it."""

    def __init__(self, log_dir: Path) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self.supervisor = Supervisor(lambda role, slot, n: self._next, log_dir=str(log_dir))
        self._next: Command | None = None

    def start(self, adapter, role: str, ctx: ProcessContext, env: dict | None = None):
        command = adapter.command(role, ctx)
        self._next = Command(command.argv, {**command.env, **(env or {})})
        return self.supervisor.spawn(role, len(self.supervisor.children)).proc

    def log(self, proc: subprocess.Popen) -> str:
        child = next(c for c in self.supervisor.children if c.proc is proc)
        return Path(child.log_path).read_text(errors="replace")

    def alive(self) -> bool:
        """True while every process runs; fails the test with the log of one that died."""
        for child in self.supervisor.children:
            if child.proc.poll() is not None:
                pytest.fail(f"{child.name} exited with {child.proc.returncode}:\n"
                            f"{self.log(child.proc)}")
        return True

    def close(self) -> None:
        self.supervisor.close()


@pytest.fixture
def db(tmp_path):
    path = str(tmp_path / "article.db")
    ARTICLE.install(path)
    return path


@pytest.fixture
def fakes(tmp_path):
    """start(provider_faults=None) -> (provider, receiver); both closed at teardown."""
    started = []

    def start(provider_faults=None):
        faults = ScriptedFaults(provider=provider_faults) if provider_faults else None
        provider = FakeProvider(tmp_path / "provider.jsonl", faults).start()
        started.append(provider)
        receiver = FakeReceiver(tmp_path / "receiver.jsonl").start()
        started.append(receiver)
        return provider, receiver

    yield start
    for fake in started:
        fake.close()


@pytest.fixture
def processes(tmp_path, fakes):
    """(After fakes, so every process ends before the fakes close.)"""
    procs = Processes(tmp_path / "logs")
    try:
        yield procs
    finally:
        procs.close()


def context(db, provider, receiver, **engine_table) -> ProcessContext:
    return ProcessContext(db=db, provider_url=provider.url, receiver_url=receiver.url,
                          engine={**FAST, **engine_table}, poll_interval=0.02)


def settled(adapter, db, jobs: int):
    """The progress once every job is delivered or parked and nothing is left to send."""
    progress = adapter.progress(db)
    done = sum(n for state, n in progress["states"].items()
               if state in PIPELINE.terminal | PIPELINE.parked_states)
    return progress if done == jobs and progress["unsent"] == 0 else None


def of_type(ops, type_, **match):
    return [op for op in ops if op["type"] == type_
            and all(op.get(k) == v for k, v in match.items())]


# -- the contract, without processes ------------------------------------------------------------

def test_both_adapters_meet_the_contract():
    assert validate(ARTICLE) is ARTICLE
    assert validate(ARTICLE_CLAIM_MOVES) is ARTICLE_CLAIM_MOVES
    assert {"fencing", "spend_records", "crash_loop_cap"}.isdisjoint(
        ARTICLE.capabilities)
    assert ARTICLE.crash_loop_point in ARTICLE.crashpoints == engine.POINTS


def test_the_pipeline_is_the_articles_state_table():
    edges = {(s, t) for s, to in engine.STATES.items() for t in to}
    declared = {(s, t) for table in (PIPELINE.edges, PIPELINE.operator_edges)
                for s, to in table.items() for t in to}
    assert declared == edges
    assert PIPELINE.states == frozenset(engine.STATES)
    assert [s.name for s in PIPELINE.steps] == ["fetch", "extract", "verify", "deliver"]
    assert PIPELINE.model_steps == ("fetch", "extract", "verify")
    assert PIPELINE.step("verify").alternate == "needs_human"
    assert "fetched" not in PIPELINE.edges["pending"]  # what the published success path writes


def test_settings_read_the_engine_table_and_name_the_field_at_fault():
    s = ARTICLE.settings({**FAST, "max_claims": 5, "heartbeat_interval": 0.5})
    assert (s.lease, s.call_timeout, s.max_attempts, s.heartbeat) == (3.0, 1.0, 3, True)
    assert s.max_claims is None and s.outbox_lease is None   # the article has neither
    assert s.heartbeat_interval == 0.5
    assert s.backoff_bounds == ((0.05, 0.1), (0.05, 0.2))
    assert ARTICLE.settings({}).backoff_bounds == ((1.0, 2.0), (1.0, 4.0), (1.0, 8.0),
                                                   (1.0, 16.0))
    for table, field in (({"lease_seconds": 1.0}, "engine.lease_seconds"),
                         ({"lease": "long"}, "engine.lease"),
                         ({"max_attempts": 2.5}, "engine.max_attempts"),
                         ({"heartbeat": 1}, "engine.heartbeat"),
                         ({"lease": 0}, "engine.lease")):
        with pytest.raises(ValueError, match=field.replace(".", r"\.")):
            read_settings(table)


def test_command_maps_the_context_to_flags_and_keeps_secrets_out_of_argv(db, monkeypatch):
    monkeypatch.setenv("ARTICLE_PROVIDER_KEY", "sk-secret")
    ctx = ProcessContext(db=db, provider_url="http://p/v1", receiver_url="http://r/e",
                         engine=FAST, heartbeat=False, call_timeout=0.5, clock_skew=2.0)
    argv = ARTICLE.command("worker", ctx).argv
    assert argv[1:4] == ["-m", "examples.article_engine", "worker"]
    flags = dict(zip(argv[4::2], argv[5::2]))
    assert flags["--heartbeat"] == "off" and flags["--call-timeout"] == "0.5"
    assert flags["--clock-skew"] == "2.0" and flags["--lease"] == "3.0"
    assert "--claim-moves" not in argv and "sk-secret" not in " ".join(argv)
    assert "--claim-moves" in ARTICLE_CLAIM_MOVES.command("worker", ctx).argv
    assert ARTICLE.command("sender", ctx).argv[3] == "sender"
    with pytest.raises(ValueError, match="role"):
        ARTICLE.command("send", ctx)


def test_submit_is_idempotent_and_a_changed_payload_is_rejected(db):
    (job, payload), = make_documents(1, seed=3)
    assert ARTICLE.submit(db, job, payload) == "created"
    assert ARTICLE.submit(db, job, dict(reversed(payload.items()))) == "exists"
    assert ARTICLE.submit(db, job, {**payload, "title": "another"}) == "rejected"
    assert ARTICLE.snapshot(db)["jobs"][job]["payload_hash"].startswith(
        str(len(engine.canonical(payload))))
    submitted = of_type(ARTICLE.operations(db), "submitted")
    assert [(op["job"], op["actor"], op["state"]) for op in submitted] == [
        (job, "submitter", "pending")]


def test_controls_are_attributed_to_who_wrote(db):
    engine.configure(db=db, lease=30.0)
    for job, payload in make_documents(2, seed=4):
        ARTICLE.submit(db, job, payload)
    conn = engine.connect(db)
    try:
        claimed = engine.claim(conn)           # this process, as the article's worker
        engine.heartbeat(conn, claimed)
    finally:
        conn.close()
    assert ARTICLE.expire_leases(db) == 1
    assert ARTICLE.operator(db, "resolve", claimed).startswith("refused")
    assert ARTICLE.operator(db, "cancel", claimed) == "done"
    ops = ARTICLE.operations(db)
    claim, = of_type(ops, "claimed")
    assert (claim["job"], claim["step"], claim["from"], claim["to"]) == (
        claimed, "fetch", "pending", "pending")
    assert (claim["worker"], claim["pid"], claim["token"]) == (engine.WORKER, os.getpid(), None)
    beat, expiry, cancel = of_type(ops, "state")
    assert beat["heartbeat"] and beat["worker"] == engine.WORKER and beat["actor"] == "worker"
    assert expiry["actor"] == "harness" and not expiry["heartbeat"]
    assert (cancel["actor"], cancel["from"], cancel["to"]) == ("operator", "pending", "cancelled")
    assert ARTICLE.integrity(db) == "ok"


def with_stale_memo(db: str, seed: int):
    """A pending job whose fetch memo exists already (a stale worker's commit can leave one),
    and a connection of the engine's to it."""
    (job, payload), = make_documents(1, seed=seed)
    ARTICLE.submit(db, job, payload)
    conn = engine.connect(db)
    with conn:
        conn.execute("INSERT INTO step_result (job_id, step, output, cost, at)"
                     " VALUES (?, 'fetch', '{}', 0.001, 0)", (job,))
    return conn


def test_the_memo_hit_path_keeps_its_lease_and_the_report_shows_the_wait(db):
    """After the memo-hit assert the worker lives on but keeps the job's lease: the next claim
    waits the lease out, and progress latency counts it as a wait a live holder caused."""
    conn = with_stale_memo(db, seed=6)
    try:
        engine.configure(db=db, lease=0.3)
        with pytest.raises(AssertionError):
            engine.run_once(conn)
        engine.configure(db=db, lease=0.3, claim_moves=True)
        wait_for(lambda: engine.run_once(conn), timeout=10, what="the lease to run out")
    finally:
        engine.configure(db=db)
        conn.close()
    alive = progress_latency(ARTICLE.operations(db))["after_holder_alive"]
    assert alive["count"] == 1 and 0.25 <= alive["max"] < 5.0, alive


def test_the_memo_hit_path_asserts_an_edge_the_article_lacks(db):
    """A job in its ready state with its step's memo (a stale worker's commit can leave one)
    makes the published run_once assert pending -> fetched; the variant's claim, which moved
    the job to fetching, advances it."""
    conn = with_stale_memo(db, seed=5)
    try:
        engine.configure(db=db, lease=0.2)
        with pytest.raises(AssertionError, match="illegal transition pending -> fetched"):
            engine.run_once(conn)
        assert ARTICLE.expire_leases(db) == 1
        engine.configure(db=db, lease=0.2, claim_moves=True)
        assert engine.run_once(conn)
    finally:
        engine.configure(db=db)
        conn.close()
    writes = [(op["type"], op["from"], op["to"]) for op in ARTICLE.operations(db)
              if op["type"] in ("claimed", "state") and op["actor"] == "worker"]
    assert writes == [("claimed", "pending", "pending"), ("claimed", "pending", "fetching"),
                      ("state", "fetching", "fetched")]


def test_the_write_lock_is_held_until_released(db):
    with ARTICLE.hold_write_lock(db):
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            sqlite3.connect(db, timeout=0.1).execute("BEGIN IMMEDIATE")
    assert ARTICLE.submit(db, "after-the-lock", {"body": "x"}) == "created"


# -- real processes -----------------------------------------------------------------------------

def test_a_real_run_of_the_published_code(db, fakes, processes):
    """Documents flow to delivery through a worker and a sender; the observer attributes each
    claim to the worker's pid, and the published success path's pending -> fetched shows."""
    docs = make_documents(4, seed=11)
    flagged, slow = docs[0][0], docs[1][0]
    docs[0] = (flagged, {**docs[0][1], "title": docs[0][1]["title"] + " [[needs-review]]"})
    provider, receiver = fakes({(slow, "extract", 1): {"kind": "slow", "seconds": 0.5}})
    for job, payload in docs:
        assert ARTICLE.submit(db, job, payload) == "created"
    ctx = context(db, provider, receiver, heartbeat_interval=0.1)
    worker = processes.start(ARTICLE, "worker", ctx)
    sender = processes.start(ARTICLE, "sender", ctx)
    progress = wait_for(lambda: processes.alive() and settled(ARTICLE, db, len(docs)),
                        timeout=30, what="every job delivered or parked")
    assert progress["states"] == {"delivered": 3, "needs_human": 1}

    ops = ARTICLE.operations(db)
    delivered = [job for job, _ in docs if job != flagged]
    for job in delivered:
        claims = of_type(ops, "claimed", job=job)
        assert [c["step"] for c in claims] == ["fetch", "extract", "verify", "deliver"]
        assert {(c["worker"], c["pid"]) for c in claims} == {(c["worker"], worker.pid)
                                                           for c in claims}
        assert all(c["from"] == c["to"] for c in claims)    # the claim never moves the job
        assert [m["step"] for m in of_type(ops, "memo", job=job)] == [
            "fetch", "extract", "verify", "deliver"]
        queued = of_type(ops, "effect_queued", job=job)
        assert sorted(q["kind"] for q in queued) == ["charge", "notify"]
        sent = of_type(ops, "effect_sent", job=job)
        assert sorted(s["row"] for s in sent) == sorted(q["row"] for q in queued)
        assert all(s["actor"] == "sender" and s["worker"] is None for s in sent)
        # The article's illegal write, made by its published code:
        assert of_type(ops, "state", job=job, to="fetched")[0]["from"] == "pending"
    parked, = of_type(ops, "state", job=flagged, to="needs_human")
    assert parked["from"] == "extracted" and parked["cause"] is None
    beats = of_type(ops, "state", job=slow, heartbeat=True)
    assert beats and {b["pid"] for b in beats} == {worker.pid}

    applied = receiver.applied()
    assert len(applied) == 2 * len(delivered)
    rows = {q["row"]: q for q in of_type(ops, "effect_queued")}
    assert {(e["job"], e["kind"]) for e in applied} == {
        (rows[int(e["key"])]["job"], rows[int(e["key"])]["kind"]) for e in applied}
    host = engine.WORKER.rsplit(":", 1)[0]
    assert {e["worker"] for e in applied} == {f"{host}:{sender.pid}"}
    calls = [e for e in provider.entries() if e["job"] in delivered]
    assert {e["worker"] for e in calls} == {f"{host}:{worker.pid}"}

    snapshot = ARTICLE.snapshot(db)
    assert {m["step"] for m in snapshot["memos"] if m["job"] == delivered[0]} == {
        "fetch", "extract", "verify", "deliver"}
    assert all(row["sent"] for row in snapshot["outbox"]) and snapshot["spend"] is None
    assert snapshot["orphans"] == {"memos_without_job": 0, "outbox_without_job": 0}
    for proc in (worker, sender):                 # SIGTERM ends both cleanly
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0, processes.log(proc)


def test_retryable_errors_back_off_and_poison_parks(db, fakes, processes):
    (retried, p1), (poisoned, p2) = make_documents(2, seed=12)
    provider, receiver = fakes({(retried, "fetch", 1): {"kind": "status", "status": 503},
                                (poisoned, "extract", 1): {"kind": "status", "status": 400}})
    ARTICLE.submit(db, retried, p1)
    ARTICLE.submit(db, poisoned, p2)
    processes.start(ARTICLE, "worker", context(db, provider, receiver))
    processes.start(ARTICLE, "sender", context(db, provider, receiver))
    progress = wait_for(lambda: processes.alive() and settled(ARTICLE, db, 2), timeout=30,
                        what="both jobs delivered or parked")
    assert progress["states"] == {"delivered": 1, "failed_extract": 1}
    ops = ARTICLE.operations(db)
    retry, = [op for op in of_type(ops, "state", job=retried) if op["attempts"] == 1]
    assert retry["from"] == retry["to"] == "pending" and "HTTPRetryable" in retry["last_error"]
    low, high = ARTICLE.settings(FAST).backoff(1)
    assert low - 0.05 <= retry["next_run_at"] - retry["t"] <= high + 0.05
    park, = of_type(ops, "state", job=poisoned, to="failed_extract")
    assert (park["from"], park["cause"]) == ("fetched", "poison")
    assert provider.calls_for(poisoned, "extract") == 1


def test_the_claim_moves_variant_enters_the_working_state(db, fakes, processes):
    docs = make_documents(2, seed=13)
    provider, receiver = fakes()
    for job, payload in docs:
        ARTICLE_CLAIM_MOVES.submit(db, job, payload)
    ctx = context(db, provider, receiver)
    processes.start(ARTICLE_CLAIM_MOVES, "worker", ctx)
    processes.start(ARTICLE_CLAIM_MOVES, "sender", ctx)
    wait_for(lambda: processes.alive() and settled(ARTICLE_CLAIM_MOVES, db, 2), timeout=30,
             what="both jobs delivered")
    ops = ARTICLE_CLAIM_MOVES.operations(db)
    for job, _ in docs:
        moves = [(c["from"], c["to"]) for c in of_type(ops, "claimed", job=job)]
        assert moves == [("pending", "fetching"), ("fetched", "extracting"),
                         ("extracted", "verifying"), ("verified", "delivering")]
        writes = [(s["from"], s["to"]) for s in of_type(ops, "state", job=job)]
        assert writes == [("fetching", "fetched"), ("extracting", "extracted"),
                          ("verifying", "verified"), ("delivering", "delivered")]


def test_a_crash_looping_job_kills_its_worker_after_the_billed_call(db, fakes, processes,
                                                                    tmp_path):
    (job, payload), = make_documents(1, seed=14)
    provider, receiver = fakes()
    ARTICLE.submit(db, job, payload)
    crashes = tmp_path / "crashes.jsonl"
    worker = processes.start(ARTICLE, "worker", context(db, provider, receiver), env={
        "NINELIVES_CRASH_JOBS": job, "NINELIVES_CRASH_JOBS_AT": ARTICLE.crash_loop_point,
        "NINELIVES_CRASH_LOG": str(crashes)})
    assert worker.wait(timeout=30) == -signal.SIGKILL, processes.log(worker)
    crash, = [json.loads(line) for line in crashes.read_text().splitlines()]
    assert (crash["pid"], crash["point"], crash["job"]) == (worker.pid, "worker.after_call", job)
    assert [e["billed"] > 0 for e in provider.entries()] == [True]
    assert ARTICLE.progress(db)["states"] == {"pending": 1}     # leased, nothing written
    assert not of_type(ARTICLE.operations(db), "memo")
