"""A database the engine must not use is refused on open, by every command that opens a
store, with exit 2 naming the file, and left byte for byte as it was: a corrupt file (pages
overwritten) and another program's database (tables of its own, no engine schema)."""
from __future__ import annotations

import hashlib
import os
import sqlite3
import threading
from contextlib import closing

import pytest

from engine import cli
from engine.states import get_pipeline
from engine.store import DatabaseError, open_store

NOW = 1_000_000.0
PAGE = 4096
DOC = '{"title": "t", "body": "a document"}'

#: Each command with its own arguments; the worker's end by themselves, had it run.
COMMANDS = {
    "status": ["status"],
    "alerts": ["alerts"],
    "submit": ["submit", "--id", "new-job", "--payload", DOC],
    "worker": ["worker", "--steps", "instant", "--max-jobs", "1", "--exit-when-idle"],
}


def contents(path: str) -> str:
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def nothing_written(path: str, before: str) -> bool:
    """The file is as it was and no write-ahead log holds a frame meant for it."""
    wal = path + "-wal"
    return contents(path) == before and (not os.path.exists(wal) or os.path.getsize(wal) == 0)


@pytest.fixture
def corrupt_db(tmp_path) -> str:
    """An engine database of 40 jobs whose every other page after the second is overwritten,
    as a failing disk or a stray write leaves it (`database disk image is malformed`)."""
    path = str(tmp_path / "engine.db")
    store = open_store(path, synchronous="NORMAL")
    pipeline = get_pipeline("document")
    with store.batch():
        for n in range(40):
            store.submit(f"job-{n}", pipeline, {"title": f"t{n}", "body": "x" * 400}, NOW)
    store.close()  # the last connection checkpoints the log into the file and removes it
    with open(path, "r+b") as fh:
        pages = os.path.getsize(path) // PAGE
        assert pages > 6
        for page in range(2, pages, 2):
            fh.seek(page * PAGE)
            fh.write(b"\xa5" * PAGE)
    with closing(sqlite3.connect(path)) as conn:
        with pytest.raises(sqlite3.DatabaseError, match="malformed"):
            conn.execute("SELECT * FROM sqlite_master, job").fetchall()
    return path


@pytest.fixture
def foreign_db(tmp_path) -> str:
    """Another program's database: a table `notes` of its own, no engine schema."""
    path = str(tmp_path / "notes.db")
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, text TEXT)")
        conn.execute("INSERT INTO notes (text) VALUES ('buy milk')")
        conn.commit()
    return path


@pytest.fixture
def run(monkeypatch, capsys):
    """Run one engine command in-process: (exit code, stderr). A worker's signal handlers
    are not installed (they would outlive the test)."""
    monkeypatch.setattr(cli, "stop_on_signals", threading.Event)

    def run_command(argv: list[str]) -> tuple[int, str]:
        code = cli.main(argv)
        return code, capsys.readouterr().err
    return run_command


@pytest.mark.parametrize("command", COMMANDS)
def test_a_corrupt_database_is_refused_naming_the_file_and_nothing_is_written(
        command, corrupt_db, run):
    before = contents(corrupt_db)
    code, err = run([*COMMANDS[command], "--db", corrupt_db])
    assert code == 2, err
    assert f"database {corrupt_db} is corrupt" in err
    assert len(err.strip().splitlines()) == 1, err
    assert nothing_written(corrupt_db, before)


@pytest.mark.parametrize("command", COMMANDS)
def test_another_programs_database_is_refused_naming_its_tables_and_left_unchanged(
        command, foreign_db, run):
    before = contents(foreign_db)
    code, err = run([*COMMANDS[command], "--db", foreign_db])
    assert code == 2, err
    assert foreign_db in err and "'notes'" in err and "not an engine database" in err
    assert nothing_written(foreign_db, before)
    with closing(sqlite3.connect(foreign_db)) as conn:
        assert [r[0] for r in conn.execute("SELECT name FROM sqlite_master")] == ["notes"]


def test_many_tables_of_another_program_are_named_five_at_most(tmp_path):
    path = str(tmp_path / "many.db")
    with closing(sqlite3.connect(path)) as conn:
        for n in range(12):
            conn.execute(f"CREATE TABLE t{n:02d}_{'x' * 60} (x)")
    with pytest.raises(DatabaseError, match="and 7 more") as err:
        open_store(path)
    assert len(str(err.value)) < 600


def test_a_new_file_and_an_engine_database_still_open(tmp_path):
    path = str(tmp_path / "fresh.db")
    open_store(path).close()  # created and migrated
    store = open_store(path, read_only=True)  # migrated: no tables of another program
    assert store.schema_version() >= 1
    store.close()
