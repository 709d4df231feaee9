"""The article engine's adapter to the harness contract (`chaos.contract`).

`ARTICLE` is the engine as published; `ARTICLE_CLAIM_MOVES` its variant whose claim moves the
job into its working state. Run either with

    ninelives run SCENARIO --engine examples.article_engine.adapter:ARTICLE --seed N

Capabilities are declared for what the article's code has, and nothing else: no fencing token,
no per-call spend records, no crash-loop cap. `ninelives sim` runs its own loops through
`inprocess`. What this adapter adds to
the engine to observe it lives beside the article's tables (see `observer`).
"""
from __future__ import annotations

import sqlite3
import sys
import time
from dataclasses import dataclass, replace
from typing import Any, ContextManager

from chaos import sqlite
from chaos.contract import Command, EngineSettings, ProcessContext
from chaos.history import Event, fingerprint
from chaos.pipeline import Pipeline, Step

from . import calls, engine, observer
from .inprocess import ArticleInProcess

#: The repository root, so `python -m examples.article_engine` imports from any directory.
MODULE = "examples.article_engine"

# -- the pipeline, from the article's STATES ----------------------------------------------------

PARKED = ("needs_human", "failed_fetch", "failed_extract", "failed_deliver")
TERMINAL = frozenset(s for s, to in engine.STATES.items() if not to)
#: Edges only an operator takes: out of a parked state (requeue, resolve, cancel), and the
#: cancel of a pending job. Every other edge of STATES is a worker's.
OPERATOR_EDGES = {**{s: tuple(engine.STATES[s]) for s in PARKED}, "pending": ("cancelled",)}
WORKER_EDGES = {s: tuple(t for t in to if t not in OPERATOR_EDGES.get(s, ()))
                for s, to in engine.STATES.items() if s not in PARKED}
#: The verify step's model can send a job to review; it is also where verify parks (STATES has
#: no failed_verify).
ALTERNATE = {"verify": "needs_human"}
EFFECTS = ("charge", "notify")


def article_pipeline() -> Pipeline:
    """The article's STATES as the harness's data: one Step per (ready, working) pair."""
    steps = []
    for ready, working in engine.WORKING_FOR.items():
        if ready == working:
            continue
        step = engine.STEP_FOR_STATE[ready]
        steps.append(Step(step.name, ready, working, step.success_state,
                          engine.TERMINAL_FOR[working], model=step.name in calls.SCHEMAS,
                          alternate=ALTERNATE.get(step.name)))
    return Pipeline(name="article", steps=tuple(steps), edges=WORKER_EDGES, terminal=TERMINAL,
                    operator_edges=OPERATOR_EDGES, effects=EFFECTS, initial="pending",
                    operator_actions={a: tuple(m) for a, m in ACTIONS.items()})



#: Operator actions: the state each may start from, and where it takes the job (STATES' edges).
ACTIONS = {
    "cancel": {"pending": "cancelled", "needs_human": "cancelled"},
    "requeue": {"failed_fetch": "pending", "failed_extract": "fetched",
                "failed_deliver": "verified"},
    "resolve": {"needs_human": "extracted"},
}

PIPELINE = article_pipeline()

# -- settings -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArticleSettings:
    """The engine's own settings (its CLI flags), with the article's values as defaults."""

    lease: float = 120.0
    call_timeout: float = 60.0
    max_attempts: int = 5
    backoff_base: float = 1.0
    backoff_cap: float = 32.0
    heartbeat: bool = True
    heartbeat_interval: float | None = None    # None: lease / 3
    busy_timeout: float = 5.0
    send_timeout: float = 10.0
    model: str = "fake-model"


#: [engine] keys the article engine reads, and their types.
KNOWN = {"lease": float, "call_timeout": float, "max_attempts": int, "backoff_base": float,
         "backoff_cap": float, "heartbeat": bool, "heartbeat_interval": float,
         "busy_timeout": float, "send_timeout": float, "model": str}
