"""The engine's command line, run as real processes: bad input exits 2 with one `error:` line
naming the culprit and loses nothing; a submit conflict exits 1 and keeps the original; the four
operator queries and `alerts` report a small database correctly; cancel, requeue and resolve act
or refuse; rerun-step calls the provider again but writes nothing."""
from __future__ import annotations

import json
import re
import sqlite3
import time

import pytest

from engine import DOCUMENT, open_store
from engine.store.schema import SCHEMA_VERSION

KEPT = "kept-1"
LEASE = 30.0
TABLES = ("job", "step_result", "outbox", "spend")

#: Valid outputs for each step, to walk a job through the store by hand.
OUTPUTS = {"fetch": {"title": "t", "text": "Some text", "chars": 9},
           "extract": {"title": "t", "words": 2, "entities": [], "amount_cents": 5},
           "verify": {"ok": True, "reason": "ok"},
           "deliver": {"charge_cents": 5, "title": "t"}}


def document(job_id: str, title: str = "Invoice") -> str:
    return json.dumps({"doc_id": job_id, "title": title,
                       "body": "Grace Hopper of Compilers Inc wrote from Arlington."})


def rows(db, sql: str, params: tuple = ()) -> list[dict]:
    conn = sqlite3.connect(db)
    try:
        cur = conn.execute(sql, params)
        return [dict(zip([d[0] for d in cur.description], r)) for r in cur.fetchall()]
    finally:
        conn.close()


def dump(db) -> dict:
    """Everything the engine keeps: every row of its tables, and the schema version."""
    out = {t: rows(db, f"SELECT * FROM {t} ORDER BY 1, 2") for t in TABLES}
    out["user_version"] = rows(db, "PRAGMA user_version")[0]["user_version"]
    return out


def job_row(db, job_id: str) -> dict:
    return rows(db, "SELECT * FROM job WHERE id=?", (job_id,))[0]


def memo(db, job_id: str, step: str) -> dict | None:
    found = rows(db, "SELECT output FROM step_result WHERE job_id=? AND step=?", (job_id, step))
    return json.loads(found[0]["output"]) if found else None


