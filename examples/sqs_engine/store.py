"""The SQS engine's store: all of its SQL. A `job` row per job (its state, its memo as JSON,
and who made its last write under which receipt), a `task` row per step to be done (the
queue's message: visible from `visible_at`, held by whoever received it last under a random
`receipt`), and an `outbox` row per effect, received and marked the same way.

Every write is one `BEGIN IMMEDIATE` transaction; every write a holder makes is fenced by its
receipt and row-counted. As in SQS, a receipt stays valid after the visibility timeout
until another worker receives the task (which writes a new receipt).
"""
from __future__ import annotations

import hashlib
import json
import sqlite3
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

#: (step, ready state, working state, done state, calls the model)
STEPS = (("draft", "waiting", "drafting", "drafted", True),
         ("post", "drafted", "posting", "posted", False))
INITIAL = "waiting"
PARKED = "dead"
TERMINAL = ("posted", "cancelled")
STATES = ("waiting", "drafting", "drafted", "posting", "posted", PARKED, "cancelled")
EFFECT_KIND = "notice"

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS job (id TEXT PRIMARY KEY, state TEXT NOT NULL,"
    " payload TEXT NOT NULL, payload_hash TEXT NOT NULL, memo TEXT NOT NULL DEFAULT '{}',"
    " step TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,"
    " receives INTEGER NOT NULL DEFAULT 0, error TEXT, cause TEXT,"
    " write TEXT NOT NULL, actor TEXT NOT NULL, writer TEXT, receipt TEXT,"
    " lease_until REAL, next_run_at REAL)",
    "CREATE TABLE IF NOT EXISTS task (id INTEGER PRIMARY KEY, job TEXT NOT NULL,"
    " step TEXT NOT NULL, visible_at REAL NOT NULL, receipt TEXT, holder TEXT,"
    " receives INTEGER NOT NULL DEFAULT 0, attempts INTEGER NOT NULL DEFAULT 0,"
    " beats INTEGER NOT NULL DEFAULT 0, beat_by TEXT, beat_receipt TEXT, moved_by TEXT,"
    " UNIQUE (job, step))",
    "CREATE INDEX IF NOT EXISTS task_visible ON task (visible_at)",
    "CREATE TABLE IF NOT EXISTS outbox (id INTEGER PRIMARY KEY, job TEXT NOT NULL,"
    " kind TEXT NOT NULL, key TEXT NOT NULL, body TEXT NOT NULL, visible_at REAL NOT NULL,"
    " receipt TEXT, holder TEXT, receives INTEGER NOT NULL DEFAULT 0, sent_at REAL,"
    " dead_at REAL, error TEXT, writer TEXT, write TEXT NOT NULL, UNIQUE (job, kind))",
    "CREATE INDEX IF NOT EXISTS outbox_visible ON outbox (visible_at) WHERE sent_at IS NULL"
    " AND dead_at IS NULL",
)


def connect(path: str, busy_timeout: float = 10.0) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit), WAL, synchronous FULL."""
    conn = sqlite3.connect(path, timeout=busy_timeout, isolation_level=None)
    conn.execute(f"PRAGMA busy_timeout={int(busy_timeout * 1000)}")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    return conn


def init(conn: sqlite3.Connection) -> None:
    with write(conn):
        for statement in SCHEMA:
            conn.execute(statement)


@contextmanager
def write(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """The one write transaction: BEGIN IMMEDIATE, rolled back on any exception."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


class Lost(Exception):
    """A holder's write found its receipt no longer the task's: another worker received it
    (or an operator removed it). The transaction is rolled back; nothing was written."""


def new_receipt(rng) -> str:
    """A receipt handle from the random source `rng`: it names one receive and says nothing
    more (no order)."""
    return f"{rng.getrandbits(64):016x}"


def canonical(value: Any) -> str:
    """The one JSON spelling of a payload. Raises ValueError for what JSON cannot hold."""
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"payload is not JSON: {exc}") from None


def fingerprint(text: str) -> str:
    return f"{len(text)}:{text[:40]}:{text[-40:]}"


