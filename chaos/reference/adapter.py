"""The reference engine's adapter: the one place in the harness that knows the reference engine.

It meets the contract of `chaos.contract` like any other adapter, with no privileged path:
processes are started through the engine's own CLI (`python -m engine worker|send`), the
observer is the audit triggers of `chaos.reference.audit` read by `chaos.reference.observer`,
and the controls go through the engine's store. The broken variants of `ninelives mutants`
are subclasses that start a patched engine.
"""
from __future__ import annotations

import sqlite3
import sys
import time
from typing import Any, ContextManager

from engine import CRASHPOINTS, DOCUMENT, ConfigError, load_config, open_store
from engine.config import FIELDS as CONFIG_FIELDS
from engine.states import Pipeline as EnginePipeline
from engine.store import OperatorError, SubmissionConflict, is_postgres_url

from chaos import sqlite
from chaos.contract import Command, EngineSettings, ProcessContext
from chaos.history import Event, fingerprint
from chaos.pipeline import Pipeline, Step
from chaos.run.runfiles import is_secret, secret_names
from chaos.reference import audit, observer, pg_audit
from chaos.reference.leases import expire_leases

#: The reference engine's CLI names the outbox role "send".
ROLE_COMMANDS = {"worker": "worker", "sender": "send"}
#: The effect kinds of the built-in document pipeline's delivery step.
DOCUMENT_EFFECTS = ("charge", "notify")


def chaos_pipeline(pipeline: EnginePipeline, effects: tuple[str, ...] = ()) -> Pipeline:
    """The engine's state table as the harness's plain data. A step calls the model unless
    it delivers (the document pipeline's last step posts effects through the outbox)."""
    last = pipeline.steps[-1].name
    return Pipeline(
        name=pipeline.name, initial=pipeline.initial, effects=effects,
        steps=tuple(Step(s.name, s.ready, s.working, s.done, s.parked,
                         model=not (effects and s.name == last), alternate=s.alternate)
                    for s in pipeline.steps),
        edges=dict(pipeline.edges), operator_edges=dict(pipeline.operator_edges),
        operator_actions=operator_actions(pipeline), terminal=pipeline.terminal)


def operator_actions(pipeline: EnginePipeline) -> dict[str, tuple[str, ...]]:
    """Where the engine always carries an operator action out (`engine.store.operator`):
    a cancel from any state with an operator edge to a terminal state (every ready and
    parked state), a requeue or resolve from a parked state."""
    cancel = tuple(s for s, to in pipeline.operator_edges.items()
                   if any(t in pipeline.terminal for t in to))
    parked = tuple(sorted({p for s in pipeline.steps for p in (s.parked, s.alternate) if p}))
    return {"cancel": cancel, "requeue": parked, "resolve": parked}


def backoff_bounds(base: float, cap: float, attempts: int) -> tuple[tuple[float, float], ...]:
    """Full jitter: after failed attempt n the wait is uniform in [0, min(cap, base * 2^(n-1))]."""
    return tuple((0.0, min(cap, base * 2.0 ** (n - 1))) for n in range(1, attempts + 1))


