"""Operator actions and queries: cancel, requeue and resolve move only jobs they apply to, bump
the lease token so a stale worker is fenced, and change nothing when refused; the four
queries and the alerts return the expected rows on a small hand-built database."""
from __future__ import annotations

import json
import os
import random
import sqlite3
import tracemalloc
from collections import Counter

import pytest

from engine import Worker, cli, operate
from engine.retry import PoisonError, RetryableError
from engine.steps import CallResult, DocumentSteps, InstantSteps
from engine.store import LeaseLost, OperatorError, Spend

from store_backends import BACKENDS

STORE_BACKENDS = BACKENDS
NOW = 1_000_000.0
LEASE = 5.0


class CountingSteps(InstantSteps):
    """InstantSteps that count their calls; `verdict` replaces verify's answer."""

    def __init__(self, verdict: dict | None = None) -> None:
        self.verdict = verdict
        self.calls: Counter[str] = Counter()

    def call(self, step, data, ctx):
        self.calls[step] += 1
        if step == "verify" and self.verdict is not None:
            return CallResult(self.verdict, 0.002)
        return super().call(step, data, ctx)


@pytest.fixture
def run(store, config, clock):
    """Work every due job with `runner` until none is due; returns the runner."""
    def work(runner=None):
        runner = runner or CountingSteps()
        worker = Worker(store, config, runner=runner, clock=clock, rng=random.Random(1))
        while worker.run_once():
            pass
        return runner
    return work


def claim(store, pipeline, now=NOW, max_claims=10):
    return store.claim(pipeline, "w1", now, LEASE, max_claims)


def job_in(store, pipeline, run, state: str) -> None:
    """Bring job-1 into `state` through the engine's own writes."""
    store.submit("job-1", pipeline, {"title": "t", "body": "b"}, NOW)
    if state == "fetching":
        claim(store, pipeline)
    elif state == "failed_fetch":
        store.fail(claim(store, pipeline), pipeline, "w1", NOW, error="400", retry_at=None)
    elif state == "needs_human":
        run(CountingSteps(verdict={"ok": False, "reason": "looks odd"}))
    elif state == "delivered":
        run()
    elif state == "cancelled":
        store.cancel("job-1", "op", NOW)
    assert store.job("job-1")["state"] == state


# -- cancel ----------------------------------------------------------------------------------

@pytest.mark.parametrize("state", ["pending", "failed_fetch", "needs_human"])
def test_cancel_from_a_ready_or_parked_state_bumps_the_token(store, pipeline, run, state):
    job_in(store, pipeline, run, state)
    token = store.job("job-1")["lease_token"]
    assert store.cancel("job-1", "op", NOW + 1) == state
    job = store.job("job-1")
    assert (job["state"], job["lease_token"], job["next_run_at"], job["updated_by"]) == (
        "cancelled", token + 1, None, "op")
    assert claim(store, pipeline, NOW + 3600) is None


def test_a_claim_taken_before_a_cancel_is_fenced_after_it(store, pipeline):
    store.submit("job-1", pipeline, {}, NOW)
    stale = claim(store, pipeline)
    store.fail(stale, pipeline, "w1", NOW, error="503", retry_at=NOW + 1)  # back to pending
    store.cancel("job-1", "op", NOW)
    before = store.job("job-1")
    assert store.heartbeat("job-1", stale.lease_token, NOW, LEASE) is False
    with pytest.raises(LeaseLost):
        store.complete(stale, pipeline, "w1", NOW, output="{}")
    with pytest.raises(LeaseLost):
        store.fail(stale, pipeline, "w1", NOW, error="x", retry_at=None)
    assert store.job("job-1") == before


@pytest.mark.parametrize("state", ["fetching", "delivered", "cancelled"])
def test_cancel_is_refused_for_working_and_terminal_jobs(store, pipeline, run, state):
    job_in(store, pipeline, run, state)
    before = store.job("job-1")
    with pytest.raises(OperatorError, match=f"'{state}'"):
        store.cancel("job-1", "op", NOW + 1)
    assert store.job("job-1") == before


def test_a_refused_cancel_leaves_the_lease_holder_working(store, pipeline):
    store.submit("job-1", pipeline, {}, NOW)
    live = claim(store, pipeline)
    with pytest.raises(OperatorError):
        store.cancel("job-1", "op", NOW)
    store.complete(live, pipeline, "w1", NOW, output="{}")
    assert store.job("job-1")["state"] == "fetched"


def test_actions_on_an_unknown_job_are_refused(store):
    for action in (store.cancel, store.requeue, store.resolve):
        with pytest.raises(OperatorError, match="no job 'ghost'"):
            action("ghost", "op", NOW)


