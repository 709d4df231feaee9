"""The engine's command line on PostgreSQL, as real processes with `--db postgresql://...`:
workers whose clocks are an hour off (as on another host) deliver every job, each step
committed once, since leases and due times are the server's; and what they write is dated by
the server's clock, as the operator's queries read it."""
from __future__ import annotations

import json

from engine import open_store

STORE_BACKENDS = ("postgres",)
JOBS = 6


def submit_jobs(engine, tmp_path) -> None:
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text("".join(json.dumps({"id": f"doc-{i}", "payload": {
        "doc_id": f"doc-{i}", "title": "Invoice", "body": "Ada wrote from London."}}) + "\n"
        for i in range(JOBS)))
    assert f"submitted {JOBS} new" in engine.ok("submit", "--file", str(jobs)).stdout


def test_workers_with_skewed_clocks_deliver_every_job_once(engine, db_target, tmp_path,
                                                           backend):
    submit_jobs(engine, tmp_path)
    # On the worker's own clock these jobs are due an hour from now, or were an hour ago:
    # only the server's clock says they are due now, and only it says whose lease is live.
    workers = [engine.start("worker", "--steps", "instant", "--exit-when-idle",
                            "--clock-skew", skew) for skew in ("-3600", "3600", "0")]
    for proc in workers:
        ran = engine.wait(proc, timeout=60)
        assert ran.returncode == 0, str(ran)
        assert "postgresql://" in ran.stderr  # it said which database it works on
    store = open_store(db_target, read_only=True)
    try:
        jobs = store.query("SELECT state, lease_token FROM job")
        assert [j["state"] for j in jobs] == ["delivered"] * JOBS
        memos = store.query("SELECT job_id, step FROM step_result")
        assert len(memos) == len({(m["job_id"], m["step"]) for m in memos}) == JOBS * 4
        assert store.query("SELECT COUNT(*) AS n FROM spend")[0]["n"] == JOBS * 3  # no rebill
    finally:
        store.close()


def test_what_a_skewed_worker_writes_is_dated_by_the_server(engine, tmp_path, backend):
    submit_jobs(engine, tmp_path)
    engine.ok("worker", "--steps", "instant", "--exit-when-idle", "--clock-skew", "-3600")
    # dated by the worker's clock, the delivered jobs would be an hour old and their outbox
    # rows an hour unsent; dated by the server's, they are seconds old
    status = json.loads(engine.ok("status", "--json").stdout)
    assert {r["state"]: r["jobs"] for r in status["jobs"]} == {"delivered": JOBS}
    assert all(0 <= r["avg_age_s"] < 60 for r in status["jobs"]), status
    assert [(r["state"], r["rows"]) for r in status["outbox"]] == [("pending", 2 * JOBS)]
    alerts = json.loads(engine.ok("alerts", "--unsent-after", "600").stdout)
    assert (alerts["stuck"], alerts["unsent"], alerts["oldest_unfinished"]) == (0, [], None)