#: Keys naming mechanisms the article does not have (a crash-loop cap, an outbox lease, a
#: dead letter, keeping a job across steps). Accepted, so the shared scenarios run against this
#: engine, and reported as None: the checkers that need them then say `unknown` or find the gap.
ABSENT = {"max_claims": int, "outbox_lease": float, "outbox_max_attempts": int,
          "keep_job": bool}
KIND_NAMES = {float: "a number", int: "an integer", bool: "a boolean", str: "a string"}


def read_settings(table: dict[str, Any]) -> ArticleSettings:
    """The [engine] table as ArticleSettings; ValueError names an unknown key or a bad value."""
    values = {}
    for key, value in table.items():
        kind = KNOWN.get(key) or ABSENT.get(key)
        if kind is None:
            raise ValueError(f"unknown setting 'engine.{key}' for the article engine (it reads "
                             f"{', '.join(KNOWN)}; it has no {', '.join(ABSENT)})")
        if not _is(kind, value):
            raise ValueError(f"setting 'engine.{key}' must be {KIND_NAMES[kind]}, got {value!r}")
        if key in KNOWN:
            values[key] = float(value) if kind is float else value
    s = replace(ArticleSettings(), **values)
    for key in ("lease", "call_timeout", "backoff_base", "backoff_cap", "busy_timeout",
                "send_timeout", "heartbeat_interval"):
        value = getattr(s, key)
        if value is not None and not value > 0:
            raise ValueError(f"setting 'engine.{key}' must be > 0, got {value}")
    if s.max_attempts < 1:
        raise ValueError(f"setting 'engine.max_attempts' must be >= 1, got {s.max_attempts}")
    if s.backoff_cap < s.backoff_base:
        raise ValueError(f"setting 'engine.backoff_cap' ({s.backoff_cap}) must be at least "
                         f"'engine.backoff_base' ({s.backoff_base})")
    return s


def _is(kind: type, value: Any) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    return isinstance(value, (int, float)) if kind is float else isinstance(value, kind)


def backoff_bounds(s: ArticleSettings) -> tuple[tuple[float, float], ...]:
    """After failed attempt n (n < max_attempts) fail_step waits backoff(n): uniform in
    [base, min(cap, base * 2^n)], the article's 1-2 s, 1-4 s, ... 1-32 s at base 1, cap 32."""
    return tuple((s.backoff_base, min(s.backoff_cap, s.backoff_base * 2.0 ** n))
                 for n in range(1, s.max_attempts))


# -- the adapter --------------------------------------------------------------------------------


