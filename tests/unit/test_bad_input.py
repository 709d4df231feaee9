"""Bad input gets a clear error and loses nothing: a database from a newer schema, a read-only
or locked database, a file that is not a database or cannot be opened, and payloads that are
not JSON."""
from __future__ import annotations

import hashlib
import json
import os
import re
import sqlite3
from contextlib import closing

import pytest

from engine.store import DatabaseError, StoreBusy, open_store
from engine.store.schema import SCHEMA_VERSION

NOW = 1_000_000.0


def fingerprint(path: str) -> tuple[str, int]:
    """The file's content hash and modification time."""
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest(), os.stat(path).st_mtime_ns


def user_version(path: str) -> int:
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        return conn.execute("PRAGMA user_version").fetchone()[0]


@pytest.fixture
def existing(db_path, pipeline):
    """A closed engine database holding one pending job, `job-1`."""
    store = open_store(db_path, synchronous="NORMAL")
    store.submit("job-1", pipeline, {"doc": 1}, NOW)
    store.close()
    return db_path


def job_ids(path: str) -> list[str]:
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        return [r[0] for r in conn.execute("SELECT id FROM job ORDER BY id")]


# -- schema version --------------------------------------------------------------------------

def test_a_newer_database_is_refused_naming_both_versions_and_left_untouched(existing):
    newer = SCHEMA_VERSION + 41
    with closing(sqlite3.connect(existing)) as conn:
        conn.execute(f"PRAGMA user_version={newer}")
    before = fingerprint(existing)
    with pytest.raises(DatabaseError) as err:
        open_store(existing)
    message = str(err.value)
    assert existing in message and f"schema version {newer}" in message
    assert re.search(rf"\b{SCHEMA_VERSION}\b", message.replace(existing, ""))
    assert fingerprint(existing) == before
    assert user_version(existing) == newer
    assert job_ids(existing) == ["job-1"]


# -- read-only -------------------------------------------------------------------------------
# The tests run as root, and chmod 0o444 does not stop root from writing; so a read-only
# database is made by opening it read-only (SQLite's mode=ro) or with PRAGMA query_only.

WRITES = {
    "submit": lambda store, pipeline: store.submit("job-2", pipeline, {"doc": 2}, NOW),
    "claim": lambda store, pipeline: store.claim(pipeline, "w1", NOW, 5.0, 10),
    "cancel": lambda store, pipeline: store.cancel("job-1", "op", NOW),
}


def open_read_only(path: str, how: str):
    if how == "mode=ro":
        return open_store(path, read_only=True)
    store = open_store(path)
    store.conn.execute("PRAGMA query_only=ON")
    return store


@pytest.mark.parametrize("how", ["mode=ro", "query_only"])
@pytest.mark.parametrize("write", sorted(WRITES))
def test_writing_a_read_only_database_names_it_and_loses_nothing(existing, pipeline, how, write):
    store = open_read_only(existing, how)
    try:
        assert store.job("job-1")["state"] == "pending"  # reading still works
        with pytest.raises(DatabaseError, match="read-only") as err:
            WRITES[write](store, pipeline)
        assert existing in str(err.value)
    finally:
        store.close()
    assert job_ids(existing) == ["job-1"]
    store = open_store(existing)
    try:
        assert store.job("job-1")["state"] == "pending"
        assert store.integrity_check() == "ok"
    finally:
        store.close()


def test_opening_a_missing_database_read_only_creates_nothing(tmp_path):
    missing = str(tmp_path / "missing.db")
    with pytest.raises(DatabaseError, match="does not exist"):
        open_store(missing, read_only=True)
    assert not os.path.exists(missing)


def test_an_unmigrated_database_cannot_be_opened_read_only(tmp_path):
    path = str(tmp_path / "old.db")
    open(path, "wb").close()  # an empty file: a database with no schema yet
    with pytest.raises(DatabaseError, match="needs migrating"):
        open_store(path, read_only=True)
    assert user_version(path) == 0


# -- locked ----------------------------------------------------------------------------------

def test_a_locked_database_gives_store_busy_then_works_once_released(existing, pipeline):
    store = open_store(existing, busy_timeout=0.05)
    lock = sqlite3.connect(existing, isolation_level=None)
    try:
        lock.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        for write in ("submit", "claim"):
            with pytest.raises(StoreBusy, match="locked") as err:
                WRITES[write](store, pipeline)
            assert existing in str(err.value)
        lock.execute("ROLLBACK")
        assert WRITES["submit"](store, pipeline) is True
        assert [r["id"] for r in store.query("SELECT id FROM job ORDER BY id")] == [
            "job-1", "job-2"]
        assert store.job("job-1")["state"] == "pending"
    finally:
        lock.close()
        store.close()