# -- requeue ---------------------------------------------------------------------------------

def test_requeue_sends_a_parked_job_back_with_fresh_counters(store, pipeline, run):
    store.submit("job-1", pipeline, {"title": "t", "body": "b"}, NOW)
    store.fail(claim(store, pipeline), pipeline, "w1", NOW, error="503", retry_at=NOW)
    claim(store, pipeline, max_claims=1)                      # this worker dies
    assert claim(store, pipeline, NOW + LEASE + 1, max_claims=1) is None  # crash loop: parked
    job = store.job("job-1")
    assert (job["state"], job["attempts"], job["claims"]) == ("failed_fetch", 1, 1)
    token = job["lease_token"]
    assert store.requeue("job-1", "op", NOW) == "pending"
    job = store.job("job-1")
    assert (job["state"], job["attempts"], job["claims"], job["next_run_at"]) == (
        "pending", 0, 0, NOW)
    assert job["lease_token"] == token + 1
    run()
    assert store.job("job-1")["state"] == "delivered"


@pytest.mark.parametrize("state", ["pending", "fetching", "delivered", "cancelled"])
def test_requeue_of_a_job_that_is_not_parked_is_refused(store, pipeline, run, state):
    job_in(store, pipeline, run, state)
    before = store.job("job-1")
    with pytest.raises(OperatorError, match=f"'{state}', not parked"):
        store.requeue("job-1", "op", NOW)
    assert store.job("job-1") == before


# -- resolve ---------------------------------------------------------------------------------

def test_resolve_without_output_reruns_the_step(store, pipeline, run):
    job_in(store, pipeline, run, "needs_human")
    assert store.resolve("job-1", "op", NOW) == "extracted"
    assert store.memo("job-1", "verify") is None
    assert store.memo("job-1", "extract") is not None
    runner = run()
    assert runner.calls["verify"] == 1 and runner.calls["extract"] == 0
    assert store.job("job-1")["state"] == "delivered"


def test_resolve_with_output_records_it_and_skips_the_call(store, pipeline, run):
    job_in(store, pipeline, run, "needs_human")
    assert store.resolve("job-1", "op", NOW, output={"ok": True, "reason": "checked"}) == "extracted"
    memo = store.query("SELECT output, cost, worker FROM step_result WHERE step='verify'")[0]
    assert (json.loads(memo["output"]), memo["cost"], memo["worker"]) == (
        {"ok": True, "reason": "checked"}, 0, "op")
    runner = run()
    assert runner.calls["verify"] == 0
    assert store.job("job-1")["state"] == "delivered"


@pytest.mark.parametrize("state", ["pending", "fetching", "delivered"])
def test_resolve_of_a_job_that_is_not_parked_changes_nothing(store, pipeline, run, state):
    job_in(store, pipeline, run, state)
    before = (store.job("job-1"), store.query("SELECT * FROM step_result ORDER BY step"))
    with pytest.raises(OperatorError, match=f"'{state}'"):
        store.resolve("job-1", "op", NOW, output={"ok": True})
    assert (store.job("job-1"), store.query("SELECT * FROM step_result ORDER BY step")) == before


# -- queries ---------------------------------------------------------------------------------

DAY = 86400.0
POISON = "fetch: PoisonError: POST http://provider/v1 answered 400: bad request body"
#: id, state, created, updated, lease_until, last_error
JOBS = [
    ("a", "delivered", NOW - 500, NOW - 400, 0, None),
    ("b", "pending", NOW - 300, NOW - 100, 0, None),
    ("c", "fetching", NOW - 200, NOW - 60, NOW - 10, None),     # its worker died: stuck
    ("d", "extracting", NOW - 50, NOW - 20, NOW + 30, None),    # leased and alive
    ("e", "failed_fetch", NOW - 150, NOW - 90, 0, POISON),
    ("f", "failed_fetch", NOW - 140, NOW - 80, 0, POISON),
    ("g", "needs_human", NOW - 130, NOW - 70, 0, "verify: flagged for review: x"),
    ("h", "cancelled", NOW - 900, NOW - 800, 0, None),
]
#: job, step, cost, at
MEMOS = [("a", "fetch", 0.01, NOW - 450), ("a", "extract", 0.03, NOW - 440),
         ("d", "fetch", 0.01, NOW - 30), ("old", "fetch", 5.0, NOW - 2 * DAY)]