def idempotency_key(job: str, kind: str) -> str:
    return "sqs-" + hashlib.sha256(f"{job}\x00{kind}".encode()).hexdigest()[:32]


def step_named(name: str) -> tuple[str, str, str, str, bool]:
    return next(s for s in STEPS if s[0] == name)


def next_step(name: str) -> tuple[str, str, str, str, bool] | None:
    i = [s[0] for s in STEPS].index(name)
    return STEPS[i + 1] if i + 1 < len(STEPS) else None


# -- jobs and their tasks ------------------------------------------------------------------

def submit(conn: sqlite3.Connection, job: str, payload: Any, now: float) -> str:
    """Submit idempotently on `job`: "created" (with the first step's task), "exists" (same
    payload) or "rejected" (another payload; the stored job untouched)."""
    text = canonical(payload)
    with write(conn):
        row = conn.execute("SELECT payload FROM job WHERE id=?", (job,)).fetchone()
        if row is None:
            conn.execute("INSERT INTO job (id, state, payload, payload_hash, step, write, actor,"
                         " writer) VALUES (?, ?, ?, ?, ?, 'submit', 'submitter', 'submitter')",
                         (job, INITIAL, text, fingerprint(text), STEPS[0][0]))
            conn.execute("INSERT INTO task (job, step, visible_at) VALUES (?, ?, ?)",
                         (job, STEPS[0][0], now))
            return "created"
    return "exists" if row[0] == text else "rejected"


@dataclass(frozen=True)
class Received:
    """One task as its receiver holds it."""

    task: int
    job: str
    step: str
    receipt: str
    visible_until: float
    receives: int
    attempts: int
    payload: Any
    memo: dict


def receive(conn: sqlite3.Connection, worker: str, now: float, visibility: float,
            max_receives: int, fresh: str) -> Received | None:
    """Receive the visible task that has waited longest, under a new receipt; a task received
    `max_receives` times already is dead-lettered instead (its job parked) and the next one
    tried. `fresh` is the new receipt handle. None when no task is visible."""
    with write(conn):
        for task, job, step, receipt, receives, attempts in conn.execute(
                "SELECT id, job, step, receipt, receives, attempts FROM task"
                " WHERE visible_at <= ? ORDER BY visible_at, id", (now,)).fetchall():
            if receives >= max_receives:
                _dead_letter(conn, task, job, worker, None,
                             f"crash loop: task {step} received {receives} times", "crash_loop")
                continue
            n = conn.execute("UPDATE task SET receipt=?, holder=?, visible_at=?,"
                             " receives=receives+1, moved_by=NULL WHERE id=? AND receipt IS ?"
                             " AND visible_at <= ?",
                             (fresh, worker, now + visibility, task, receipt, now)).rowcount
            if n != 1:
                continue
            working = step_named(step)[2]
            conn.execute("UPDATE job SET state=?, step=?, receives=?, attempts=?, write='receive',"
                         " actor='worker', writer=?, receipt=?, lease_until=?, next_run_at=NULL"
                         " WHERE id=?", (working, step, receives + 1, attempts, worker, fresh,
                                         now + visibility, job))
            payload, memo = conn.execute("SELECT payload, memo FROM job WHERE id=?",
                                         (job,)).fetchone()
            return Received(task, job, step, fresh, now + visibility, receives + 1, attempts,
                            json.loads(payload), json.loads(memo))
    return None


def _dead_letter(conn, task: int, job: str, writer: str, receipt: str | None, error: str,
                 cause: str) -> None:
    conn.execute("DELETE FROM task WHERE id=?", (task,))
    conn.execute("UPDATE job SET state=?, error=?, cause=?, write='park', actor='worker',"
                 " writer=?, receipt=?, lease_until=NULL, next_run_at=NULL WHERE id=?",
                 (PARKED, error, cause, writer, receipt, job))


def extend(conn: sqlite3.Connection, held: Received, worker: str, until: float) -> bool:
    """The heartbeat (ChangeMessageVisibility): the task stays invisible until `until`, only
    while `held`'s receipt is still the task's; False when it is not."""
    with write(conn):
        return conn.execute("UPDATE task SET visible_at=?, beats=beats+1, beat_by=?,"
                            " beat_receipt=? WHERE id=? AND receipt=?",
                            (until, worker, held.receipt, held.task, held.receipt)).rowcount == 1