class ReferenceEngine:
    """The reference engine, run through its own CLI."""

    name = "reference"
    module = "engine"
    #: `ninelives sim` runs it in process as it is (chaos.reference.inprocess.patches): a
    #: class's own attribute, never inherited, so a subclass that changes the engine must say
    #: how it runs in process (a mutant, or a patch()) or is refused
    in_process_as_is = True
    capabilities = frozenset({
        "fencing", "spend_records", "crash_points", "outbox", "operator", "heartbeat",
        "lease_expiry", "write_lock", "integrity", "crash_loop_cap", "attempt_cap", "backoff",
        "clock_skew", "in_process"})
    #: the stores it runs on (chaos.run.backends): a SQLite file, or a PostgreSQL database
    backends = ("sqlite", "postgres")
    crashpoints = CRASHPOINTS
    #: its points by role (chaos.engines.crashpoints.ROLES); the slot group's two commit points
    #: play no role of their own: a scenario names them, optional, by their names
    point_roles = {
        "submit": ("submit.before_commit",), "claim": ("claim.before_commit",),
        "after_claim": ("worker.after_claim",), "memo_hit": ("worker.memo_hit.before_commit",),
        "before_call": ("worker.before_call",), "after_call": ("worker.after_call",),
        "before_fail": ("worker.fail.before_commit",),
        "before_commit": ("worker.before_commit",), "after_commit": ("worker.after_commit",),
        "heartbeat": ("worker.heartbeat",), "before_send": ("sender.after_claim",),
        "after_send": ("sender.after_send",), "before_mark": ("sender.before_commit",)}
    crash_loop_point = "worker.after_call"
    pid_of = staticmethod(observer.pid_of)

    def __init__(self, pipeline: EnginePipeline = DOCUMENT,
                 effects: tuple[str, ...] = DOCUMENT_EFFECTS) -> None:
        self.engine_pipeline = pipeline
        self.pipeline = chaos_pipeline(pipeline, effects)

    # -- processes ---------------------------------------------------------------------------

    def command(self, role: str, ctx: ProcessContext) -> Command:
        """`python -m engine worker|send --exit-with-parent --setting value ...`; a secret
        setting (`chaos.run.runfiles.is_secret`: the provider key) goes in the environment as
        NINELIVES_<SETTING>, never on the command line, which any user can read."""
        if role not in ROLE_COMMANDS:
            raise ValueError(f"role must be one of {sorted(ROLE_COMMANDS)}, got {role!r}")
        settings = {"poll_interval": ctx.poll_interval, **ctx.engine, "db": ctx.db,
                    "provider_url": ctx.provider_url, "receiver_url": ctx.receiver_url}
        secret = secret_names(self)
        env = {f"NINELIVES_{k.upper()}": _flag(settings.pop(k)) for k in list(settings)
               if is_secret(k, secret)}
        argv = [sys.executable, "-m", self.module, ROLE_COMMANDS[role], "--exit-with-parent"]
        if role == "worker":
            if ctx.clock_skew:
                argv += ["--clock-skew", str(ctx.clock_skew)]
            if ctx.heartbeat is False:
                settings["heartbeat"] = False
            if ctx.call_timeout is not None:
                settings["call_timeout"] = ctx.call_timeout
        for key, value in settings.items():
            argv += [f"--{key.replace('_', '-')}", _flag(value)]
        return Command(argv, env)

    def settings(self, table: dict[str, Any]) -> EngineSettings:
        """The scenario's [engine] table as the engine reads it (raises ValueError naming
        the setting)."""
        for key in table:
            if key not in CONFIG_FIELDS:
                raise ValueError(f"unknown field 'engine.{key}' (an engine setting: "
                                 f"{', '.join(sorted(CONFIG_FIELDS))})")
        try:
            c = load_config(env={}, overrides=table)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return EngineSettings(
            lease=c.lease, heartbeat=c.heartbeat, heartbeat_interval=c.beat_every,
            call_timeout=c.call_timeout, max_attempts=c.max_attempts, max_claims=c.max_claims,
            backoff_bounds=backoff_bounds(c.backoff_base, c.backoff_cap, c.max_attempts),
            outbox_max_attempts=c.outbox_max_attempts, outbox_lease=c.outbox_lease,
            outbox_backoff_bounds=backoff_bounds(c.backoff_base, c.backoff_cap,
                                                 c.outbox_max_attempts),
            send_timeout=c.send_timeout, keep_job=c.keep_job, slots=c.slots,
            id_per_slot=True,  # `<process id>/<k>`: one job at a time under each id
            # ORDER BY next_run_at in the claim; an idle worker sleeps poll * [0.5, 1.5).
            claim_order="due",
            claim_latency=1.5 * float(table.get("poll_interval", ProcessContext.poll_interval)),
            # The engine's promise as its docs state it (retry_store tries until the lease's
            # end, waiting at most half a second between tries), not read from its code: a
            # changed constant breaks the promise instead of moving it.
            finish_retry_slack=0.5,
            # SQLiteStore ages the clock read before a write by the lock wait (`waited`).
            lease_from_write=True)

    # -- observer ----------------------------------------------------------------------------

    # `db` is a SQLite file's path or a postgresql:// URL (chaos.run.backends); on PostgreSQL
    # the audit is chaos.reference.pg_audit's triggers, read through the same mapping.

    def install(self, db: str) -> None:
        store = open_store(db)  # creates or migrates the engine's tables
        try:
            if store.backend == "postgres":
                with pg_audit.connect(db, autocommit=False) as conn:  # one transaction
                    pg_audit.install(conn)
            else:
                with store.write() as conn:
                    audit.install(conn)
        finally:
            store.close()

    def operations(self, db: str) -> list[Event]:
        if is_postgres_url(db):
            with pg_audit.connect(db) as pg:
                return observer.operations(pg_audit.read_audit(pg), self.pipeline)
        conn = sqlite3.connect(db, timeout=10.0)
        try:
            return observer.operations(audit.read_audit(conn), self.pipeline)
        finally:
            conn.close()

    def durability(self, table: dict[str, Any]) -> tuple[bool, str]:
        """SQLite in WAL mode: synchronous=FULL fsyncs the log at every commit (durable);
        NORMAL only at a checkpoint, so commits since the last one may be lost to a power
        cut (the store stays consistent). PostgreSQL: FULL is synchronous_commit=on (the
        commit waits for its WAL's fsync), NORMAL is off (the WAL writer fsyncs later)."""
        sync = str(table.get("synchronous", "FULL")).upper()
        durable = sync in ("FULL", "EXTRA")
        return durable, (f"synchronous={sync}, journal_mode=WAL (on PostgreSQL "
                         f"synchronous_commit={'on' if durable else 'off'})")

    def store_settings(self, db: str) -> dict[str, Any]:
        """The settings that depend on the store at `db` (see the contract). PostgreSQL: the
        server's clock places leases (lease_clock "store": a skewed worker can neither steal
        a live lease nor keep an expired one); and a claim takes the due job first among
        those no other transaction holds locked (FOR UPDATE SKIP LOCKED: claim_order
        "due-unless-locked"), so a claimer that dies holding a row's lock, until the server
        rolls it back, lets later jobs go first. SQLite: as `settings` says (claims commit
        one at a time, the oldest due job first)."""
        if is_postgres_url(db):
            return {"lease_clock": "store", "claim_order": "due-unless-locked"}
        return {}

    def progress(self, db: str) -> dict[str, Any]:
        if is_postgres_url(db):
            return pg_audit.progress(db)
        conn = sqlite3.connect(db, timeout=10.0)
        try:
            states = dict(conn.execute("SELECT state, COUNT(*) FROM job GROUP BY state"))
            unsent = conn.execute("SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL AND"
                                  " dead_at IS NULL").fetchone()[0]
            return {"states": states, "unsent": unsent}
        finally:
            conn.close()

    def snapshot(self, db: str) -> dict[str, Any]:
        store = open_store(db, read_only=True)
        try:
            return _snapshot(store)
        finally:
            store.close()

    def simulate(self, spec, choices, *, keep_db: str | None = None):
        """One schedule of a simulation (see chaos.sim): the engine's worker and sender
        classes as threads scheduled at its crash points, on virtual time."""
        from chaos.reference.inprocess.run import simulate
        return simulate(spec, choices, keep_db=keep_db)

    # -- controls ----------------------------------------------------------------------------

    def _store(self, db: str):
        return open_store(db, busy_timeout=10.0)

    def submit(self, db: str, job_id: str, payload: Any) -> str:
        return self.submit_with(self._store(db), job_id, payload)

    def submit_with(self, store, job_id: str, payload: Any) -> str:
        """Submit through `store` (then closed): "created", "exists" or "rejected"."""
        try:
            return "created" if store.submit(job_id, self.engine_pipeline, payload,
                                             time.time()) else "exists"
        except SubmissionConflict:
            return "rejected"
        finally:
            store.close()

    def operator(self, db: str, action: str, job_id: str) -> str:
        return self.operate_with(self._store(db), action, job_id)

    def operate_with(self, store, action: str, job_id: str) -> str:
        """Carry an operator action out through `store` (then closed): "done" or
        "refused: why"."""
        try:
            getattr(store, action)(job_id, "operator:chaos", time.time())
            return "done"
        except OperatorError as exc:
            return f"refused: {exc}"
        finally:
            store.close()

    def expire_leases(self, db: str) -> int:
        store = self._store(db)
        try:
            with store.write() as conn:
                # the leases' own clock: the server's on PostgreSQL, this machine's on SQLite
                now = pg_audit.server_now(conn) if store.backend == "postgres" else time.time()
                return expire_leases(conn, now)
        finally:
            store.close()

    def hold_write_lock(self, db: str) -> ContextManager[None]:
        if is_postgres_url(db):
            return pg_audit.hold_write_lock(db)
        return sqlite.hold_write_lock(db)

    def hold_row_lock(self, db: str, pick: int) -> ContextManager[dict | None]:
        """Hold one row's lock until the block ends (the row_lock fault; PostgreSQL only:
        SQLite locks the whole database, which hold_write_lock holds): a job's a worker
        holds, else one still to run, else an unsent outbox row's. Yields {"table": "job"
        or "outbox", "row", "job"}, or None when nothing is unfinished (see
        pg_audit.hold_row_lock)."""
        if not is_postgres_url(db):
            raise ValueError("SQLite has no row locks: the whole database is locked at once")
        return pg_audit.hold_row_lock(db, pick)

    def integrity(self, db: str) -> str:
        """SQLite: PRAGMA integrity_check. PostgreSQL: the server answers, the schema is
        current and the audit triggers are in place (see pg_audit.integrity)."""
        if is_postgres_url(db):
            store = open_store(db, read_only=True)
            try:
                return pg_audit.integrity(db, store.integrity_check())
            finally:
                store.close()
        return sqlite.integrity(db)