#: job, step, outcome, cost, started
SPEND = [("a", "fetch", "ok", 0.01, NOW - 450), ("a", "extract", "ok", 0.03, NOW - 440),
         ("d", "fetch", "retryable", 0.01, NOW - 40), ("d", "fetch", "ok", 0.01, NOW - 30),
         ("e", "fetch", "poison", 0.01, NOW - 95), ("f", "fetch", "timeout", None, NOW - 85),
         ("old", "fetch", "ok", 5.0, NOW - 2 * DAY)]


@pytest.fixture
def operated(store):
    """A hand-built database: jobs in every kind of state, memos, spend and a dead letter."""
    with store.write() as conn:
        for job_id, state, created, updated, lease_until, error in JOBS:
            conn.execute("INSERT INTO job (id, pipeline, state, payload, lease_until, last_error,"
                         " created, updated) VALUES (?, 'document', ?, '{}', ?, ?, ?, ?)",
                         (job_id, state, lease_until, error, created, updated))
        conn.executemany("INSERT INTO step_result (job_id, step, output, cost, at)"
                         " VALUES (?, ?, '{}', ?, ?)", MEMOS)
        conn.executemany("INSERT INTO outbox (job_id, kind, payload, idempotency_key, created,"
                         " attempts, dead_at, last_error) VALUES (?, ?, '{}', ?, ?, ?, ?, ?)",
                         [("a", "charge", "a:charge", NOW - 400, 8, NOW - 5, "503 x8"),
                          ("a", "notify", "a:notify", NOW - 400, 1, None, None)])
        # A row sent, and one a sender holds right now.
        conn.executemany("INSERT INTO outbox (job_id, kind, payload, idempotency_key, created,"
                         " attempts, sent_at, lease_until) VALUES (?, ?, '{}', ?, ?, 1, ?, ?)",
                         [("b", "charge", "b:charge", NOW - 60, NOW - 50, 0),
                          ("d", "notify", "d:notify", NOW - 20, None, NOW + 10)])
    for job_id, step, outcome, cost, started in SPEND:
        store.record_spend(Spend(job_id, step, "w1", 1, started, started + 1, outcome, cost))
    return store


def test_status_counts_jobs_per_state_with_their_age(operated):
    assert operated.status(NOW) == [
        {"state": "failed_fetch", "jobs": 2, "avg_age_s": 85.0},
        {"state": "cancelled", "jobs": 1, "avg_age_s": 800.0},
        {"state": "delivered", "jobs": 1, "avg_age_s": 400.0},
        {"state": "extracting", "jobs": 1, "avg_age_s": 20.0},
        {"state": "fetching", "jobs": 1, "avg_age_s": 60.0},
        {"state": "needs_human", "jobs": 1, "avg_age_s": 70.0},
        {"state": "pending", "jobs": 1, "avg_age_s": 100.0},
    ]


def test_stuck_lists_only_expired_leases(operated):
    assert [(r["id"], r["state"]) for r in operated.stuck(NOW)] == [("c", "fetching")]
    assert [r["id"] for r in operated.stuck(NOW + 31)] == ["c", "d"]


def test_status_of_the_outbox_counts_rows_per_state_with_the_oldest_age(operated):
    # Job a is delivered, yet one of its rows is unsent: status shows it beside the jobs.
    assert operated.outbox_status(NOW) == [
        {"state": "pending", "rows": 1, "oldest_age_s": 400.0},
        {"state": "sending", "rows": 1, "oldest_age_s": 20.0},
        {"state": "sent", "rows": 1, "oldest_age_s": 60.0},
        {"state": "dead", "rows": 1, "oldest_age_s": 400.0},
    ]
    assert operated.outbox_status(NOW + 11)[0] == {  # the sender's lease ran out
        "state": "pending", "rows": 2, "oldest_age_s": 411.0}


def test_failures_group_parked_jobs_by_their_whole_error(operated, pipeline):
    assert operated.failures(pipeline.parked_states) == [
        {"state": "failed_fetch", "error": POISON, "jobs": 2},
        {"state": "needs_human", "error": "verify: flagged for review: x", "jobs": 1},
    ]


def test_costs_show_committed_billed_and_wasted_spend_per_step(operated):
    rows = {r["step"]: r for r in operated.costs(NOW)}
    assert list(rows) == ["extract", "fetch"]  # the most expensive step first
    assert rows["extract"] == {"step": "extract", "results": 1, "committed": 0.03, "mean": 0.03,
                               "calls": 1, "billed": 0.03, "wasted": 0.0}
    # fetch: 5 calls in the window billed 0.04 (one cost unknown); 2 results kept 0.02.
    assert rows["fetch"] == {"step": "fetch", "results": 2, "committed": 0.02, "mean": 0.01,
                             "calls": 5, "billed": 0.04, "wasted": 0.02}


