"""The design article's engine as published: its state table, schema, lease, claim, heartbeat,
backoff, fail_step, transition and run_once, kept as the article wrote them.

Only where the article is silent is anything added, each marked "completion" below: the steps
behind STEP_FOR_STATE, TERMINAL_FOR, the settings a test run needs (`configure`), crash points,
a heartbeat thread, and the worker loop. What the article gets wrong stays wrong on purpose: the
claim never moves a job into its working state, so the success UPDATE writes `pending ->
fetched`, which is not an edge of STATES; `fail_step` updates by id alone; the memo-hit path
asserts an edge that does not exist. A harness has to catch these, so they are not fixed here.
The `--claim-moves` variant (`claim_moving`) is the article's intended fix done naively.
"""
from __future__ import annotations

import json
import logging
import os
import random
import socket
import sqlite3
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

from chaos import probe

from . import calls

log = logging.getLogger("article_engine")

# -- the state machine, as the article writes it ---------------------------------------------

STATES = {
    "pending":    ["fetching", "cancelled"],
    "fetching":   ["fetched", "failed_fetch", "pending"],       # -> pending = retry
    "fetched":    ["extracting"],
    "extracting": ["extracted", "failed_extract", "fetched"],
    "extracted":  ["verifying"],
    "verifying":  ["verified", "needs_human", "extracted"],
    "verified":   ["delivering"],
    "delivering": ["delivered", "failed_deliver", "verified"],
    "delivered":  [],                       # terminal
    "needs_human": ["extracted", "cancelled"],
    "cancelled":  [],                       # terminal
    "failed_fetch":   ["pending"],          # terminal until a human requeues
    "failed_extract": ["fetched"],
    "failed_deliver": ["verified"],
}

SCHEMA = """
CREATE TABLE job (
  id          TEXT PRIMARY KEY,          -- caller-supplied idempotency key
  state       TEXT NOT NULL,
  payload     TEXT NOT NULL,             -- JSON input
  result      TEXT,                      -- JSON accumulated output
  attempts    INTEGER NOT NULL DEFAULT 0,
  next_run_at REAL NOT NULL DEFAULT 0,
  lease_until REAL NOT NULL DEFAULT 0,
  lease_owner TEXT,
  last_error  TEXT,
  created     REAL NOT NULL,
  updated     REAL NOT NULL
);
CREATE INDEX job_ready ON job(state, next_run_at);

CREATE TABLE step_result (                -- the memo table: never redo work
  job_id  TEXT NOT NULL,
  step    TEXT NOT NULL,
  output  TEXT NOT NULL,
  cost    REAL NOT NULL DEFAULT 0,
  at      REAL NOT NULL,
  PRIMARY KEY (job_id, step)
);

CREATE TABLE outbox (                     -- side effects, exactly once
  id       INTEGER PRIMARY KEY,
  job_id   TEXT NOT NULL,
  kind     TEXT NOT NULL,
  payload  TEXT NOT NULL,
  sent_at  REAL,
  attempts INTEGER NOT NULL DEFAULT 0,
  UNIQUE (job_id, kind)
);
"""

#: Submitting the same id twice is a no-op (completion: the article describes, not writes, it).
SUBMIT_SQL = ("INSERT OR IGNORE INTO job (id, state, payload, created, updated) "
              "VALUES (?, 'pending', ?, ?, ?)")



def canonical(payload: Any) -> str:
    """The one JSON spelling a payload is stored in (completion), so that the same payload
    submitted twice is the same text. Raises ValueError for what JSON cannot hold."""
    try:
        return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"payload is not JSON: {exc}") from None


WORKER = socket.gethostname() + ":" + str(os.getpid())
LEASE_SECONDS = 120

RETRYABLE = calls.RETRYABLE_ERRORS      # (TimeoutError, ConnectionError) plus HTTP 429, 5xx
MAX_ATTEMPTS = 5

# -- completion: the settings a short test run needs, and the machine's clock ------------------

BACKOFF_BASE = 1.0       # the article's 1.0 and 32.0, scaled so a test run can be short
BACKOFF_CAP = 32.0
CLOCK_SKEW = 0.0         # a machine whose clock is off reads time.time() off by this much
HEARTBEAT = True
HEARTBEAT_EVERY = LEASE_SECONDS / 3.0
BUSY_TIMEOUT = 5.0       # sqlite3.connect's default
DB_PATH = ""
PROVIDER = calls.Provider("http://127.0.0.1:8080/v1", "fake-model", 60.0)

