"""The reference engine on SQLite store settings it does not offer itself, for the power-loss
settings table (bench/power_loss.py): `synchronous` OFF, NORMAL, FULL or EXTRA, with the
journal in WAL or rollback (DELETE) mode.

The engine's own settings are synchronous FULL (the default) or NORMAL, in WAL mode. Here
its processes run as `python -m chaos.reference.store_settings SYNC JOURNAL ROLE flags...`:
every SQLite connection the process opens has the engine's `PRAGMA synchronous=...` and
`PRAGMA journal_mode=WAL` rewritten to these (nothing else of the engine changes), and
`install` puts the database file in the journal mode before any process opens it.

`durability` declares what SQLite's documentation promises for each pair: in WAL mode a
commit is durable at FULL and EXTRA (the log is fsynced at every commit); at NORMAL only at
a checkpoint, and at OFF never. In rollback mode a commit is the journal's deletion, made
durable only by EXTRA's fsync of the directory: at FULL the last commit may roll back after
a power cut (the journal comes back), at NORMAL and OFF more may be lost.
"""
from __future__ import annotations

import sqlite3
import sys
from typing import Any

from chaos.contract import Command, ProcessContext
from chaos.reference.adapter import ReferenceEngine

SYNCHRONOUS = ("OFF", "NORMAL", "FULL", "EXTRA")
JOURNALS = ("WAL", "DELETE")


def promised(synchronous: str, journal: str) -> bool:
    """Whether SQLite promises that a commit survives a power cut (see the module text)."""
    return synchronous in (("FULL", "EXTRA") if journal == "WAL" else ("EXTRA",))


class StoreSettingsEngine(ReferenceEngine):
    """The reference engine whose processes run with these SQLite store settings."""

    def __init__(self, synchronous: str = "FULL", journal: str = "WAL") -> None:
        super().__init__()
        if synchronous not in SYNCHRONOUS or journal not in JOURNALS:
            raise ValueError(f"synchronous must be one of {SYNCHRONOUS} and journal one of "
                             f"{JOURNALS}, got {synchronous!r}, {journal!r}")
        self.synchronous, self.journal = synchronous, journal
        self.name = f"reference[synchronous={synchronous},journal_mode={journal}]"
        self.backends = ("sqlite",)

    def command(self, role: str, ctx: ProcessContext) -> Command:
        command = ReferenceEngine.command(self, role, ctx)
        module_end = command.argv.index(self.module) + 1
        return Command([sys.executable, "-m", __name__, self.synchronous, self.journal,
                        *command.argv[module_end:]], command.env)

    def install(self, db: str) -> None:
        super().install(db)
        conn = sqlite3.connect(db)
        try:
            mode = conn.execute(f"PRAGMA journal_mode={self.journal}").fetchone()[0]
        finally:
            conn.close()
        if mode.upper() != self.journal:
            raise RuntimeError(f"{db}: journal_mode stayed {mode!r}, not {self.journal}")

    def durability(self, table: dict[str, Any]) -> tuple[bool, str]:
        return (promised(self.synchronous, self.journal),
                f"synchronous={self.synchronous}, journal_mode={self.journal}")


def rewriting(synchronous: str, journal: str) -> type:
    """A sqlite3.Connection whose PRAGMA synchronous and journal_mode say these."""
    class Rewriting(sqlite3.Connection):
        def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
            text = sql.strip().upper()
            if text.startswith("PRAGMA SYNCHRONOUS="):
                sql = f"PRAGMA synchronous={synchronous}"
            elif text.startswith("PRAGMA JOURNAL_MODE="):
                sql = f"PRAGMA journal_mode={journal}"
            return super().execute(sql, *args)
    return Rewriting


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[0] not in SYNCHRONOUS or argv[1] not in JOURNALS:
        print(f"usage: python -m {__name__} SYNCHRONOUS JOURNAL ROLE [flags...]; SYNCHRONOUS "
              f"one of {', '.join(SYNCHRONOUS)}, JOURNAL one of {', '.join(JOURNALS)}",
              file=sys.stderr)
        return 2
    factory, connect = rewriting(argv[0], argv[1]), sqlite3.connect

    def connect_rewriting(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        kwargs.setdefault("factory", factory)
        return connect(*args, **kwargs)

    sqlite3.connect = connect_rewriting  # this process's connections, the engine's included
    from engine.cli import main as engine_main
    return engine_main(argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
