"""The mutants' SQL: a statement of the reference store rewritten as it runs (`SQLEdit`), and
each SQL-edit mutant's edits per backend (`sql_edits`), the same guard removed from SQLite's
statement and from PostgreSQL's.

An edit names its statement by how it starts. A statement that starts so but no longer holds
the text an edit removes raises `MutantOutOfDate` when it runs; a statement the store keeps as
a constant (PostgreSQL's two claims) is checked when the patch is applied; and a test drives
each backend's store through every statement an edit names, so that an edit whose statement
changed its start fails there rather than leaving the reference engine under a mutant's name.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterable

Params = tuple


class MutantOutOfDate(RuntimeError):
    """The engine's code no longer has the guard a patch removes: update the patch."""


@dataclasses.dataclass(frozen=True)
class SQLEdit:
    """Replace `old` by `new` in every statement that starts with `statement`.

    A removed guard takes its `?` parameters with it (`new` has no `?`); otherwise `new` must
    keep the same number of `?` so the parameters line up unchanged. Named parameters
    (PostgreSQL's `%(name)s`) stay as they are: one the edited statement no longer names is
    unused. `before`: a statement run first, with the same named parameters (SQLite's
    REPLACE deletes the conflicting row before it inserts; PostgreSQL spells that as two
    statements).
    """

    statement: str
    old: str
    new: str = ""
    before: str = ""

    def __post_init__(self) -> None:
        if self.new.count("?") not in (0, self.old.count("?")):
            raise ValueError(f"SQLEdit {self.old!r} -> {self.new!r}: drop every '?' or keep all")

    def __call__(self, sql: str, params: Params) -> tuple[str, Params]:
        if not sql.startswith(self.statement):
            return sql, params
        at = sql.find(self.old)
        if at < 0:
            raise MutantOutOfDate(f"statement {self.statement!r}... no longer contains "
                                  f"{self.old!r}: {sql}")
        sql = sql[:at] + self.new + sql[at + len(self.old):]
        if self.new.count("?") == 0 and self.old.count("?") and not isinstance(params, dict):
            first = sql[:at].count("?")
            params = tuple(params[:first]) + tuple(params[first + self.old.count("?"):])
        return sql, params


    def require(self, sql: str) -> None:
        """Raise MutantOutOfDate unless this edit changes `sql` (a statement the store keeps
        as a constant, checked when the patch is applied rather than when it first runs)."""
        if not sql.startswith(self.statement) or self.old not in sql:
            raise MutantOutOfDate(f"the store's statement no longer reads {self.statement!r}"
                                  f"... {self.old!r}: {sql}")


class EditingConnection:
    """A database connection (sqlite3 or psycopg) whose `execute` applies SQL edits;
    everything else passes through."""

    def __init__(self, conn: Any, edits: Iterable[SQLEdit]) -> None:
        self._conn, self._edits = conn, tuple(edits)

    def execute(self, sql: str, params: Params | dict = ()) -> Any:
        for edit in self._edits:
            if edit.before and sql.startswith(edit.statement):
                self._conn.execute(edit.before, params)
            sql, params = edit(sql, params)
        return self._conn.execute(sql, params)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


def edit_sql(store: type, edits: Iterable[SQLEdit]) -> None:
    """Every `store` (a store class) this process opens from now on runs its SQL through
    `edits`, on every connection it makes (PostgreSQL's reconnects too)."""
    edits = tuple(edits)
    for edit in edits:
        constant = CONSTANTS.get((store.backend, edit.statement))
        if constant is not None:
            edit.require(constant())
    original = store._connect
    store._connect = lambda self, *a, **k: EditingConnection(original(self, *a, **k), edits)


def edit_store_sql(store: Any, edits: Iterable[SQLEdit]) -> None:
    """This one open store runs its SQL through `edits`, on every connection it makes."""
    edits = tuple(edits)
    store.conn = EditingConnection(store.conn, edits)
    connect = store._connect
    store._connect = lambda *a, **k: EditingConnection(connect(*a, **k), edits)


# -- the reference's statements, by how they start ---------------------------------------------

# SQLite (engine/store/sqlite.py)
COMPLETE = "UPDATE job SET state=?, result=COALESCE(?, result)"
CONTINUE = "UPDATE job SET state=?, claims=1,"
FAIL = "UPDATE job SET state=?, attempts=attempts+1"
HEARTBEAT = "UPDATE job SET lease_until=MAX(lease_until, ?),"
CLAIM_PICK = "SELECT id, state, claims, attempts FROM job WHERE pipeline=?"
CLAIM_DUE = "SELECT 1 FROM job WHERE pipeline=?"
MEMO_INSERT = "INSERT OR IGNORE INTO step_result"
OUTBOX_DUE = "SELECT 1 FROM outbox WHERE sent_at IS NULL"
OUTBOX_PICK = "SELECT id, attempts FROM outbox WHERE sent_at IS NULL"
SUBMIT = "INSERT INTO job ("