class ArticleEngine:
    """The article's engine, run through its CLI (`python -m examples.article_engine`)."""

    capabilities = frozenset({
        "crash_points", "outbox", "operator", "heartbeat", "lease_expiry", "write_lock",
        "integrity", "attempt_cap", "backoff", "clock_skew", "in_process"})
    crashpoints = engine.POINTS
    #: its points by role (chaos.engines.crashpoints.ROLES); its claim, submit and sent mark have none
    point_roles = {
        "after_claim": ("worker.after_claim",), "memo_hit": ("worker.memo_hit",),
        "before_call": ("worker.before_call",), "after_call": ("worker.after_call",),
        "before_fail": ("worker.before_fail",), "before_commit": ("worker.before_commit",),
        "after_commit": ("worker.after_commit",), "heartbeat": ("worker.heartbeat",),
        "before_send": ("sender.before_send",), "after_send": ("sender.after_send",)}
    pid_of = staticmethod(observer.pid_of)   # WORKER is hostname:pid
    #: After these points a process writes to the job (a step without a call writes right
    #: after its claim): the article's rows keep no writer, so
    #: the harness attributes those writes from the probe's trace (chaos.engines.writers).
    write_points = frozenset({"worker.after_claim", "worker.after_call", "worker.memo_hit",
                              "worker.before_fail", "worker.heartbeat", "sender.after_send"})
    crash_loop_point = engine.CRASH_LOOP_POINT
    pipeline = PIPELINE

    def __init__(self, name: str = "article", claim_moves: bool = False) -> None:
        self.name, self.claim_moves = name, claim_moves
        self.in_process = ArticleInProcess(self)

    # -- processes ------------------------------------------------------------------------

    def command(self, role: str, ctx: ProcessContext) -> Command:
        """`python -m examples.article_engine worker|sender ...`; the
        provider key, if the harness has one, stays in the environment."""
        if role not in ("worker", "sender"):
            raise ValueError(f"role must be 'worker' or 'sender', got {role!r}")
        s = read_settings(ctx.engine)
        if role == "worker" and ctx.heartbeat is False:
            s = replace(s, heartbeat=False)
        if role == "worker" and ctx.call_timeout is not None:
            s = replace(s, call_timeout=float(ctx.call_timeout))
        argv = [sys.executable, "-m", MODULE, role, "--db", ctx.db,
                "--provider-url", ctx.provider_url, "--receiver-url", ctx.receiver_url,
                "--poll", str(ctx.poll_interval)]
        for key, value in vars(s).items():
            if value is not None:
                flag = ("on" if value else "off") if isinstance(value, bool) else str(value)
                argv += [f"--{key.replace('_', '-')}", flag]
        if role == "worker" and ctx.clock_skew:
            argv += ["--clock-skew", str(ctx.clock_skew)]
        if self.claim_moves:
            argv.append("--claim-moves")
        return Command(argv)

    def settings(self, table: dict[str, Any]) -> EngineSettings:
        s = read_settings(table)
        return EngineSettings(
            lease=s.lease, heartbeat=s.heartbeat,
            heartbeat_interval=(s.heartbeat_interval or s.lease / 3.0) if s.heartbeat else None,
            call_timeout=s.call_timeout, max_attempts=s.max_attempts, max_claims=None,
            backoff_bounds=backoff_bounds(s), outbox_max_attempts=None, outbox_lease=None,
            send_timeout=s.send_timeout, keep_job=False)

    # -- observer -------------------------------------------------------------------------

    def install(self, db: str, now_sql: str = observer.NOW) -> None:
        """The article's schema (if absent), then the audit tables and triggers, stamping
        with the SQL `now_sql`."""
        engine.init_db(db)
        conn = _connect(db)
        try:
            conn.execute("BEGIN IMMEDIATE")
            observer.install(conn, now_sql)
            conn.execute("COMMIT")
        finally:
            conn.close()

    def operations(self, db: str) -> list[Event]:
        conn = _connect(db)
        try:
            return observer.operations(observer.read_rows(conn), PIPELINE.parked_states)
        finally:
            conn.close()

    def progress(self, db: str) -> dict[str, Any]:
        conn = _connect(db)
        try:
            states = dict(conn.execute("SELECT state, COUNT(*) FROM job GROUP BY state"))
            unsent = conn.execute("SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL"
                                  ).fetchone()[0]
            return {"states": states, "unsent": unsent}
        finally:
            conn.close()

    def snapshot(self, db: str) -> dict[str, Any]:
        conn = _connect(db)
        try:
            return _snapshot(conn)
        finally:
            conn.close()

    # -- controls -------------------------------------------------------------------------

    def submit(self, db: str, job_id: str, payload: Any, now: float | None = None) -> str:
        """The article's INSERT: a new id is "created"; the same id with the same payload is a
        no-op ("exists"); with another payload, also a no-op for the article, which this
        adapter reports as "rejected" by comparing the stored payload."""
        text = engine.canonical(payload)
        conn = _connect(db)
        try:
            with observer.written_by(conn, "submitter"):
                row = conn.execute("SELECT payload FROM job WHERE id=?", (job_id,)).fetchone()
                if row is None:
                    at = _now(now)
                    conn.execute(engine.SUBMIT_SQL, (job_id, text, at, at))
                    return "created"
            return "exists" if row[0] == text else "rejected"
        finally:
            conn.close()

    def operator(self, db: str, action: str, job_id: str, now: float | None = None) -> str:
        """cancel, requeue or resolve along STATES' edges, with the article's transition()
        write (compare-and-swap on state); "done" or "refused: why"."""
        if action not in ACTIONS:
            raise ValueError(f"action must be one of {', '.join(ACTIONS)}, got {action!r}")
        conn = _connect(db)
        try:
            with observer.written_by(conn, "operator"):
                row = conn.execute("SELECT state FROM job WHERE id=?", (job_id,)).fetchone()
                if row is None:
                    return f"refused: no job {job_id!r}"
                to = ACTIONS[action].get(row[0])
                if to is None:
                    return (f"refused: job {job_id!r} is {row[0]}; {action} applies to "
                            f"{', '.join(ACTIONS[action])}")
                conn.execute("UPDATE job SET state=?, updated=?, attempts=0 "
                             "WHERE id=? AND state=?", (to, _now(now), job_id, row[0]))
            return "done"
        finally:
            conn.close()

    def expire_leases(self, db: str, now: float | None = None) -> int:
        """Every live lease ends now (lease_until moved just into the past)."""
        conn = _connect(db)
        try:
            with observer.written_by(conn, "harness"):
                now = _now(now)
                return conn.execute("UPDATE job SET lease_until=? WHERE lease_until > ?",
                                    (now - 0.001, now)).rowcount
        finally:
            conn.close()

    def hold_write_lock(self, db: str) -> ContextManager[None]:
        return sqlite.hold_write_lock(db)

    def integrity(self, db: str) -> str:
        return sqlite.integrity(db)