def error_of(ran) -> str:
    """The one `error:` line a refused command must print (and no traceback)."""
    assert "Traceback" not in ran.stderr, str(ran)
    errors = [line for line in ran.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, str(ran)
    return errors[0]


def put(db, job_id: str, state: str, now: float | None = None) -> None:
    """Submit `job_id` and bring it to `state` through the engine's own store API.

    state: pending, fetching (leased for LEASE s from `now`), failed_fetch, needs_human or
    delivered.
    """
    now = time.time() if now is None else now
    store = open_store(db, synchronous="NORMAL")
    try:
        store.submit(job_id, DOCUMENT, json.loads(document(job_id)), now)
        claim = None if state == "pending" else store.claim(DOCUMENT, "test", now, LEASE, 10)
        if state == "failed_fetch":
            store.fail(claim, DOCUMENT, "test", now, error="fetch: provider down", retry_at=None)
        while state in ("needs_human", "delivered") and claim is not None:
            park = "flagged" if state == "needs_human" and claim.step.name == "verify" else None
            output = {"ok": False, "reason": "flagged"} if park else OUTPUTS[claim.step.name]
            claim = store.complete(claim, DOCUMENT, "test", now, output=json.dumps(output),
                                   park_reason=park, continue_lease=LEASE)
        assert store.job(job_id)["state"] == state
    finally:
        store.close()


def write(path, data: str | bytes) -> str:
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return str(path)


@pytest.fixture
def kept(engine, db_path):
    """A database holding one submitted job; returns all its contents, to compare after."""
    engine.ok("submit", "--id", KEPT, "--payload", document(KEPT))
    return dump(db_path)


# --- bad input: exit 2, the culprit named, nothing changed --------------------------------------

GOOD_LINE = json.dumps({"id": "from-file", "payload": {"body": "x"}}) + "\n"

#: case -> (the command line, given the test's folder; what the error line must name)
BAD_INPUT = {
    "payload not JSON": (lambda tmp: ["submit", "--id", "x", "--payload", "not json"],
                         ["--payload"]),
    "submit without payload": (lambda tmp: ["submit", "--id", "x"], ["--id", "--payload"]),
    "jobs file with a bad line": (
        lambda tmp: ["submit", "--file", write(tmp / "jobs.jsonl", GOOD_LINE + "not json\n")],
        ["jobs.jsonl:2"]),
    "jobs file line without payload": (
        lambda tmp: ["submit", "--file", write(tmp / "jobs.jsonl", '{"id": "y"}\n')],
        ["jobs.jsonl:1", "payload"]),
    "jobs file not UTF-8": (
        lambda tmp: ["submit", "--file", write(tmp / "jobs.jsonl", GOOD_LINE.encode() + b"\xff\n")],
        ["jobs.jsonl"]),
    "jobs file missing": (lambda tmp: ["submit", "--file", str(tmp / "absent.jsonl")],
                          ["absent.jsonl"]),
    "database in a missing folder": (
        lambda tmp: ["submit", "--id", "x", "--payload", document("x"),
                     "--db", str(tmp / "no" / "e.db")],
        ["no/e.db"]),
    "database missing for a query": (lambda tmp: ["status", "--db", str(tmp / "absent.db")],
                                     ["absent.db"]),
    "unknown pipeline on submit": (
        lambda tmp: ["submit", "--pipeline", "nope", "--id", "x", "--payload", document("x")],
        ["'nope'"]),
    "payload without a body": (
        lambda tmp: ["submit", "--id", "x", "--payload", '{"title": "t"}'],
        ["--payload", "'body'"]),
    "jobs file line over the size limit": (
        lambda tmp: ["submit", "--max-payload-bytes", "100", "--file",
                     write(tmp / "jobs.jsonl", GOOD_LINE + json.dumps(
                         {"id": "big", "payload": {"body": "x" * 200}}) + "\n")],
        ["jobs.jsonl:2", "max_payload_bytes"]),
    "unknown pipeline on worker": (
        lambda tmp: ["worker", "--pipeline", "nope", "--steps", "instant", "--exit-when-idle"],
        ["'nope'"]),
    "call outlives lease": (
        lambda tmp: ["worker", "--heartbeat", "off", "--call-timeout", "30", "--lease", "10",
                     "--steps", "instant", "--exit-when-idle"],
        ["call_timeout", "lease", "heartbeat"]),
    "send outlives outbox lease": (
        lambda tmp: ["send", "--send-timeout", "40", "--outbox-lease", "30", "--exit-when-idle"],
        ["send_timeout", "outbox_lease"]),
    "flag not a number": (lambda tmp: ["status", "--lease", "soon"], ["--lease", "'soon'"]),
    "unknown key in config file": (
        lambda tmp: ["status", "--config", write(tmp / "engine.toml", "[engine]\nleese = 3\n")],
        ["engine.toml", "'leese'"]),
    "config file missing": (lambda tmp: ["status", "--config", str(tmp / "absent.toml")],
                            ["absent.toml"]),
    "resolve output not JSON": (lambda tmp: ["resolve", KEPT, "--output", "{oops"],
                                ["--output"]),
    "unknown job": (lambda tmp: ["cancel", "ghost"], ["'ghost'"]),
    "rerun-step without the previous memo": (lambda tmp: ["rerun-step", KEPT, "extract"],
                                             [f"'{KEPT}'", "'fetch'"]),
    "rerun-step of an unknown step": (lambda tmp: ["rerun-step", KEPT, "nope"], ["'nope'"]),
}


@pytest.mark.parametrize("case", BAD_INPUT)
def test_bad_input_exits_2_naming_the_culprit_and_changes_nothing(
        case, engine, kept, db_path, tmp_path):
    argv, names = BAD_INPUT[case]
    ran = engine.run(*argv(tmp_path))
    assert ran.returncode == 2, str(ran)
    error = error_of(ran)
    assert [n for n in names if n not in error] == [], error
    assert dump(db_path) == kept


def test_the_same_id_with_another_payload_is_rejected_and_the_original_kept(
        engine, kept, db_path):
    ran = engine.run("submit", "--id", KEPT, "--payload", document(KEPT, title="Other"))
    assert ran.returncode == 2, str(ran)
    assert f"'{KEPT}'" in error_of(ran)
    assert "1 rejected" in ran.stdout
    assert dump(db_path) == kept


def test_resubmitting_the_same_job_changes_nothing(engine, kept, db_path):
    assert "1 already present" in engine.ok("submit", "--id", KEPT,
                                            "--payload", document(KEPT)).stdout
    assert dump(db_path) == kept


@pytest.mark.parametrize("argv", [["status"], ["submit", "--id", "y", "--payload", document("y")],
                                  ["worker", "--steps", "instant", "--exit-when-idle"]],
                         ids=lambda argv: argv[0])
def test_a_database_from_a_newer_engine_is_refused_untouched(argv, engine, kept, db_path,
                                                             tmp_path):
    newer = str(tmp_path / "newer.db")
    with sqlite3.connect(db_path) as src, sqlite3.connect(newer) as dst:
        src.backup(dst)
        dst.execute("PRAGMA user_version=99")
    before = dump(newer)
    ran = engine.run(*argv, "--db", newer)
    assert ran.returncode == 2, str(ran)
    error = error_of(ran)
    assert newer in error
    assert {"99", str(SCHEMA_VERSION)} <= set(re.findall(r"\d+", error.replace(newer, "")))
    assert dump(newer) == before
    assert dump(db_path) == kept


def test_a_locked_database_is_named_and_the_submit_succeeds_once_released(engine, kept,
                                                                         db_path):
    holder = sqlite3.connect(db_path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        ran = engine.run("submit", "--id", "new-1", "--payload", document("new-1"),
                         busy_timeout=0.2)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert ran.returncode == 2, str(ran)
    error = error_of(ran)
    assert "locked" in error and db_path in error
    assert dump(db_path) == kept
    assert "submitted 1 new" in engine.ok("submit", "--id", "new-1", "--payload",
                                          document("new-1"), busy_timeout=0.2).stdout


# --- the operator queries on a small database ---------------------------------------------------

@pytest.fixture(scope="module")
def operated(module_engine, tmp_path_factory):
    """Three jobs delivered by a worker process with instant steps, one parked in
    failed_fetch, one stuck in fetching (its lease expired a minute ago)."""
    jobs = tmp_path_factory.mktemp("jobs") / "jobs.jsonl"
    jobs.write_text("".join(json.dumps({"id": f"doc-{i}", "payload": json.loads(document(
        f"doc-{i}"))}) + "\n" for i in range(3)))
    module_engine.ok("submit", "--file", str(jobs))
    module_engine.ok("worker", "--steps", "instant", "--exit-when-idle")
    put(module_engine.db, "parked-1", "failed_fetch")
    put(module_engine.db, "stuck-1", "fetching", now=time.time() - 60)
    return module_engine


INSTANT_COST = 0.001

#: query -> (exit code, what its JSON output must say)
QUERIES = {
    "status": (0, lambda status: {r["state"]: r["jobs"] for r in status["jobs"]} == {
        "delivered": 3, "failed_fetch": 1, "fetching": 1}
        # no sender ran: the delivered jobs' six effects wait in the outbox
        and [(r["state"], r["rows"]) for r in status["outbox"]] == [("pending", 6)]),
    "stuck": (0, lambda rows: [(r["id"], r["state"]) for r in rows] == [("stuck-1", "fetching")]),
    "failures": (0, lambda rows: [(r["state"], r["jobs"]) for r in rows] == [("failed_fetch", 1)]
                 and rows[0]["error"].startswith("fetch: provider down")),
    "costs": (0, lambda rows: {r["step"]: (r["results"], r["committed"], r["calls"], r["wasted"])
                               for r in rows} == {
        "fetch": (3, 3 * INSTANT_COST, 3, 0), "extract": (3, 3 * INSTANT_COST, 3, 0),
        "verify": (3, 3 * INSTANT_COST, 3, 0), "deliver": (3, 0, 0, 0)}),
    "alerts": (1, lambda alerts: alerts["oldest_unfinished"]["id"] == "stuck-1"
               and alerts["parked"] == [{"state": "failed_fetch", "jobs": 1}]
               and alerts["dead_letters"] == [] and alerts["stuck"] == 1
               and alerts["unsent"] == [] and alerts["unsent_after_s"] == 300),
}


@pytest.mark.parametrize("query", QUERIES)
def test_the_operator_queries_report_the_database(query, operated):
    code, holds = QUERIES[query]
    ran = operated.run(query, *(() if query == "alerts" else ("--json",)))
    assert ran.returncode == code, str(ran)
    assert holds(json.loads(ran.stdout)), ran.stdout


def test_status_prints_a_table_of_jobs_per_state_and_one_of_the_outbox(operated):
    out = operated.ok("status").stdout
    assert re.search(r"^delivered\s+3\s", out, re.M), out
    assert out.splitlines()[0].split() == ["state", "jobs", "avg_age_s"]
    jobs, outbox = out.split("\noutbox\n")
    assert outbox.splitlines()[0].split() == ["state", "rows", "oldest_age_s"]
    assert re.search(r"^pending\s+6\s+\d", outbox, re.M), out


def test_alerts_flag_outbox_rows_unsent_past_the_threshold(operated):
    ran = operated.run("alerts", "--unsent-after", "0.001")
    assert ran.returncode == 1, str(ran)
    unsent = json.loads(ran.stdout)["unsent"]
    assert sorted((u["job_id"], u["kind"]) for u in unsent) == [
        (f"doc-{i}", kind) for i in range(3) for kind in ("charge", "notify")]
    ran = operated.run("alerts", "--unsent-after", "nan")
    assert ran.returncode == 2 and "argument --unsent-after" in ran.stderr, str(ran)
    assert "Traceback" not in ran.stderr, str(ran)


def test_failures_json_carries_the_whole_error_the_table_cuts_it_at_a_word(engine, db_path):
    error = ("fetch: RetryableError: POST http://127.0.0.1:9/v1/chat/completions answered "
             "503: the provider is down for maintenance (parked after 5 attempts)")
    put(db_path, "job-1", "failed_fetch")
    with sqlite3.connect(db_path) as conn:
        conn.execute("UPDATE job SET last_error=?", (error,))
    assert json.loads(engine.ok("failures", "--json").stdout)[0]["error"] == error
    engine.env["COLUMNS"] = "60"  # the width a terminal of 60 columns reports
    table = engine.ok("failures").stdout.splitlines()
    cell = table[1][table[0].index("error"):]
    assert cell.endswith("…") and len(table[1]) <= 60, table
    assert error.startswith(cell[:-1]) and error[len(cell) - 1] == " ", table


# --- operator actions ---------------------------------------------------------------------------

#: the job's state, the action, exit code, what the action prints, the state after
ACTIONS = [pytest.param(*case, id=case_id) for case_id, case in {
    "cancel pending": ("pending", ["cancel"], 0, "pending -> cancelled", "cancelled"),
    "cancel parked": ("failed_fetch", ["cancel"], 0, "failed_fetch -> cancelled", "cancelled"),
    "requeue failed": ("failed_fetch", ["requeue"], 0, "requeued to pending", "pending"),
    "requeue review": ("needs_human", ["requeue"], 0, "requeued to extracted", "extracted"),
    "resolve approve": ("needs_human", ["resolve", "--approve"], 0, "resolved to extracted",
                        "extracted"),
    "resolve output": ("failed_fetch", ["resolve", "--output", json.dumps(OUTPUTS["fetch"])], 0,
                       "resolved to pending", "pending"),
    "refuse cancel delivered": ("delivered", ["cancel"], 2, "'delivered'", "delivered"),
    "refuse cancel working": ("fetching", ["cancel"], 2, "'fetching'", "fetching"),
    "refuse requeue pending": ("pending", ["requeue"], 2, "not parked", "pending"),
    "refuse resolve delivered": ("delivered", ["resolve", "--approve"], 2, "not parked",
                                 "delivered"),
    "refuse resolve off schema": ("needs_human", ["resolve", "--output", "[]"], 2, "verify",
                                  "needs_human"),
}.items()]


@pytest.mark.parametrize("state, action, code, says, after", ACTIONS)
def test_an_operator_action_acts_or_refuses_leaving_the_job_as_it_was(
        state, action, code, says, after, engine, db_path):
    put(db_path, "job-1", state)
    before, before_token = dump(db_path), job_row(db_path, "job-1")["lease_token"]
    ran = engine.run(action[0], "job-1", *action[1:])
    assert ran.returncode == code, str(ran)
    assert says in (ran.stdout if code == 0 else error_of(ran)), str(ran)
    job = job_row(db_path, "job-1")
    assert job["state"] == after
    if code == 0:  # a fenced operator write; claimable again unless cancelled
        assert job["updated_by"].startswith("operator:") and job["lease_token"] > before_token
        assert (job["next_run_at"] is None) == (after == "cancelled")
    else:
        assert dump(db_path) == before


@pytest.mark.parametrize("flags, approved", [(["--approve"], True), ([], None)],
                         ids=["approve", "discard"])
def test_resolve_records_or_discards_the_parked_steps_memo(flags, approved, engine, db_path):
    put(db_path, "job-1", "needs_human")
    engine.ok("resolve", "job-1", *flags)
    verify = memo(db_path, "job-1", "verify")
    assert (verify["ok"] if verify else None) is approved


# --- rerun-step ---------------------------------------------------------------------------------

@pytest.fixture
def delivered(engine, kept, start_fakes, db_path):
    """The kept job delivered by a worker process against the fake provider; returns it."""
    provider, receiver = start_fakes()
    engine.settings.update(provider_url=provider.url, receiver_url=receiver.url,
                           lease=5, call_timeout=2)
    engine.ok("worker", "--exit-when-idle")
    assert job_row(db_path, KEPT)["state"] == "delivered"
    return provider


def extract_calls(provider) -> int:
    return sum(1 for c in provider.entries() if (c["job"], c["step"]) == (KEPT, "extract"))


def test_rerun_step_of_an_untouched_job_shows_no_difference_and_writes_nothing(
        delivered, engine, db_path):
    before, calls = dump(db_path), extract_calls(delivered)
    out = engine.ok("rerun-step", KEPT, "extract").stdout
    assert "no difference from the memo" in out
    assert "nothing was written" in out
    assert extract_calls(delivered) == calls + 1  # really run again, on the memoized input
    assert dump(db_path) == before


def test_rerun_step_prints_how_the_memo_differs_and_writes_nothing(delivered, engine, db_path):
    with sqlite3.connect(db_path) as conn:
        conn.execute("UPDATE step_result SET output=json_set(output, '$.words', 999)"
                     " WHERE job_id=? AND step='extract'", (KEPT,))
    before = dump(db_path)
    out = engine.ok("rerun-step", KEPT, "extract").stdout
    assert re.search(r'^-\s+"words": 999,?$', out, re.M), out
    assert re.search(r'^\+\s+"words": \d+,?$', out, re.M), out
    assert dump(db_path) == before
