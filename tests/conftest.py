"""Shared fixtures: a fresh engine database per test (a SQLite file, or a database on a real
PostgreSQL server the tests start), and a clock that only moves when told.

A test module runs its store tests on every backend by naming them:
`STORE_BACKENDS = BACKENDS` (from store_backends); its tests that use `backend` (or `store`,
`db_target`, `new_store`, `engine`) are then parametrized over them, and a test marked
`sqlite_only` runs on SQLite alone. Elsewhere `backend` is "sqlite", unparametrized.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from engine import DOCUMENT, ManualClock, load_config, open_store

from store_backends import started_pg_server


def pytest_configure(config):
    config.addinivalue_line("markers", "sqlite_only: a store test of what only SQLite has "
                                       "(its files, locks, query plans)")


def pytest_generate_tests(metafunc):
    backends = getattr(metafunc.module, "STORE_BACKENDS", None)
    if backends is None or "backend" not in metafunc.fixturenames:
        return
    if metafunc.definition.get_closest_marker("sqlite_only"):
        backends = ("sqlite",)
    metafunc.parametrize("backend", backends, indirect=True)


@pytest.fixture
def backend(request):
    """The store backend under test: "sqlite" or "postgres"."""
    return getattr(request, "param", "sqlite")


@pytest.fixture(scope="session")
def pg_server():
    """A PostgreSQL server for this test session (per xdist worker), always stopped."""
    with started_pg_server() as server:
        yield server


@pytest.fixture
def new_store(backend, tmp_path, request):
    """Opens a store on a new, empty database of the backend: `new_store(**options)`, or
    `new_store(target, **options)` on a given one.

    On PostgreSQL the leases run on the caller's clock unless `lease_clock` is given, so
    that one test reads the same on both backends. Every store opened is closed, and every
    database made is removed, at teardown, or at once with `new_store.discard(store)` (on
    PostgreSQL a discarded database is emptied and handed out again: as good as new, and
    far cheaper than CREATE DATABASE for each Hypothesis example)."""
    opened, made, spare = [], [], []
    server = request.getfixturevalue("pg_server") if backend == "postgres" else None

    def open_new(target: str | None = None, **options):
        if target is None:
            if spare:
                target = spare.pop()
            else:
                target = (server.create_database() if server else
                          str(tmp_path / f"engine-{len(made) + 1}.db"))
                made.append(target)
        if server:
            options.setdefault("lease_clock", "caller")
        options.setdefault("synchronous", "NORMAL")
        store = open_store(target, **options)
        opened.append(store)
        return store

    def discard(store) -> None:
        if server and store.target in made:
            with store.write() as conn:
                conn.execute("TRUNCATE job, step_result, outbox, spend RESTART IDENTITY")
            spare.append(store.target)
        store.close()
        opened.remove(store)
        if not server and store.target in made:
            made.remove(store.target)
            for suffix in ("", "-wal", "-shm"):
                Path(store.target + suffix).unlink(missing_ok=True)

    open_new.targets, open_new.discard = made, discard
    try:
        yield open_new
    finally:
        for store in opened:
            store.close()
        for url in made if server else ():
            server.drop_database(url)


@pytest.fixture
def db_target(backend, db_path, request):
    """The test's database as `--db` takes it: the SQLite file, or a PostgreSQL URL."""
    if backend == "sqlite":
        yield db_path
        return
    server = request.getfixturevalue("pg_server")
    url = server.create_database()
    try:
        yield url
    finally:
        server.drop_database(url)


@pytest.fixture
def db_path(tmp_path):
    return str(tmp_path / "engine.db")


@pytest.fixture
def store(backend, db_target, new_store, clock):
    """The test's store; its lock waits are measured on the test's clock, so that a lease
    written without a wait runs from exactly the time the test gave."""
    s = new_store(db_target)
    s.wait_clock = clock
    return s


@pytest.fixture
def clock():
    return ManualClock()


@pytest.fixture
def config(db_path):
    """Instant steps, no heartbeat thread: fast deterministic in-process runs."""
    return load_config(env={}, overrides={"db": db_path, "steps": "instant", "heartbeat": False,
                                          "call_timeout": 1.0, "lease": 5.0,
                                          "synchronous": "NORMAL", "seed": 7})


@pytest.fixture
def pipeline():
    return DOCUMENT