#: Every crash point, in the order a job meets them (completion: the article has none).
POINTS = (
    "worker.after_claim",       # lease taken, nothing read yet
    "worker.memo_hit",          # memo found, about to transition
    "worker.before_call",       # about to call the provider (nothing billed yet)
    "worker.after_call",        # the call returned (billed), nothing written
    "worker.heartbeat",         # the heartbeat thread is about to extend the lease
    "worker.before_fail",       # the step failed, fail_step not yet run
    "worker.before_commit",     # inside the completion transaction (memo, outbox, state)
    "worker.after_commit",      # the step committed
    "sender.before_send",       # an unsent row read, not yet posted
    "sender.after_send",        # the receiver answered; sent_at not yet written
)
#: Where crash-looping jobs kill their worker: after the billed call, before any write.
CRASH_LOOP_POINT = "worker.after_call"


def now() -> float:
    """time.time() as this machine reads it (skewed by CLOCK_SKEW); the article's every
    `time.time()` is this call."""
    return time.time() + CLOCK_SKEW


def configure(*, db: str, lease: float = 120.0, max_attempts: int = 5,
              backoff_base: float = 1.0, backoff_cap: float = 32.0, clock_skew: float = 0.0,
              heartbeat: bool = True, heartbeat_interval: float | None = None,
              busy_timeout: float = 5.0, provider: calls.Provider | None = None,
              claim_moves: bool = False) -> None:
    """Set the module's settings (the article keeps them as module constants)."""
    global DB_PATH, LEASE_SECONDS, MAX_ATTEMPTS, BACKOFF_BASE, BACKOFF_CAP, CLOCK_SKEW
    global HEARTBEAT, HEARTBEAT_EVERY, BUSY_TIMEOUT, PROVIDER, claim
    DB_PATH, LEASE_SECONDS, MAX_ATTEMPTS = db, lease, max_attempts
    BACKOFF_BASE, BACKOFF_CAP, CLOCK_SKEW = backoff_base, backoff_cap, clock_skew
    HEARTBEAT, HEARTBEAT_EVERY = heartbeat, heartbeat_interval or lease / 3.0
    BUSY_TIMEOUT = busy_timeout
    PROVIDER = provider or PROVIDER
    # run_once calls `claim` by name, as the article's does; the variant rebinds the name.
    claim = claim_moving if claim_moves else claim_as_published


def connect(db: str | None = None) -> sqlite3.Connection:
    """A connection as the article's code expects one: Python's default transaction handling
    (an implicit BEGIN before each write, `conn.commit()` to end it)."""
    return sqlite3.connect(db or DB_PATH, timeout=BUSY_TIMEOUT)


def init_db(db: str) -> bool:
    """Create the article's schema in `db` (WAL, so readers do not block the writer); False
    when it was already there."""
    conn = sqlite3.connect(db, timeout=BUSY_TIMEOUT)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        if conn.execute("SELECT 1 FROM sqlite_master WHERE name='job'").fetchone():
            return False
        conn.executescript(SCHEMA)
        return True
    finally:
        conn.close()


# -- the article's code ------------------------------------------------------------------------

def transition(conn, job_id, frm, to):
    assert to in STATES[frm], "illegal transition " + frm + " -> " + to
    n = conn.execute(
        "UPDATE job SET state=?, updated=?, attempts=0 "
        "WHERE id=? AND state=?",       # <- the guard that makes it safe
        (to, now(), job_id, frm)).rowcount
    conn.commit()
    return n == 1                        # False: somebody else moved it first


def claim_as_published(conn):
    now_ = now()
    row = conn.execute(
        "SELECT id FROM job WHERE state NOT IN "
        "  ('delivered','cancelled','needs_human',"
        "   'failed_fetch','failed_extract','failed_deliver') "
        "AND next_run_at <= ? AND lease_until <= ? "
        "ORDER BY next_run_at LIMIT 1", (now_, now_)).fetchone()
    if not row:
        return None
    ok = conn.execute(
        "UPDATE job SET lease_until=?, lease_owner=? "
        "WHERE id=? AND lease_until<=?",
        (now_ + LEASE_SECONDS, WORKER, row[0], now_)).rowcount
    conn.commit()
    return row[0] if ok == 1 else None      # lost the race; try again


claim = claim_as_published


def heartbeat(conn, job_id):
    """Call inside long steps, or the lease expires mid-model-call."""
    conn.execute("UPDATE job SET lease_until=? WHERE id=? AND lease_owner=?",
                 (now() + LEASE_SECONDS, job_id, WORKER))
    conn.commit()


