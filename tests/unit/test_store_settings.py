"""The reference engine on other SQLite store settings (the power-loss settings table): what
each pair promises, and the engine's PRAGMAs rewritten to them in its processes."""
from __future__ import annotations

import sqlite3

import pytest

from chaos.contract import validate
from chaos.reference.store_settings import StoreSettingsEngine, promised, rewriting


@pytest.mark.parametrize("sync, journal, durable", [
    ("FULL", "WAL", True), ("EXTRA", "WAL", True), ("NORMAL", "WAL", False),
    ("OFF", "WAL", False), ("EXTRA", "DELETE", True), ("FULL", "DELETE", False),
    ("NORMAL", "DELETE", False), ("OFF", "DELETE", False)])
def test_what_each_setting_promises(sync, journal, durable):
    assert promised(sync, journal) is durable
    engine = validate(StoreSettingsEngine(sync, journal))
    assert engine.durability({}) == (durable, f"synchronous={sync}, journal_mode={journal}")


def test_the_engine_s_pragmas_are_rewritten_and_the_install_sets_the_journal(tmp_path):
    conn = sqlite3.connect(str(tmp_path / "a.db"), factory=rewriting("OFF", "DELETE"))
    assert conn.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "delete"
    conn.execute("PRAGMA synchronous=FULL")
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 0  # OFF
    conn.close()
    db = str(tmp_path / "engine.db")
    StoreSettingsEngine("EXTRA", "DELETE").install(db)
    assert sqlite3.connect(db).execute("PRAGMA journal_mode").fetchone()[0] == "delete"


def test_an_unknown_setting_is_refused():
    with pytest.raises(ValueError, match="synchronous must be one of"):
        StoreSettingsEngine("SOMETIMES", "WAL")
