"""Fixtures shared by the unit tests."""
from __future__ import annotations

from contextlib import contextmanager

import pytest


@pytest.fixture
def url(pg_server):
    """A new database on the tests' PostgreSQL server (a copy of the migrated template),
    dropped after the test."""
    made = pg_server.create_database()
    yield made
    pg_server.drop_database(made)


@pytest.fixture
def commits(store, monkeypatch):
    """The number of write transactions the store commits from now on."""
    count = []
    original = store.write

    @contextmanager
    def counted():
        with original() as conn:
            yield conn
        count.append(1)

    monkeypatch.setattr(store, "write", counted)
    return count