def test_alerts_report_the_oldest_unfinished_job_parked_rows_and_dead_letters(operated,
                                                                              pipeline):
    alerts = operated.alerts(NOW, pipeline.terminal, pipeline.parked_states)
    assert alerts["oldest_unfinished"] == {"id": "b", "state": "pending", "age_s": 300.0}
    assert alerts["parked"] == [{"state": "failed_fetch", "jobs": 2},
                                {"state": "needs_human", "jobs": 1}]
    assert [(d["job_id"], d["kind"], d["attempts"]) for d in alerts["dead_letters"]] == [
        ("a", "charge", 8)]
    assert alerts["stuck"] == 1
    assert alerts["unsent_after_s"] == 300.0
    assert [(u["job_id"], u["kind"], u["age_s"]) for u in alerts["unsent"]] == [
        ("a", "notify", 400.0)]  # unsent long after its job was delivered


def test_alerts_flag_unsent_outbox_rows_older_than_the_threshold(operated, pipeline):
    def unsent(after):
        alerts = operated.alerts(NOW, pipeline.terminal, pipeline.parked_states, after)
        return [(u["job_id"], u["kind"]) for u in alerts["unsent"]]
    assert unsent(10.0) == [("a", "notify"), ("d", "notify")]  # a sent row never counts
    assert unsent(399.0) == [("a", "notify")]
    assert unsent(401.0) == []


# -- submit from the command line (in-process, so that a fault can be injected) -------------

def jobs_file(path, n: int, body: str = "x" * 2000) -> str:
    path.write_text("".join(json.dumps({"id": f"job-{i}", "payload": {"body": body}}) + "\n"
                            for i in range(1, n + 1)))
    return str(path)


def job_ids(db_path) -> list[str]:
    if not os.path.exists(db_path):
        return []
    conn = sqlite3.connect(db_path)
    try:
        return [r[0] for r in conn.execute("SELECT id FROM job ORDER BY created, rowid")]
    finally:
        conn.close()


def submit(db_path, *argv: str) -> int:
    return cli.main(["submit", "--db", db_path, "--synchronous", "NORMAL", *argv])


@pytest.fixture
def full_disk(monkeypatch):
    """The CLI's database fills up `pages` pages past its size when opened: SQLite's own
    `max_page_count` makes every write beyond that fail as on a full disk."""
    def fill_after(pages: int) -> None:
        def opened(config, read_only=False):
            store = original(config, read_only)
            size = store.conn.execute("PRAGMA page_count").fetchone()[0]
            store.conn.execute(f"PRAGMA max_page_count={size + pages}")
            return store
        monkeypatch.setattr(cli, "open_for", opened)
    original = cli.open_for
    return fill_after


def test_a_submit_cut_short_by_a_full_disk_says_what_committed_and_where_to_resume(
        db_path, tmp_path, full_disk, capsys):
    path = jobs_file(tmp_path / "jobs.jsonl", 40)
    submit(db_path, "--id", "job-0", "--payload", json.dumps({"body": "first"}))
    full_disk(pages=8)
    assert submit(db_path, "--file", path) == 2
    out, err = capsys.readouterr()
    committed = job_ids(db_path)[1:]
    assert 0 < len(committed) < 40
    assert committed == [f"job-{i}" for i in range(1, len(committed) + 1)]  # in file order
    line = len(committed) + 1
    assert f"disk is full" in err and f"jobs.jsonl:{line}" in err
    assert f"{len(committed)} of the file's 40 jobs are committed" in err
    assert f"resume from line {line}" in err
    assert f"submitted {len(committed)} new, 0 already present, 0 rejected, " \
           f"{40 - len(committed)} not submitted" in out


def test_the_same_file_submitted_again_after_a_full_disk_completes_it_once(
        db_path, tmp_path, full_disk, monkeypatch, capsys):
    path = jobs_file(tmp_path / "jobs.jsonl", 40)
    full_disk(pages=8)
    assert submit(db_path, "--file", path) == 2
    before = len(job_ids(db_path))
    monkeypatch.undo()  # room again
    capsys.readouterr()
    assert submit(db_path, "--file", path) == 0
    assert f"submitted {40 - before} new, {before} already present, 0 rejected" in \
        capsys.readouterr().out
    assert job_ids(db_path) == [f"job-{i}" for i in range(1, 41)]