def delete_task(conn: sqlite3.Connection, held: Received) -> None:
    """DeleteMessage: remove the held task, only under its receipt. Raises Lost."""
    if conn.execute("DELETE FROM task WHERE id=? AND receipt=?",
                    (held.task, held.receipt)).rowcount != 1:
        raise Lost(f"task {held.step} of {held.job} was received by another worker")


def complete(conn: sqlite3.Connection, held: Received, worker: str, now: float,
             output: Any = None, cost: float = 0.0, effects: tuple[dict, ...] = ()) -> None:
    """The step is done, in one transaction: its task deleted under its receipt, its output
    memoized in the job row (first writer wins), its effects queued, the job moved to the
    step's done state and the next step's task queued. Raises Lost (nothing written)."""
    with write(conn):
        delete_task(conn, held)
        finish_job(conn, held, worker, now, output, cost, effects)


def finish_job(conn, held: Received, worker: str, now: float, output: Any, cost: float,
               effects: tuple[dict, ...]) -> None:
    """The job's part of a completion (inside the caller's transaction)."""
    _, _, working, done, _ = step_named(held.step)
    memo = json.loads(conn.execute("SELECT memo FROM job WHERE id=?", (held.job,)).fetchone()[0])
    if output is not None and held.step not in memo:
        memo[held.step] = {"output": output, "cost": cost, "by": worker, "at": now}
    following = next_step(held.step)
    n = conn.execute("UPDATE job SET state=?, memo=?, step=?, attempts=0, receives=0,"
                     " error=NULL, cause=NULL, write='complete', actor='worker', writer=?,"
                     " receipt=?, lease_until=NULL, next_run_at=NULL WHERE id=? AND state=?",
                     (done, json.dumps(memo, sort_keys=True),
                      following[0] if following else held.step, worker, held.receipt,
                      held.job, working)).rowcount
    if n != 1:
        raise Lost(f"job {held.job} is no longer {working}")
    queue_effects(conn, held, worker, now, effects)
    if following is not None:
        conn.execute("INSERT INTO task (job, step, visible_at) VALUES (?, ?, ?)",
                     (held.job, following[0], now))


def queue_effects(conn, held: Received, worker: str, now: float,
                  effects: tuple[dict, ...]) -> None:
    for effect in effects:
        conn.execute("INSERT OR IGNORE INTO outbox (job, kind, key, body, visible_at, writer,"
                     " write) VALUES (?, ?, ?, ?, ?, ?, 'queue')",
                     (held.job, effect["kind"], idempotency_key(held.job, effect["kind"]),
                      json.dumps(effect, sort_keys=True), now, worker))


def fail(conn: sqlite3.Connection, held: Received, worker: str, now: float, error: str,
         wait: float | None, cause: str = "attempts") -> None:
    """A failed attempt, under the receipt: the task visible again after `wait`, or, with
    `wait` None, dead-lettered and the job parked with `cause`. Raises Lost."""
    ready = step_named(held.step)[1]
    with write(conn):
        if wait is None:
            delete_task(conn, held)
            state, until = PARKED, None
        else:
            if conn.execute("UPDATE task SET visible_at=?, attempts=attempts+1 WHERE id=?"
                            " AND receipt=?", (now + wait, held.task, held.receipt)
                            ).rowcount != 1:
                raise Lost(f"task {held.step} of {held.job} was received by another worker")
            state, until, cause = ready, now + wait, None
        conn.execute("UPDATE job SET state=?, attempts=attempts+1, error=?, cause=?,"
                     " write='fail', actor='worker', writer=?, receipt=?, lease_until=NULL,"
                     " next_run_at=? WHERE id=?",
                     (state, error[:300], cause, worker, held.receipt, until, held.job))


# -- the outbox ----------------------------------------------------------------------------

@dataclass(frozen=True)
class HeldEffect:
    row: int
    job: str
    kind: str
    key: str
    body: dict
    receipt: str
    receives: int


