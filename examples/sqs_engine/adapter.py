"""The SQS engine's adapter to the harness contract (`chaos.contract`): `SQS`.

Its fencing tokens are receipt handles: random, so `token_order="opaque"`. Its one receive
count bounds retries and crashes together: `cap_counts="claims"`, `max_claims` the
receive cap and no separate attempt cap. Everything else the harness needs to know about the
engine lives here and in `observer`.
"""
from __future__ import annotations

import sqlite3
import sys
import time
from contextlib import contextmanager
from typing import Any, ContextManager, Iterator

from chaos import sqlite
from chaos.contract import ROLES, Command, EngineSettings, ProcessContext
from chaos.history import Event
from chaos.pipeline import Pipeline, Step

from . import observer, store
from .inprocess import SqsInProcess
from .settings import KEY_VARIABLE, SECRETS, Settings
from .worker import CRASH_LOOP_POINT, POINTS

_LIVE = ("waiting", "drafting", "drafted", "posting", store.PARKED)

PIPELINE = Pipeline(
    name="sqs",
    steps=(Step("draft", "waiting", "drafting", "drafted", store.PARKED),
           Step("post", "drafted", "posting", "posted", store.PARKED, model=False, memo=False)),
    edges={"waiting": ("drafting", "dead"),
           "drafting": ("drafted", "waiting", "dead"),
           "drafted": ("posting", "dead"),
           "posting": ("posted", "drafted", "dead")},
    terminal=frozenset(store.TERMINAL),
    operator_edges={**{s: ("cancelled",) for s in _LIVE},
                    "dead": ("waiting", "drafted", "cancelled")},
    effects=(store.EFFECT_KIND,),
    initial=store.INITIAL,
    operator_actions={"cancel": _LIVE, "requeue": (store.PARKED,)})

#: the harness's names for the engine's settings.
HARNESS_NAMES = {"lease": "visibility", "max_claims": "max_receives",
                 "outbox_lease": "outbox_visibility", "outbox_max_attempts": "outbox_max_receives"}
#: settings the shared scenarios name that the engine has no mechanism for: accepted, left out
#: (one receive count is the only cap; a job never stays with a worker between steps).
ABSENT = ("max_attempts", "keep_job")


def own_settings(table: dict[str, Any]) -> dict[str, Any]:
    """An [engine] table in the engine's own names."""
    return {HARNESS_NAMES.get(k, k): v for k, v in table.items() if k not in ABSENT}


def process_settings(ctx: ProcessContext) -> dict[str, Any]:
    """The settings of one process: the scenario's, with the slot's faults and the poll."""
    table = own_settings(ctx.engine)
    if ctx.heartbeat is False:
        table["heartbeat"] = False
    if ctx.call_timeout is not None:
        table["call_timeout"] = ctx.call_timeout
    table["poll"] = ctx.poll_interval
    return table