def backoff(attempt):
    """Exponential with full jitter: 1-2s, 1-4s, 1-8s, 1-16s, 1-32s (at base 1, cap 32)."""
    return random.uniform(BACKOFF_BASE, min(BACKOFF_CAP, BACKOFF_BASE * 2.0 ** attempt))


def fail_step(conn, job_id, state, exc, retryable):
    attempts = conn.execute(
        "SELECT attempts FROM job WHERE id=?", (job_id,)).fetchone()[0] + 1
    if retryable and attempts < MAX_ATTEMPTS:
        conn.execute(
            "UPDATE job SET attempts=?, next_run_at=?, last_error=?, "
            "lease_until=0 WHERE id=?",
            (attempts, now() + backoff(attempts), repr(exc)[:500], job_id))
    else:
        conn.execute(
            "UPDATE job SET state=?, last_error=?, lease_until=0 WHERE id=?",
            (TERMINAL_FOR[state], repr(exc)[:500], job_id))
    conn.commit()


def run_once(conn):
    job_id = claim(conn)
    if not job_id:
        return False
    probe.point("worker.after_claim", job_id)
    state, payload = conn.execute(
        "SELECT state, payload FROM job WHERE id=?", (job_id,)).fetchone()
    step = STEP_FOR_STATE[state]              # e.g. 'fetching' -> fetch_step

    memo = conn.execute(
        "SELECT output FROM step_result WHERE job_id=? AND step=?",
        (job_id, step.name)).fetchone()
    if memo:                                   # already done before the crash
        probe.point("worker.memo_hit", job_id)
        transition(conn, job_id, state, step.success_state)
        return True

    try:
        out, cost = step.run(json.loads(payload), conn, job_id)
    except Exception as e:
        probe.point("worker.before_fail", job_id)
        fail_step(conn, job_id, state, e, isinstance(e, RETRYABLE))
        return True

    with conn:                                 # one transaction
        conn.execute("INSERT OR IGNORE INTO step_result "
                     "(job_id, step, output, cost, at) VALUES (?,?,?,?,?)",
                     (job_id, step.name, json.dumps(out), cost, now()))
        for effect in step.effects(out):
            conn.execute("INSERT OR IGNORE INTO outbox "
                         "(job_id, kind, payload) VALUES (?,?,?)",
                         (job_id, effect["kind"], json.dumps(effect)))
        conn.execute("UPDATE job SET state=?, attempts=0, lease_until=0, "
                     "updated=? WHERE id=? AND state=?",
                     (step.success_state, now(), job_id, state))
        probe.point("worker.before_commit", job_id)
    probe.point("worker.after_commit", job_id)
    return True


# -- the variant: the article's intended fix, done naively --------------------------------------

#: The working state a claim moves a job into; a working state is resumed where it stands.
WORKING_FOR = {"pending": "fetching", "fetched": "extracting", "extracted": "verifying",
               "verified": "delivering", "fetching": "fetching", "extracting": "extracting",
               "verifying": "verifying", "delivering": "delivering"}


def claim_moving(conn):
    """The article's claim, but its UPDATE also moves the job into its working state. It is
    still guarded by lease_until alone, so a claim that read `pending` can win after another
    worker has finished the step (lease_until=0) and move `fetched` back to `fetching`."""
    now_ = now()
    row = conn.execute(
        "SELECT id, state FROM job WHERE state NOT IN "
        "  ('delivered','cancelled','needs_human',"
        "   'failed_fetch','failed_extract','failed_deliver') "
        "AND next_run_at <= ? AND lease_until <= ? "
        "ORDER BY next_run_at LIMIT 1", (now_, now_)).fetchone()
    if not row:
        return None
    ok = conn.execute(
        "UPDATE job SET lease_until=?, lease_owner=?, state=? "
        "WHERE id=? AND lease_until<=?",
        (now_ + LEASE_SECONDS, WORKER, WORKING_FOR[row[1]], row[0], now_)).rowcount
    conn.commit()
    return row[0] if ok == 1 else None


# -- completion: the steps behind STEP_FOR_STATE, and where each parks -------------------------

class NeedsReview(Exception):
    """The verify step's model flagged the document: the job waits for a human."""


class Step:
    """One step as run_once uses it: `name`, `success_state`, `run(payload, conn, job_id) ->
    (output, cost)` and `effects(output) -> [effect, ...]`."""

    def __init__(self, name: str, success_state: str,
                 work: Callable[[Any, sqlite3.Connection, str], tuple[Any, float]],
                 effects: Callable[[Any], list[dict]] = lambda out: []) -> None:
        self.name, self.success_state = name, success_state
        self.run, self.effects = work, effects


