"""Bad input gets a clear error and loses nothing: a database from a newer schema, a read-only
or locked database, a file that is not a database or cannot be opened, and payloads that are
not JSON."""
from __future__ import annotations

import hashlib
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
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE t (x)")
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
    with pytest.raises(DatabaseError, match="'postgres'"):
        open_store("postgres://localhost/ninelives")


# -- payloads --------------------------------------------------------------------------------

@pytest.mark.parametrize("payload", [{"tags": {"a", "b"}}, {"when": object()}, b"bytes",
                                     {"x": float("nan")}, {"x": float("inf")}],
                         ids=["set", "object", "bytes", "nan", "inf"])
def test_a_payload_that_is_not_json_is_refused_and_creates_no_row(store, pipeline, payload):
    with pytest.raises((TypeError, ValueError), match="JSON|not serializable|out of range"):
        store.submit("job-1", pipeline, payload, NOW)
    assert store.job("job-1") is None
    assert store.query("SELECT COUNT(*) AS n FROM job") == [{"n": 0}]
