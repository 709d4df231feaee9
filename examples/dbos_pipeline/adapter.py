"""The DBOS pipeline's adapter to the harness contract (`chaos.contract`): `DBOS_ENGINE`.

DBOS is an engine nobody here wrote, so it declares what DBOS does and nothing more. DBOS
takes a workflow off its queue by marking it PENDING under the taking executor's id, and
checkpoints each step's output; it has no per-step lease and no fencing token (a crashed
executor's workflows are recovered when an executor of the same id starts again, not when a
lease lapses), keeps no record of what a call cost or of a failed attempt, and has no outbox:
an effect is posted inside a step, and a step is at least once. So no capability is
declared: the invariants that need one are reported unknown, the faults that need one (a
forced lease expiry, a crash point, an operator action, a held write lock) not applicable.
A pause is still a pause and a SIGKILL still a SIGKILL.

There is no sender in DBOS: a `sender` process of the harness is one more DBOS executor on
the same queue, so a scenario's senders add executors to kill.
"""
from __future__ import annotations

import sqlite3
import subprocess
import sys
from contextlib import contextmanager
from typing import Any, Iterator

from chaos.contract import ROLES, Command, EngineSettings, ProcessContext
from chaos.history import Event, canonical_json
from chaos.pipeline import Pipeline, Step

from . import app, observer

PARKED = "failed"
_LIVE = ("queued", "summarizing", "summarized", "publishing")

PIPELINE = Pipeline(
    name="dbos",
    steps=(Step("summarize", "queued", "summarizing", "summarized", PARKED),
           Step("publish", "summarized", "publishing", "published", PARKED, model=False,
                memo=False)),
    edges={"queued": ("summarizing", PARKED, "cancelled"),
           # a summarize checkpoint moves the run straight on to publish (no ready wait)
           "summarizing": ("summarized", "publishing", "queued", PARKED, "cancelled"),
           "summarized": ("publishing", PARKED, "cancelled"),
           "publishing": ("published", "summarized", PARKED, "cancelled")},
    terminal=frozenset({"published", PARKED, "cancelled"}),
    operator_edges={},
    effects=(app.EFFECT_KIND,),
    initial="queued",
    operator_actions={})

#: the harness's settings DBOS has its own words for: harness name -> the worker's flag.
OWN = {"call_timeout": "call_timeout", "send_timeout": "send_timeout",
       "max_attempts": "max_attempts", "backoff_base": "interval_seconds"}
#: settings the shared scenarios name for mechanisms DBOS does not have (no lease, heartbeat,
#: claim cap, backoff cap or outbox): accepted and left out, so those scenarios run.
ABSENT = ("lease", "heartbeat", "heartbeat_interval", "max_claims", "backoff_cap",
          "outbox_lease", "outbox_max_attempts", "busy_timeout", "keep_job")
SECRETS = ("provider_key",)
KEY_VARIABLE = "OPENAI_API_KEY"
DEFAULTS = {"call_timeout": 5.0, "send_timeout": 5.0, "max_attempts": 4, "backoff_base": 0.05}


def read_settings(table: dict[str, Any]) -> dict[str, Any]:
    """The settings DBOS uses from an [engine] table, checked; ValueError names the field."""
    known = (*OWN, *ABSENT, *SECRETS, "model")
    for name in table:
        if name not in known:
            raise ValueError(f"unknown dbos setting {name!r} (known: {', '.join(known)})")
    values = {**DEFAULTS, **{k: v for k, v in table.items() if k in OWN}}
    for name, value in values.items():
        integer = name == "max_attempts"
        if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
            raise ValueError(f"dbos setting {name} must be a{'n integer' if integer else ' number'},"
                             f" got {value!r}")
        if not value > 0 or value == float("inf"):
            raise ValueError(f"dbos setting {name} must be a finite number above 0, got {value!r}")
    for name in (*SECRETS, "model"):
        if name in table and not isinstance(table[name], str):
            raise ValueError(f"dbos setting {name} must be a string")
    return {**values, **{k: table[k] for k in (*SECRETS, "model") if k in table}}