def memo_of(conn: sqlite3.Connection, job_id: str, step: str) -> Any:
    """An earlier step's output: a step's input is the step before it's memo."""
    row = conn.execute("SELECT output FROM step_result WHERE job_id=? AND step=?",
                       (job_id, step)).fetchone()
    if row is None:
        raise LookupError(f"job {job_id!r} has no {step!r} result to work from")
    return json.loads(row[0])


@contextmanager
def heartbeating(job_id: str) -> Iterator[None]:
    """While the body runs, a thread calls heartbeat() every HEARTBEAT_EVERY seconds on its
    own connection (the article: "call inside long steps"); stopped and joined on exit."""
    if not HEARTBEAT:
        yield
        return
    stop = threading.Event()

    def beat() -> None:
        conn = connect()
        try:
            while not stop.wait(HEARTBEAT_EVERY):
                probe.point("worker.heartbeat", job_id)
                try:
                    heartbeat(conn, job_id)
                except sqlite3.OperationalError:   # locked: the next beat tries again
                    conn.rollback()
        finally:
            conn.close()

    thread = threading.Thread(target=beat, name=f"heartbeat {job_id}")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def model_step(name: str, previous: str | None) -> Callable:
    """The work of a step that asks the model: its input is the job's payload (fetch) or the
    previous step's memo."""
    def work(payload: Any, conn: sqlite3.Connection, job_id: str) -> tuple[Any, float]:
        if previous is None:
            if not (isinstance(payload, dict) and isinstance(payload.get("body"), str)):
                raise ValueError("fetch: payload must be a JSON object with a string 'body'")
            step_input = payload
        else:
            step_input = memo_of(conn, job_id, previous)
        with heartbeating(job_id):
            probe.point("worker.before_call", job_id)
            out, cost = PROVIDER.complete(name, step_input, job_id, WORKER)
            probe.point("worker.after_call", job_id)
        if name == "verify" and not out["ok"]:
            raise NeedsReview(f"verify: flagged for review: {out['reason']}")
        return out, cost
    return work


def deliver(payload: Any, conn: sqlite3.Connection, job_id: str) -> tuple[Any, float]:
    """Delivery calls no model: what to charge and whom to notify, from the extraction."""
    extracted = memo_of(conn, job_id, "extract")
    return {"job": job_id, "charge_cents": extracted["amount_cents"],
            "title": extracted["title"]}, 0.0


def delivery_effects(out: dict) -> list[dict]:
    return [{"kind": "charge", "job": out["job"], "amount_cents": out["charge_cents"]},
            {"kind": "notify", "job": out["job"], "title": out["title"]}]


fetch_step = Step("fetch", "fetched", model_step("fetch", None))
extract_step = Step("extract", "extracted", model_step("extract", "fetch"))
verify_step = Step("verify", "verified", model_step("verify", "extract"))
deliver_step = Step("deliver", "delivered", deliver, delivery_effects)
STEPS = (fetch_step, extract_step, verify_step, deliver_step)

#: Both the ready and the working state of a step map to it: the published claim leaves a job
#: in its ready state, the variant moves it into its working state.
STEP_FOR_STATE = {
    "pending": fetch_step, "fetching": fetch_step,
    "fetched": extract_step, "extracting": extract_step,
    "extracted": verify_step, "verifying": verify_step,
    "verified": deliver_step, "delivering": deliver_step,
}
#: Where fail_step parks a job that gives up: STATES has no failed_verify, so verify's
#: failures (and its review flag) park in needs_human, the only parked edge out of verifying.
TERMINAL_FOR = {
    "pending": "failed_fetch", "fetching": "failed_fetch",
    "fetched": "failed_extract", "extracting": "failed_extract",
    "extracted": "needs_human", "verifying": "needs_human",
    "verified": "failed_deliver", "delivering": "failed_deliver",
}


# -- completion: the worker loop ---------------------------------------------------------------

def work(stop: threading.Event, poll: float) -> None:
    """Call run_once until `stop` is set, sleeping `poll` seconds when nothing was claimable.

    An exception out of run_once (the memo-hit assert, a database locked past its timeout, a
    job cancelled between claim and read) is logged and the loop goes on: the job keeps its
    lease until it expires. A worker that died on such a job would take every worker with it.
    """
    conn = connect()
    try:
        while not stop.is_set():
            try:
                if run_once(conn):
                    continue
            except Exception:
                log.exception("run_once failed")
                conn.rollback()
            stop.wait(poll)
    finally:
        conn.close()
