"""The toy engine's adapter to the harness contract (`chaos.contract`): `TOY`.

Everything the harness needs to know about the toy lives here and in `observer`: its
pipeline, how to start its processes, how to read its documents as operations, and its
controls. It declares no fencing (the toy has no token) and no spend records (it keeps only
the cost of the call whose output it memoized).
"""
from __future__ import annotations

import json
import sqlite3
import sys
import time
from contextlib import contextmanager
from typing import Any, ContextManager, Iterator

from chaos import sqlite
from chaos.contract import ROLES, Command, EngineSettings, ProcessContext
from chaos.history import Event
from chaos.pipeline import Pipeline, Step

from . import jobs, observer, store
from .inprocess import ToyInProcess
from .settings import KEY_VARIABLE, SECRETS, Settings
from .worker import CRASH_LOOP_POINT, POINTS

_LIVE = ("queued", "summarizing", "summarized", "publishing", "stuck")

PIPELINE = Pipeline(
    name="toy",
    steps=(Step("summarize", "queued", "summarizing", "summarized", jobs.PARKED),
           Step("publish", "summarized", "publishing", "published", jobs.PARKED, model=False,
                memo=False)),
    edges={"queued": ("summarizing", "stuck"),
           "summarizing": ("summarized", "queued", "stuck"),
           "summarized": ("publishing", "stuck"),
           "publishing": ("published", "summarized", "stuck")},
    terminal=frozenset(jobs.TERMINAL),
    operator_edges={**{s: ("dropped",) for s in _LIVE},
                    "stuck": ("queued", "summarized", "dropped")},
    effects=(jobs.EFFECT_KIND,),
    initial=jobs.INITIAL,
    # resolve is left out: it also needs the step's memo, which a state does not show
    operator_actions={"cancel": _LIVE, "requeue": (jobs.PARKED,)})