class SqsEngine:
    """The SQS engine, run through its own command line (`python -m examples.sqs_engine`).
    `planted` names one of `examples.sqs_engine.planted`'s bugs, or None for the engine."""

    pipeline = PIPELINE
    capabilities = frozenset({"fencing", "crash_points", "outbox", "operator", "heartbeat",
                              "lease_expiry", "write_lock", "integrity", "crash_loop_cap",
                              "attempt_cap", "backoff", "in_process"})
    crashpoints = POINTS
    point_roles = {
        "after_claim": ("after_receive",), "memo_hit": ("memo_hit",),
        "before_call": ("before_call",), "after_call": ("after_call",),
        "heartbeat": ("heartbeat",), "before_fail": ("before_fail",),
        "before_commit": ("before_commit",), "after_commit": ("after_commit",),
        "before_send": ("before_send",), "after_send": ("after_send",),
        "before_mark": ("before_mark",)}
    pid_of = staticmethod(observer.pid_of)   # writer ids are sqs-<pid>-<random>
    crash_loop_point = CRASH_LOOP_POINT

    def __init__(self, planted: str | None = None) -> None:
        self.planted = planted
        self.name = "sqs" if planted is None else f"sqs:{planted}"
        self.in_process = SqsInProcess(self)

    def loops(self) -> tuple[type, type]:
        """The (Worker, Sender) classes this engine's processes run."""
        from .planted import loops
        return loops(self.planted)

    # --- processes -------------------------------------------------------------------------

    def command(self, role: str, ctx: ProcessContext) -> Command:
        """argv and environment of one worker or sender; the provider key goes in the
        environment only. Raises ValueError for an unknown role or a bad setting."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        table = process_settings(ctx)
        settings = Settings.from_table(table)
        argv = [sys.executable, "-m", "examples.sqs_engine", role, "--db", ctx.db,
                "--provider-url", ctx.provider_url, "--receiver-url", ctx.receiver_url]
        for name in sorted(table):
            if name not in SECRETS:
                value = getattr(settings, name)
                argv += [f"--{name.replace('_', '-')}",
                         str(value).lower() if isinstance(value, bool) else str(value)]
        if self.planted:
            argv += ["--planted", self.planted]
        env = {KEY_VARIABLE: settings.provider_key} if settings.provider_key else {}
        return Command(argv, env)

    def settings(self, table: dict[str, Any]) -> EngineSettings:
        """The scenario's [engine] table in the harness's terms; ValueError names the field."""
        s = Settings.from_table(own_settings(table))
        bounds = tuple((0.0, s.backoff_bound(i)) for i in range(1, s.max_receives + 1))
        sends = tuple((0.0, s.backoff_bound(i)) for i in range(1, s.outbox_max_receives + 1))
        return EngineSettings(
            lease=s.visibility, heartbeat=s.heartbeat,
            heartbeat_interval=s.beat_every if s.heartbeat else None,
            call_timeout=s.call_timeout, max_attempts=None, max_claims=s.max_receives,
            backoff_bounds=bounds, outbox_max_attempts=s.outbox_max_receives,
            outbox_backoff_bounds=sends, outbox_lease=s.outbox_visibility,
            send_timeout=s.send_timeout, token_order="opaque", cap_counts="claims")

    # --- observer --------------------------------------------------------------------------

    def install(self, db: str, now_sql: str = observer.NOW) -> None:
        with _connection(db) as conn:
            store.init(conn)
            with store.write(conn):
                observer.install(conn, now_sql)

    def operations(self, db: str) -> list[Event]:
        with _connection(db) as conn:
            return observer.read(conn)

    def progress(self, db: str) -> dict[str, Any]:
        with _connection(db) as conn:
            return observer.progress(conn)

    def snapshot(self, db: str) -> dict[str, Any]:
        with _connection(db) as conn:
            return observer.snapshot(conn)

    # --- controls --------------------------------------------------------------------------

    def submit(self, db: str, job_id: str, payload: Any, now: float | None = None) -> str:
        with _connection(db) as conn:
            return store.submit(conn, job_id, payload, _now(now))

    def operator(self, db: str, action: str, job_id: str, now: float | None = None) -> str:
        """cancel or requeue `job_id`: "done", or "refused: why"."""
        with _connection(db) as conn:
            return store.operate(conn, action, job_id, _now(now))

    def expire_leases(self, db: str, now: float | None = None) -> int:
        """Every held task and effect visible now (its holder keeps its receipt); how many."""
        with _connection(db) as conn:
            return store.expire(conn, _now(now))

    def hold_write_lock(self, db: str) -> ContextManager[None]:
        return sqlite.hold_write_lock(db)

    def integrity(self, db: str) -> str:
        with _connection(db) as conn:
            problems = store.integrity(conn)
        return "; ".join(problems) if problems else "ok"


def _now(now: float | None) -> float:
    """The time a control writes: the simulation's (`now`), else the machine's clock."""
    return time.time() if now is None else now


@contextmanager
def _connection(db: str) -> Iterator[sqlite3.Connection]:
    conn = store.connect(db)
    try:
        yield conn
    finally:
        conn.close()


SQS = SqsEngine()