def test_a_bad_line_in_the_middle_of_a_file_submits_nothing(db_path, tmp_path, capsys):
    path = tmp_path / "jobs.jsonl"
    jobs_file(path, 5)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:3]) + '{"id": "odd", "payload": {"text": "no body"}}\n'
                    + "".join(lines[3:]))
    assert submit(db_path, "--file", str(path)) == 2
    err = capsys.readouterr().err
    assert "jobs.jsonl:4" in err and "'odd'" in err and "'body'" in err
    assert "nothing was submitted" in err
    assert job_ids(db_path) == []


def test_a_line_over_the_payload_limit_is_refused_without_reading_it_whole(
        db_path, tmp_path, capsys):
    path = tmp_path / "jobs.jsonl"
    huge = 8 * 1024 * 1024
    with open(path, "w") as fh:
        fh.write(json.dumps({"id": "small", "payload": {"body": "x"}}) + "\n")
        fh.write('{"id": "huge", "payload": {"body": "' + "x" * huge + '"}}\n')
    tracemalloc.start()
    try:
        code = submit(db_path, "--file", str(path), "--max-payload-bytes", "65536")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert code == 2
    err = capsys.readouterr().err
    assert "jobs.jsonl:2" in err and "max_payload_bytes (65536 bytes" in err
    assert peak < huge / 4, peak  # the 8 MiB line was never held in memory
    assert job_ids(db_path) == []


@pytest.mark.parametrize("payload, says", [
    ("[1, 2]", "must be a JSON object, got list"),
    ('{"title": "t"}', "'body' must be a string, it is missing"),
    ('{"body": 7}', "'body' must be a string, got int"),
    ('{"body": "b", "title": ["t"]}', "'title' must be a string, got list"),
    ('{"body": NaN}', "NaN is not JSON"),
])
def test_a_payload_the_document_pipeline_cannot_run_is_refused_at_submit(
        db_path, capsys, payload, says):
    assert submit(db_path, "--id", "j", "--payload", payload) == 2
    assert says in capsys.readouterr().err
    assert job_ids(db_path) == []


def test_a_pipeline_of_ones_own_steps_takes_any_json_payload(db_path, capsys):
    assert submit(db_path, "--id", "j", "--payload", "[1, 2]",
                  "--steps", "tests.unit.test_operator:CountingSteps") == 0
    assert job_ids(db_path) == ["j"]


def test_the_fetch_step_checks_the_same_shape_as_submit():
    # A job stored without the CLI (through the store) is still parked at once, as poison.
    with pytest.raises(PoisonError, match="fetch: payload field 'body' must be a string"):
        DocumentSteps(client=None).call("fetch", {"title": "no body"}, None)


# -- the terminal view of a table --------------------------------------------------------------

def test_a_long_error_is_cut_at_a_word_boundary_with_an_ellipsis_and_json_keeps_it(capsys):
    error = "fetch: RetryableError: HTTP 503 from the provider (parked after 5 attempts)"
    rows = [{"state": "failed_fetch", "jobs": 2, "error": error}]
    operate.print_rows(rows, False, width=50)
    out = capsys.readouterr().out.splitlines()
    assert all(len(line) <= 50 for line in out), out
    cell = out[1][out[0].index("error"):]
    assert cell.endswith("…") and error.startswith(cell[:-1].rstrip())
    assert error[len(cell) - 1] == " "  # the cut fell between two words
    operate.print_rows(rows, True)
    assert json.loads(capsys.readouterr().out) == rows


# -- the retry defaults ----------------------------------------------------------------------

class DownFor(InstantSteps):
    """InstantSteps behind a provider that answers 503 until `until` on `clock`."""

    def __init__(self, clock, until: float) -> None:
        self.clock, self.until = clock, until

    def call(self, step, data, ctx):
        if step != "deliver" and self.clock.now() < self.until:
            raise RetryableError("HTTP 503 from the provider")
        return super().call(step, data, ctx)


def test_the_default_retries_ride_out_a_five_minute_provider_outage(store, config, clock,
                                                                    pipeline):
    assert (config.max_attempts, config.backoff_cap) == (25, 60.0)  # the defaults, not set
    for i in range(20):
        store.submit(f"job-{i}", pipeline, {"body": f"document {i}"}, clock.now())
    worker = Worker(store, config, runner=DownFor(clock, clock.now() + 300.0), clock=clock,
                    rng=random.Random(3))
    while store.active_jobs(pipeline.name):
        if not worker.run_once():  # nothing due: on to the next retry
            due = store.query("SELECT MIN(next_run_at) AS t FROM job"
                              " WHERE next_run_at IS NOT NULL")[0]["t"]
            clock.advance(due - clock.now())
    states = Counter(row["state"] for row in store.query("SELECT state FROM job"))
    assert states == {"delivered": 20}, states