class DbosEngine:
    """The document pipeline on DBOS, run through `python -m examples.dbos_pipeline`."""

    name = "dbos"
    pipeline = PIPELINE
    capabilities: frozenset[str] = frozenset()
    #: no crash points (DBOS's own code has none the harness can arm), so no role either
    point_roles: dict[str, tuple[str, ...]] = {}

    # --- processes -------------------------------------------------------------------------

    def command(self, role: str, ctx: ProcessContext) -> Command:
        """argv and environment of one DBOS executor; the provider key goes in the
        environment only. Its executor id is its role and slot, so that a restarted slot
        recovers its predecessor's workflows, as DBOS recovers an executor on start-up."""
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        table = read_settings(ctx.engine)
        if ctx.call_timeout is not None:
            table["call_timeout"] = ctx.call_timeout
        argv = [sys.executable, "-m", "examples.dbos_pipeline", "worker", "--db", ctx.db,
                "--executor-id", f"{role}-{ctx.slot}", "--provider-url", ctx.provider_url,
                "--receiver-url", ctx.receiver_url]
        for name, flag in OWN.items():
            argv += [f"--{flag.replace('_', '-')}", str(table[name])]
        if "model" in table:
            argv += ["--model", table["model"]]
        env = {KEY_VARIABLE: table["provider_key"]} if table.get("provider_key") else {}
        return Command(argv, env)

    @staticmethod
    def worker_of(spawn: dict[str, Any]) -> str:
        """The executor id a process the harness started runs under (see `command`): the
        pipeline's plain HTTP client names no worker, so the fakes tie its calls to the
        process on the socket, and this to the executor id DBOS's rows name."""
        return f"{spawn['role']}-{spawn['slot']}"

    def settings(self, table: dict[str, Any]) -> EngineSettings:
        """The scenario's [engine] table in the harness's terms; ValueError names the field.
        No lease, heartbeat or claim cap: DBOS has none."""
        s = read_settings(table)
        return EngineSettings(call_timeout=float(s["call_timeout"]),
                              max_attempts=s["max_attempts"],
                              send_timeout=float(s["send_timeout"]))

    # --- observer --------------------------------------------------------------------------

    def install(self, db: str) -> None:
        """Create DBOS's system database (DBOS's own migrations, run by a DBOS process) and the
        audit triggers on its tables."""
        done = subprocess.run([sys.executable, "-m", "examples.dbos_pipeline", "init", "--db", db],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise RuntimeError(f"DBOS could not create its system database at {db}: "
                               f"{done.stderr[-1000:]}")
        with _connection(db) as conn:
            observer.install(conn)
            conn.commit()

    def operations(self, db: str) -> list[Event]:
        with _connection(db) as conn:
            return observer.read(conn)

    def progress(self, db: str) -> dict[str, Any]:
        states: dict[str, int] = {}
        for row in self._jobs(db).values():
            states[row["state"]] = states.get(row["state"], 0) + 1
        return {"states": states, "unsent": 0}   # no outbox: nothing waits to be sent

    def snapshot(self, db: str) -> dict[str, Any]:
        with _connection(db) as conn:
            memos = [{"job": job, "step": name, "cost": None} for job, name in conn.execute(
                "SELECT workflow_uuid, function_name FROM operation_outputs"
                " WHERE function_name = 'summarize' AND error IS NULL")]
        return {"jobs": self._jobs(db), "memos": memos, "outbox": [], "spend": None,
                "orphans": {}}

    def _jobs(self, db: str) -> dict[str, dict]:
        with _connection(db) as conn:
            hashes = observer.payload_hashes(conn)
            outputs: dict[str, set[str]] = {}
            for job, name in conn.execute("SELECT workflow_uuid, function_name FROM"
                                          " operation_outputs WHERE error IS NULL"):
                outputs.setdefault(job, set()).add(name)
            rows = conn.execute("SELECT s.workflow_uuid, s.status, s.recovery_attempts,"
                                " o.error FROM workflow_status s LEFT JOIN workflow_output o"
                                " ON o.workflow_uuid = s.workflow_uuid").fetchall()
        return {job: {"state": observer.state_of(status, outputs.get(job, set())),
                      "attempts": None, "claims": recovery, "last_error": observer.error_of(error),
                      "payload_hash": hashes.get(job),
                      "cause": "attempts" if status == "ERROR" else None}
                for job, status, recovery, error in rows}

    # --- controls --------------------------------------------------------------------------

    def submit(self, db: str, job_id: str, payload: Any) -> str:
        """Enqueue the workflow with the job id as its workflow id (DBOS's idempotency):
        "exists" for the same document again, "rejected" for another under the same id."""
        canonical_json(payload)  # refuse what JSON cannot hold before DBOS pickles it
        known = self._existing(db, job_id, payload)
        if known is not None:
            return known
        from dbos import DBOSClient
        from dbos._error import DBOSWorkflowIDInUseError
        client = DBOSClient(system_database_url=f"sqlite:///{db}")
        try:
            # "reject": a concurrent submit of the same id is told apart, not attached to
            client.enqueue({"queue_name": app.QUEUE, "workflow_name": app.WORKFLOW,
                            "workflow_id": job_id, "workflow_id_reuse_policy": "reject"},
                           payload)
        except DBOSWorkflowIDInUseError:
            return self._existing(db, job_id, payload) or "exists"
        finally:
            client.destroy()
        return "created"

    def _existing(self, db: str, job_id: str, payload: Any) -> str | None:
        """"exists" or "rejected" for a workflow id already enqueued, None for a new one."""
        with _connection(db) as conn:
            row = conn.execute("SELECT inputs FROM workflow_input WHERE workflow_uuid = ?",
                               (job_id,)).fetchone()
        if row is None:
            return None
        same = canonical_json(observer.payload_of(row[0])) == canonical_json(payload)
        return "exists" if same else "rejected"


@contextmanager
def _connection(db: str) -> Iterator[sqlite3.Connection]:
    conn = sqlite3.connect(db, timeout=30.0)
    try:
        yield conn
    finally:
        conn.close()


DBOS_ENGINE = DbosEngine()