# -- not a database --------------------------------------------------------------------------

def test_a_file_that_is_not_a_database_is_named_and_left_untouched(tmp_path):
    path = str(tmp_path / "notes.db")
    with open(path, "wb") as fh:
        fh.write(b"these are my notes, not a database\n" * 200)
    before = fingerprint(path)
    with pytest.raises(DatabaseError, match="not a SQLite database") as err:
        open_store(path)
    assert path in str(err.value)
    assert fingerprint(path) == before


@pytest.mark.parametrize("where", ["a directory", "a missing directory"])
def test_a_path_that_cannot_be_opened_gives_a_database_error_naming_it(tmp_path, where):
    path = str(tmp_path) if where == "a directory" else str(tmp_path / "no" / "such" / "x.db")
    with pytest.raises(DatabaseError) as err:
        open_store(path)
    assert path in str(err.value)


def test_an_unsupported_url_scheme_is_named():
    with pytest.raises(DatabaseError, match="'mysql'.*postgresql://"):
        open_store("mysql://localhost/ninelives")


# -- payloads --------------------------------------------------------------------------------

@pytest.mark.parametrize("payload", [{"tags": {"a", "b"}}, {"when": object()}, b"bytes",
                                     {"x": float("nan")}, {"x": float("inf")}],
                         ids=["set", "object", "bytes", "nan", "inf"])
def test_a_payload_that_is_not_json_is_refused_and_creates_no_row(store, pipeline, payload):
    with pytest.raises((TypeError, ValueError), match="JSON|not serializable|out of range"):
        store.submit("job-1", pipeline, payload, NOW)
    assert store.job("job-1") is None
    assert store.query("SELECT COUNT(*) AS n FROM job") == [{"n": 0}]


# -- the documented bad-input tables, a case per row -----------------------------------------
# Each row of the two tables in the docs ("Bad input gets exit code 2": the harness's in how
# the harness judges, the engine's in operating it) is a case below, run through the
# command's own entry point: exit 2, one message naming what the row says.

DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "docs")
PAGES = [os.path.join(DOCS, "explanation", "harness.md"),
         os.path.join(DOCS, "how-to", "operate-engine.md")]


def readme_table(after: str) -> list[str]:
    """The first column of the first table after the line starting with `after`."""
    lines = []
    for page in PAGES:
        with open(page, encoding="utf-8") as fh:
            lines += fh.read().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(after))
    rows = []
    for line in lines[start + 1:]:
        if line.startswith("|"):
            rows.append(line.split("|")[1].strip())
        elif rows:
            break
    return rows[2:]  # the head and the rule