# PostgreSQL (engine/store/postgres.py): named parameters, and `NOW` for the server's clock
PG_COMPLETE = "UPDATE job SET state=%(target)s, result=COALESCE(%(result)s, result),"
PG_CONTINUE = "UPDATE job SET state=%(working)s, claims=1,"
PG_FAIL = "UPDATE job SET state=%(target)s, attempts=attempts+1,"
PG_HEARTBEAT = "UPDATE job SET lease_until=GREATEST(lease_until,"
PG_MEMO_INSERT = "INSERT INTO step_result (job_id, step, output, cost, at, worker,"
PG_SUBMIT = "INSERT INTO job (id, pipeline, state, payload,"
PG_CLAIM = "\nWITH due AS (\n  SELECT id, state, claims FROM job"
PG_OUTBOX_CLAIM = "\nWITH due AS (\n  SELECT id FROM outbox"


def _postgres_constant(name: str) -> Callable[[], str]:
    def read() -> str:
        from engine.store import postgres_claims
        return getattr(postgres_claims, name)
    return read


#: (backend, statement) -> the store's constant that statement is, checked at patch time.
CONSTANTS: dict[tuple[str, str], Callable[[], str]] = {
    ("postgres", PG_CLAIM): _postgres_constant("CLAIM_JOB"),
    ("postgres", PG_OUTBOX_CLAIM): _postgres_constant("CLAIM_OUTBOX"),
}


def sqlite_edits() -> dict[str, tuple[SQLEdit, ...]]:
    """Mutant name -> its edits of SQLite's statements."""
    live_job = "(next_run_at<=? OR lease_until>0)"
    live_row = "(next_attempt_at<=? OR lease_until>0)"
    return {
        "fail_fenced_by_id": (SQLEdit(FAIL, " AND lease_token=? AND state=?"),),
        "no_token_on_complete": (SQLEdit(COMPLETE, " AND lease_token=?"),
                                 SQLEdit(CONTINUE, " AND lease_token=?")),
        "heartbeat_ignores_rowcount": (SQLEdit(HEARTBEAT, " AND lease_token=?"),),
        "claim_steals_live_leases": (SQLEdit(CLAIM_DUE, "next_run_at<=?", live_job),
                                     SQLEdit(CLAIM_PICK, "next_run_at<=?", live_job)),
        "memo_last_writer_wins": (SQLEdit(MEMO_INSERT, "INSERT OR IGNORE", "INSERT OR REPLACE"),),
        "senders_without_claim": (SQLEdit(OUTBOX_DUE, "next_attempt_at<=?", live_row),
                                  SQLEdit(OUTBOX_PICK, "next_attempt_at<=?", live_row)),
        "claims_newest_first": (SQLEdit(CLAIM_PICK, "ORDER BY next_run_at LIMIT 1",
                                        "ORDER BY next_run_at DESC LIMIT 1"),),
        # the reference's submit with its insert turned into INSERT OR REPLACE
        "submit_replaces": (SQLEdit(SUBMIT, "INSERT INTO job", "INSERT OR REPLACE INTO job"),
                            SQLEdit("INSERT OR REPLACE INTO job (",
                                    " ON CONFLICT(id) DO NOTHING")),
    }


def postgres_edits() -> dict[str, tuple[SQLEdit, ...]]:
    """Mutant name -> its edits of PostgreSQL's statements: the same guard, in that dialect.
    SQLite's INSERT OR REPLACE deletes the row in the way, then inserts: here the delete runs
    first (`before`, which the audit sees as it is) and the insert loses its ON CONFLICT."""
    from engine.store.postgres import NOW
    token = " AND lease_token=%(token)s"
    return {
        "fail_fenced_by_id": (SQLEdit(PG_FAIL, token + " AND state=%(working)s"),),
        "no_token_on_complete": (SQLEdit(PG_COMPLETE, token), SQLEdit(PG_CONTINUE, token)),
        "heartbeat_ignores_rowcount": (SQLEdit(PG_HEARTBEAT, token),),
        # the lease's end written as it was (next_run_at first: the statement's start stays)
        "heartbeat_keeps_deadline": (
            SQLEdit(PG_HEARTBEAT, f"GREATEST(next_run_at, {NOW} + %(lease)s)", "next_run_at"),
            SQLEdit(PG_HEARTBEAT, f"GREATEST(lease_until, {NOW} + %(lease)s)", "lease_until")),
        "claim_steals_live_leases": (SQLEdit(PG_CLAIM, f"next_run_at <= {NOW}",
                                             f"(next_run_at <= {NOW} OR lease_until > 0)"),),
        "memo_last_writer_wins": (SQLEdit(
            PG_MEMO_INSERT, " ON CONFLICT (job_id, step) DO NOTHING",
            before="DELETE FROM step_result WHERE job_id=%(job)s AND step=%(step)s"),),
        "senders_without_claim": (SQLEdit(
            PG_OUTBOX_CLAIM, f"next_attempt_at <= {NOW}",
            f"(next_attempt_at <= {NOW} OR lease_until > 0)"),),
        "claims_newest_first": (SQLEdit(PG_CLAIM, "ORDER BY next_run_at LIMIT 1",
                                        "ORDER BY next_run_at DESC LIMIT 1"),),
        "submit_replaces": (SQLEdit(PG_SUBMIT, " ON CONFLICT (id) DO NOTHING",
                                    before="DELETE FROM job WHERE id=%(id)s"),),
    }


def sql_edits(backend: str) -> dict[str, tuple[SQLEdit, ...]]:
    """Mutant name -> its SQL edits on `backend` ("sqlite" or "postgres")."""
    return sqlite_edits() if backend == "sqlite" else postgres_edits()