def _now(now: float | None) -> float:
    """The time a control writes: the simulation's (`now`), else the machine's clock."""
    return time.time() if now is None else now


def _connect(db: str) -> sqlite3.Connection:
    """The adapter's own connection: autocommit, so every transaction is explicit."""
    return sqlite3.connect(db, timeout=10.0, isolation_level=None)


def _snapshot(conn: sqlite3.Connection) -> dict[str, Any]:
    jobs = {job_id: {
        "state": state, "attempts": attempts, "claims": None, "last_error": last_error,
        "payload_hash": fingerprint(payload),
        "cause": observer.cause_of(last_error) if state in PIPELINE.parked_states else None,
        "next_run_at": next_run_at, "lease_until": lease_until, "lease_owner": owner}
        for job_id, state, attempts, last_error, payload, next_run_at, lease_until, owner
        in conn.execute("SELECT id, state, attempts, last_error, payload, next_run_at,"
                        " lease_until, lease_owner FROM job")}
    memos = [{"job": j, "step": s, "cost": c}
             for j, s, c in conn.execute("SELECT job_id, step, cost FROM step_result")]
    outbox = [{"row": row, "job": j, "kind": k, "key": str(row), "sent": sent is not None,
               "sent_at": sent, "dead": None, "dead_at": None, "attempts": a,
               "last_error": None}
              for row, j, k, sent, a in conn.execute(
                  "SELECT id, job_id, kind, sent_at, attempts FROM outbox")]
    orphans = {f"{name}_without_job": conn.execute(
        f"SELECT COUNT(*) FROM {table} WHERE job_id NOT IN (SELECT id FROM job)").fetchone()[0]
        for name, table in (("memos", "step_result"), ("outbox", "outbox"))}
    return {"jobs": jobs, "memos": memos, "outbox": outbox, "spend": None, "orphans": orphans}


ARTICLE = ArticleEngine()
ARTICLE_CLAIM_MOVES = ArticleEngine("article-claim-moves", claim_moves=True)

__all__ = ["ARTICLE", "ARTICLE_CLAIM_MOVES", "ArticleEngine", "PIPELINE", "read_settings"]