def engine_cli(argv: list[str]) -> int:
    """`ninelives engine ...`: the reference engine's own command line."""
    from engine.cli import main
    return main(argv)


def _snapshot(store) -> dict[str, Any]:
    jobs = {r["id"]: {
        "state": r["state"], "attempts": r["attempts"], "claims": r["claims"],
        "token": r["lease_token"], "last_error": r["last_error"],
        "cause": observer.cause_of(r["last_error"]),
        "payload_hash": fingerprint(r["payload"]), "next_run_at": r["next_run_at"],
        "lease_until": r["lease_until"]} for r in store.query("SELECT * FROM job")}
    memos = [{"job": r["job_id"], "step": r["step"], "cost": r["cost"], "worker": r["worker"],
              "token": r["lease_token"], "at": r["at"]}
             for r in store.query("SELECT * FROM step_result")]
    outbox = [{"row": r["id"], "job": r["job_id"], "kind": r["kind"], "key": r["idempotency_key"],
               "sent_at": r["sent_at"], "dead_at": r["dead_at"], "attempts": r["attempts"],
               "last_error": r["last_error"]} for r in store.query("SELECT * FROM outbox")]
    spend = [{"job": r["job_id"], "step": r["step"], "worker": r["worker"],
              "pid": observer.pid_of(r["worker"]), "token": r["lease_token"],
              "started": r["started"], "ended": r["ended"], "outcome": r["outcome"],
              "cost": r["cost"]} for r in store.query("SELECT * FROM spend")]
    orphans = {f"{name}_without_job": store.query(
        f"SELECT COUNT(*) AS n FROM {table} WHERE job_id NOT IN (SELECT id FROM job)")[0]["n"]
        for name, table in (("memos", "step_result"), ("outbox", "outbox"), ("spend", "spend"))}
    return {"jobs": jobs, "memos": memos, "outbox": outbox, "spend": spend, "orphans": orphans}


def _flag(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


REFERENCE = ReferenceEngine()

__all__ = ["REFERENCE", "ReferenceEngine", "backoff_bounds", "chaos_pipeline"]
