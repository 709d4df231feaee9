"""Shared fixtures: a fresh engine database file per test, and a clock that only moves when told."""
from __future__ import annotations

import pytest

from engine import DOCUMENT, ManualClock, load_config, open_store


@pytest.fixture
def db_path(tmp_path):
    return str(tmp_path / "engine.db")


@pytest.fixture
def store(db_path, clock):
    """The test's store; its lock waits are measured on the test's clock, so that a lease
    written without a wait runs from exactly the time the test gave."""
    s = open_store(db_path, synchronous="NORMAL")
    s.wait_clock = clock
    yield s
    s.close()


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
