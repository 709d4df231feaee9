"""Fixtures shared by the unit tests."""
from __future__ import annotations

from contextlib import contextmanager

import pytest


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