class ToyEngine:
    """The toy engine, run through its own command line (`python -m examples.toy_engine`)."""

    name = "toy"
    pipeline = PIPELINE
    capabilities = frozenset({"crash_points", "outbox", "operator", "lease_expiry",
                              "write_lock", "integrity", "crash_loop_cap", "attempt_cap",
                              "backoff", "in_process"})
    crashpoints = POINTS
    #: its points by role (chaos.engines.crashpoints.ROLES). One commit point serves every write of
    #: a step (done, retried, parked, from a memo): it plays before_commit alone, so that
    #: naming before_fail or memo_hit does not kill the toy at every commit
    point_roles = {
        "after_claim": ("after_claim",), "before_call": ("before_call",),
        "after_call": ("after_call",), "before_commit": ("before_commit",),
        "after_commit": ("after_commit",), "before_send": ("before_send",),
        "after_send": ("after_send",)}
    pid_of = staticmethod(observer.pid_of)   # worker ids are toy-<pid>-<random>
    crash_loop_point = CRASH_LOOP_POINT
    in_process = ToyInProcess()

    # --- processes -------------------------------------------------------------------------

    def command(self, role: str, ctx: ProcessContext) -> Command:
        """argv and environment of one worker or sender; the provider key goes in the
        environment only. Raises ValueError for an unknown role or a bad setting."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        table = process_settings(ctx)
        settings = Settings.from_table(table)
        argv = [sys.executable, "-m", "examples.toy_engine", role, "--db", ctx.db, "--provider-url", ctx.provider_url,
                "--receiver-url", ctx.receiver_url]
        for name, value in sorted(table.items()):
            if name not in SECRETS:
                argv += [f"--{name.replace('_', '-')}", str(getattr(settings, name))]
        env = {}
        if settings.provider_key:
            env[KEY_VARIABLE] = settings.provider_key
        return Command(argv, env)

    def settings(self, table: dict[str, Any]) -> EngineSettings:
        """The scenario's [engine] table in the harness's terms; ValueError names the field."""
        s = Settings.from_table(own_settings(table))
        bounds = tuple((0.0, s.backoff_bound(i)) for i in range(1, s.max_attempts + 1))
        return EngineSettings(
            lease=s.lease, heartbeat=False, call_timeout=s.call_timeout,
            max_attempts=s.max_attempts, max_claims=s.max_claims, backoff_bounds=bounds,
            outbox_max_attempts=s.outbox_max_attempts, outbox_lease=s.outbox_lease,
            send_timeout=s.send_timeout)

    # --- observer --------------------------------------------------------------------------

    def install(self, db: str) -> None:
        with _connection(db) as conn:
            store.init(conn)
            with store.write(conn):
                observer.install(conn)

    def operations(self, db: str) -> list[Event]:
        with _connection(db) as conn:
            return observer.read(conn)

    def progress(self, db: str) -> dict[str, Any]:
        with _connection(db) as conn:
            docs = [json.loads(text) for _, text in store.everything(conn)]
        states: dict[str, int] = {}
        for doc in docs:
            states[doc["status"]] = states.get(doc["status"], 0) + 1
        unsent = sum(not (e["sent"] or e["dead"]) for d in docs for e in d["effects"])
        return {"states": states, "unsent": unsent}

    def snapshot(self, db: str) -> dict[str, Any]:
        with _connection(db) as conn:
            docs = [(key, json.loads(text)) for key, text in store.everything(conn)]
        return {
            "jobs": {key: {"state": d["status"], "attempts": d["attempts"],
                           "claims": d["claims"], "last_error": d["error"],
                           "payload_hash": d["payload_hash"], "cause": d["cause"]}
                     for key, d in docs},
            "memos": [{"job": key, "step": step, "cost": memo["cost"]}
                      for key, d in docs for step, memo in d["memo"].items()],
            "outbox": [{"row": f"{key}/{e['kind']}", "job": key, "kind": e["kind"],
                        "key": e["key"], "sent_at": e.get("sent_at"), "dead_at": e.get("dead_at"),
                        "attempts": e["attempts"], "last_error": e["error"]}
                       for key, d in docs for e in d["effects"]],
            "spend": None,
            "orphans": {},   # one table: nothing can outlive its job
        }

    # --- controls --------------------------------------------------------------------------

    def submit(self, db: str, job_id: str, payload: Any, now: float | None = None) -> str:
        with _connection(db) as conn:
            return store.submit(conn, job_id, payload, _now(now))

    def operator(self, db: str, action: str, job_id: str, now: float | None = None) -> str:
        """cancel, requeue or resolve `job_id`: "done", or "refused: why"."""
        at = _now(now)
        actions = {"cancel": lambda d: jobs.cancel(d, "operator"),
                   "requeue": lambda d: jobs.requeue(d, "operator", at),
                   "resolve": lambda d: jobs.resolve(d, "operator", at)}
        if action not in actions:
            return f"refused: unknown action {action!r} (known: {', '.join(actions)})"
        try:
            with _connection(db) as conn:
                store.update(conn, job_id, actions[action])
        except (KeyError, jobs.Refused) as exc:
            return f"refused: {exc.args[0]}"
        return "done"

    def expire_leases(self, db: str, now: float | None = None) -> int:
        """Make every held lease (a job's or an effect's) lapse now; how many."""
        now = _now(now)
        expired = 0
        with _connection(db) as conn, store.write(conn):
            for key, text in store.everything(conn):
                doc, n = _expired(json.loads(text), now)
                if n and store.swap(conn, key, text, doc) is not None:
                    expired += n
        return expired

    def hold_write_lock(self, db: str) -> ContextManager[None]:
        return sqlite.hold_write_lock(db)

    def integrity(self, db: str) -> str:
        with _connection(db) as conn:
            problems = store.integrity(conn)
        return "; ".join(problems) if problems else "ok"


#: Settings the shared scenarios name for mechanisms the toy does not have: accepted and
#: left out (settings() reports heartbeat False), so those scenarios run; a scenario that
#: needs one (a call longer than the lease, say) is still refused by the toy's own checks.
ABSENT = ("heartbeat", "heartbeat_interval", "keep_job")


def own_settings(table: dict[str, Any]) -> dict[str, Any]:
    """The part of an [engine] table the toy has settings for."""
    return {k: v for k, v in table.items() if k not in ABSENT}


def process_settings(ctx: ProcessContext) -> dict[str, Any]:
    """The settings table of one process: the scenario's, with the slot's call timeout and
    the harness's poll interval."""
    table = own_settings(ctx.engine)
    if ctx.call_timeout is not None:
        table["call_timeout"] = ctx.call_timeout
    table["poll"] = ctx.poll_interval
    return table


def _now(now: float | None) -> float:
    """The time a control writes: the simulation's (`now`), else the machine's clock."""
    return time.time() if now is None else now


def _expired(doc: dict, now: float) -> tuple[dict, int]:
    n = 0
    if doc["owner"] and (doc["lease_expires"] or 0) > now:
        doc.update(lease_expires=now - 0.001, actor="harness", by="harness")
        n += 1
    for effect in doc["effects"]:
        if effect["owner"] and (effect["lease_expires"] or 0) > now:
            effect.update(lease_expires=now - 0.001, by="harness")
            n += 1
    return doc, n


@contextmanager
def _connection(db: str) -> Iterator[sqlite3.Connection]:
    conn = store.connect(db)
    try:
        yield conn
    finally:
        conn.close()


TOY = ToyEngine()