def receive_effect(conn: sqlite3.Connection, sender: str, now: float, visibility: float,
                   fresh: str) -> HeldEffect | None:
    """Receive the unsent effect that has waited longest, under the new receipt `fresh`."""
    with write(conn):
        row = conn.execute("SELECT id, job, kind, key, body, receipt, receives FROM outbox"
                           " WHERE sent_at IS NULL AND dead_at IS NULL AND visible_at <= ?"
                           " ORDER BY visible_at, id LIMIT 1", (now,)).fetchone()
        if row is None:
            return None
        conn.execute("UPDATE outbox SET receipt=?, holder=?, visible_at=?, receives=receives+1,"
                     " writer=?, write='receive' WHERE id=?",
                     (fresh, sender, now + visibility, sender, row[0]))
        return HeldEffect(row[0], row[1], row[2], row[3], json.loads(row[4]), fresh, row[6] + 1)


def settle_effect(conn: sqlite3.Connection, held: HeldEffect, sender: str, *,
                  sent_at: float | None = None, dead_at: float | None = None,
                  visible_at: float | None = None, error: str | None = None) -> bool:
    """Write a send's outcome (sent, dead-lettered, or visible again at `visible_at`), only
    under the sender's receipt; False when another sender has received the row since."""
    with write(conn):
        return conn.execute(
            "UPDATE outbox SET sent_at=?, dead_at=?, visible_at=COALESCE(?, visible_at),"
            " error=?, writer=?, write='settle' WHERE id=? AND receipt=? AND sent_at IS NULL",
            (sent_at, dead_at, visible_at, error, sender, held.row, held.receipt)).rowcount == 1


# -- the controls' writes --------------------------------------------------------------------

def expire(conn: sqlite3.Connection, now: float) -> int:
    """Every held task and effect becomes visible now (its holder keeps its receipt until
    another receives it, as SQS's visibility timeout does); how many."""
    with write(conn):
        n = conn.execute("UPDATE task SET visible_at=?, moved_by='harness' WHERE receipt IS NOT"
                         " NULL AND visible_at > ? AND job IN (SELECT id FROM job WHERE state IN"
                         " (?, ?))", (now - 0.001, now, STEPS[0][2], STEPS[1][2])).rowcount
        n += conn.execute("UPDATE outbox SET visible_at=?, writer='harness', write='expire'"
                          " WHERE receipt IS NOT NULL AND visible_at > ? AND sent_at IS NULL"
                          " AND dead_at IS NULL", (now - 0.001, now)).rowcount
    return n


def operate(conn: sqlite3.Connection, action: str, job: str, now: float) -> str:
    """cancel (any unfinished job) or requeue (a parked one, at its step with a fresh task):
    "done" or "refused: why"."""
    with write(conn):
        row = conn.execute("SELECT state, step FROM job WHERE id=?", (job,)).fetchone()
        if row is None:
            return f"refused: no job {job!r}"
        state, step = row
        if action == "cancel":
            if state in TERMINAL:
                return f"refused: job is {state}"
            conn.execute("DELETE FROM task WHERE job=?", (job,))
            to = "cancelled"
        elif action == "requeue":
            if state != PARKED:
                return f"refused: job is {state}, not {PARKED}"
            conn.execute("INSERT OR REPLACE INTO task (job, step, visible_at) VALUES (?, ?, ?)",
                         (job, step, now))
            to = step_named(step)[1]
        else:
            return f"refused: unknown action {action!r} (known: cancel, requeue)"
        conn.execute("UPDATE job SET state=?, attempts=0, receives=0, error=NULL, cause=NULL,"
                     " write='operator', actor='operator', writer='operator', receipt=NULL,"
                     " lease_until=NULL, next_run_at=NULL WHERE id=?", (to, job))
    return "done"


def integrity(conn: sqlite3.Connection) -> list[str]:
    problems = [r[0] for r in conn.execute("PRAGMA integrity_check") if r[0] != "ok"]
    problems += [f"job {j}: unknown state {s!r}" for j, s in
                 conn.execute("SELECT id, state FROM job") if s not in STATES]
    return problems