def exit_of(main, argv: list[str], capsys) -> tuple[int, str]:
    """A command's exit code and what it wrote to stderr (argparse exits by SystemExit)."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


def holding_the_lock(path: str):
    lock = sqlite3.connect(path, isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")
    return lock


#: A payload the built-in document pipeline takes.
DOC = '{"body": "a document"}'


def engine_case(row: str, tmp: str, monkeypatch, held: list) -> tuple[list[str], list[str]]:
    """(the engine command line, the fragments its message must hold) for a README row;
    a connection that holds the write lock is appended to `held`."""
    db = os.path.join(tmp, "engine.db")

    def file(name: str, text: str) -> str:
        with open(os.path.join(tmp, name), "w", encoding="utf-8") as fh:
            fh.write(text)
        return os.path.join(tmp, name)

    if row == "a payload that is not JSON":
        return ["submit", "--db", db, "--id", "a", "--payload", "{"], ["--payload", "not JSON"]
    if row.startswith("a jobs file line"):
        jobs = file("jobs.jsonl", '{"id": "a", "payload": {"body": "b"}}\n{"id": "b"}\n')
        return ["submit", "--db", db, "--file", jobs], [f"{jobs}:2", "'payload'"]
    if row == "an operator's output that is not JSON":
        return ["resolve", "job-1", "--db", db, "--output", "{"], ["--output", "not JSON"]
    if row == "the same id with another payload":
        from engine.cli import main as engine_main
        assert engine_main(["submit", "--db", db, "--id", "a", "--payload", DOC]) == 0
        return ["submit", "--db", db, "--id", "a", "--payload", '{"body": "other"}'], [
            "'a'", "already exists with a different payload"]
    if row == "a payload the built-in pipeline cannot run":
        return ["submit", "--db", db, "--id", "a", "--payload", '{"title": "t"}'], [
            "'body'", "document pipeline takes"]
    if row == "a payload over `max_payload_bytes`":
        jobs = file("jobs.jsonl", json.dumps({"id": "a", "payload": {"body": "x" * 2048}}) + "\n")
        return ["submit", "--db", db, "--max-payload-bytes", "1024", "--file", jobs], [
            f"{jobs}:1", "max_payload_bytes"]
    if row == "an unknown pipeline":
        return ["submit", "--db", db, "--pipeline", "nope", "--id", "a", "--payload", DOC], [
            "'nope'", "document"]
    if row == "a setting of the wrong type":
        config = file("engine.toml", 'lease = "2"\n')
        return ["worker", "--config", config, "--db", db], [f"config file {config}",
                                                             "'lease'", "'2'"]
    if row == "a number that is not finite":
        monkeypatch.setenv("NINELIVES_CALL_TIMEOUT", "inf")
        return ["worker", "--db", db], ["environment variable NINELIVES_CALL_TIMEOUT",
                                        "'call_timeout'", "finite"]
    if row == "a setting out of range, or unsafe beside another":
        return ["worker", "--db", db, "--heartbeat", "off", "--call-timeout", "30", "--lease",
                "10"], ["call_timeout", "lease", "heartbeat", "unsafe"]
    if row == "an unknown setting in a config file":
        config = file("engine.toml", "leese = 3\n")
        return ["status", "--config", config, "--db", db], [config, "'leese'"]
    if row == "a config file that is missing or not TOML":
        config = file("engine.toml", "[engine\n")
        return ["status", "--config", config, "--db", db], [config, "not valid TOML"]
    if row == "a command's own flag out of range":
        return ["worker", "--db", db, "--max-jobs", "0"], ["--max-jobs", ">= 1"]
    if row == "a state `jobs` does not know":
        return ["jobs", "--db", db, "--state", "parkd"], ["--state", "'parkd'", "parked"]
    if row == "a database that does not exist, for a query":
        missing = os.path.join(tmp, "missing.db")
        return ["status", "--db", missing], [missing, "does not exist"]
    if row == "a database from a newer schema":
        open_store(db).close()
        with closing(sqlite3.connect(db)) as conn:
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
        return ["status", "--db", db], [db, f"schema version {SCHEMA_VERSION + 1}"]
    if row == "a file that is not a database":
        notes = file("notes.txt", "my notes\n" * 200)
        return ["status", "--db", notes], [notes, "not a SQLite database"]
    if row == "a corrupt database":
        corrupt = os.path.join(tmp, "corrupt.db")
        open_store(corrupt).close()
        with open(corrupt, "r+b") as fh:
            fh.seek(4096)  # page 2: the job table's root
            fh.write(b"\xa5" * 4096)
        return ["alerts", "--db", corrupt], [corrupt, "corrupt"]
    if row == "another program's database":
        other = os.path.join(tmp, "other.db")
        with closing(sqlite3.connect(other)) as conn:
            conn.execute("CREATE TABLE notes (x)")
        return ["submit", "--db", other, "--id", "a", "--payload", DOC], [other, "'notes'"]
    if row == "a locked database":
        open_store(db).close()
        held.append(holding_the_lock(db))
        return ["submit", "--db", db, "--busy-timeout", "0.05", "--id", "a", "--payload",
                DOC], [db, "locked"]
    raise AssertionError(f"the README's engine table has a row no case covers: {row!r}")


ENGINE_ROWS = readme_table("Bad input gets exit code 2 and one line, `error: ...` (or")


def test_the_engine_table_is_the_one_the_cases_read():
    assert len(ENGINE_ROWS) >= 10 and "a payload that is not JSON" in ENGINE_ROWS


@pytest.mark.parametrize("row", ENGINE_ROWS)
def test_each_row_of_the_engine_bad_input_table_exits_2_naming_the_cause(row, tmp_path,
                                                                         monkeypatch, capsys):
    from engine.cli import COMMANDS, main

    def started(*args, **kwargs):  # bad settings let through fail here, not by serving for good
        raise AssertionError("a worker or sender started")

    monkeypatch.setitem(COMMANDS, "worker", started)
    monkeypatch.setitem(COMMANDS, "send", started)
    held: list = []
    try:
        argv, fragments = engine_case(row, str(tmp_path), monkeypatch, held)
        code, err = exit_of(main, argv, capsys)
    finally:
        for lock in held:
            lock.close()
    assert code == 2, err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, f"{fragment!r} missing from: {err}"
    db = os.path.join(str(tmp_path), "engine.db")
    if os.path.exists(db) and row != "a database from a newer schema":
        # nothing was written (the job the same id first made stays as it was)
        assert job_ids(db) == (["a"] if row == "the same id with another payload" else [])


def harness_case(row: str, tmp: str) -> tuple[list[str], list[str]]:
    """(the `ninelives` command line, the fragments its message must hold) for a README row."""
    def scenario(body: str) -> str:
        path = os.path.join(tmp, "bad.toml")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write('name = "bad"\n' + body)
        return path

    out = os.path.join(tmp, "out")
    run = lambda body: ["run", scenario(body), "--out", out]  # noqa: E731
    if row == "an unknown scenario or profile":
        return ["run", "no-such", "--out", out], ["'no-such'", "smoke", "kill-storm"]
    if row == "a scenario file that is not TOML":
        return run("[run\n"), ["bad.toml", "not valid TOML", "line 2"]
    if row == "an unknown field":
        return run("[run]\nworkerz = 2\n"), ["bad.toml", "'run.workerz'", "workers"]
    if row == "a value of the wrong type":
        return run('[engine]\nheartbeat = "yes"\n'), ["bad.toml", "'heartbeat'", "boolean"]
    if row == "a number that is not finite":
        return run("[faults]\nkill = inf\n"), ["bad.toml", "'faults.kill'", "finite"]
    if row == "a value out of range":
        return run("[run]\nheal = -1.0\n"), ["bad.toml", "'run.heal'", ">= 0"]
    if row == "an impossible combination":
        return run("[run]\nchaos = 4.0\n[faults]\noutages = [[3.0, 5.0]]\n"), [
            "bad.toml", "'faults.outages'", "chaos phase"]
    if row == "an `[engine]` table the engine refuses":
        return run("[engine]\nheartbeat = false\ncall_timeout = 3.0\nlease = 2.0\n"), [
            "bad.toml", "[engine]", "call_timeout", "lease", "heartbeat"]
    if row == "a crash point the engine does not declare":
        return run('[faults]\ncrash_points = ["role:after_call", "worker.after_cal"]\n'
                   'crash_point_probability = 0.1\n'), [
            "bad.toml", "'faults.crash_points'", "'worker.after_cal'", "worker.after_call",
            "after_call -> worker.after_call"]
    if row == "a `--seeds` that names no seed":
        return ["sweep", "--seeds", "0", "--out", out], ["--seeds", "names no seed"]
    if row == "a `--shard` that is no shard of the seeds":
        return ["sim", "smoke", "--seeds", "1..2", "--shard", "3/3", "--out", out], [
            "--shard 3/3", "use at most 2 shards"]
    if row == "folders that are not one campaign's shards":
        return ["merge", tmp, "--out", out], [tmp, "no campaign.json"]
    if row == "a count below its floor":
        return ["replay", tmp, "--tries", "0"], ["--tries", ">= 1"]
    if row == "an engine file `score` cannot mutate":
        return ["score", "--modules", "/etc/passwd", "--workdir", out], [
            "--modules", "'/etc/passwd'", "engine/"]
    if row == "a sweep grid that is not one":
        return ["sweep", "--lease", "nan", "--out", out], ["--lease", "finite"]
    if row == "an engine that cannot be loaded":
        return ["run", "smoke", "--engine", "nosuch:X", "--out", out], ["'nosuch:X'"]
    if row == "a store that cannot be had":  # the others of the row: test_postgres_campaign
        return ["run", "smoke", "--backend", "postgres", "--pg-url",
                "mysql://u:pw@127.0.0.1/db", "--out", out], ["--pg-url", "postgresql://",
                                                             "mysql://u:***@127.0.0.1/db"]
    if row == "a count, duration or rate past its bound":
        return run("[run]\njobs = 5000000\n"), ["bad.toml", "'run.jobs'", "at most 100,000"]
    if row == "a scenario path that is no scenario file":
        return ["run", tmp, "--out", out], [os.path.basename(tmp),
                                            "is a folder, not a regular file"]
    raise AssertionError(f"the README's harness table has a row no case covers: {row!r}")


HARNESS_ROWS = readme_table("Bad input gets exit code 2 before anything runs")


def test_the_harness_table_is_the_one_the_cases_read():
    assert len(HARNESS_ROWS) >= 10 and "a number that is not finite" in HARNESS_ROWS


@pytest.mark.parametrize("row", HARNESS_ROWS)
def test_each_row_of_the_harness_bad_input_table_exits_2_before_anything_runs(row, tmp_path,
                                                                              capsys, monkeypatch):
    from chaos.commands.cli import main

    def started(*args, **kwargs):  # bad input let through fails here, not by running for good
        raise AssertionError("a run started")

    monkeypatch.setattr("chaos.run.runner.run_campaign", started)
    monkeypatch.setattr("chaos.commands.sweep.run_sweep", started)
    monkeypatch.setattr("chaos.score.campaign", started)
    argv, fragments = harness_case(row, str(tmp_path))
    code, err = exit_of(main, argv, capsys)
    assert code == 2, err
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in err, f"{fragment!r} missing from: {err}"
    assert not os.path.exists(os.path.join(str(tmp_path), "out"))  # no run folder was made
