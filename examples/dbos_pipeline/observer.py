"""The observer of DBOS's own system tables: triggers that copy every change of a workflow's
status row and every step output DBOS checkpoints into an audit table in the same transaction,
and the replay that reads them, job by job, as the history's operations (`chaos.history`).
DBOS knows nothing of it.

A job is a workflow (its id is the job's id); its state is read from what DBOS committed:
ENQUEUED is `queued` (or `summarized` once its summarize output is checkpointed: a workflow
recovered after that step waits on the queue again), PENDING is the step it is in (no output
yet: `summarizing`; the summarize output checkpointed: `publishing`), SUCCESS `published`,
ERROR and MAX_RECOVERY_ATTEMPTS_EXCEEDED `failed`, CANCELLED `cancelled`.
"""
from __future__ import annotations

import base64
import pickle
import sqlite3
from typing import Any

from chaos.history import Event, payload_hash

NOW = "((julianday('now') - 2440587.5) * 86400.0)"
AUDIT = ("CREATE TABLE IF NOT EXISTS ninelives_audit (seq INTEGER PRIMARY KEY, t REAL NOT NULL,"
         " tbl TEXT NOT NULL, op TEXT NOT NULL, job TEXT NOT NULL, status TEXT,"
         " executor TEXT, recovery INTEGER, step TEXT, failed INTEGER)")
_STATUS = ("NEW.workflow_uuid, NEW.status, NEW.executor_id, NEW.recovery_attempts, NULL, NULL")
TRIGGERS = {
    "ninelives_status_insert": ("AFTER INSERT ON workflow_status", "'status', 'insert'", _STATUS),
    # only a change of what the replay reads: DBOS also rewrites updated_at and the like
    "ninelives_status_update": (
        "AFTER UPDATE ON workflow_status WHEN OLD.status IS NOT NEW.status"
        " OR OLD.executor_id IS NOT NEW.executor_id"
        " OR OLD.recovery_attempts IS NOT NEW.recovery_attempts", "'status', 'update'", _STATUS),
    "ninelives_status_delete": ("AFTER DELETE ON workflow_status", "'status', 'delete'",
                                "OLD.workflow_uuid, OLD.status, OLD.executor_id, NULL, NULL, NULL"),
    "ninelives_step_insert": ("AFTER INSERT ON operation_outputs", "'step', 'insert'",
                              "NEW.workflow_uuid, NULL, NULL, NULL, NEW.function_name,"
                              " NEW.error IS NOT NULL"),
}
STEPS = ("summarize", "publish")


def install(conn: sqlite3.Connection, now: str = NOW) -> None:
    """Create the audit table and its triggers on DBOS's tables (idempotent)."""
    conn.execute(AUDIT)
    for name, (when, kind, values) in TRIGGERS.items():
        conn.execute(f"CREATE TRIGGER IF NOT EXISTS {name} {when} BEGIN INSERT INTO"
                     f" ninelives_audit (t, tbl, op, job, status, executor, recovery, step,"
                     f" failed) VALUES ({now}, {kind}, {values}); END")


def payload_of(text: str | None) -> Any:
    """The document a workflow was enqueued with, from DBOS's pickled inputs; None if none."""
    if not text:
        return None
    inputs = pickle.loads(base64.b64decode(text))  # our own store, written by DBOS
    args = inputs.get("args") or ()
    return args[0] if args else None


def error_of(text: str | None) -> str | None:
    """The error a workflow ended with, as text, from DBOS's pickled exception; the stored
    text itself when it cannot be read back here."""
    if not text:
        return None
    try:
        error = pickle.loads(base64.b64decode(text))  # our own store, written by DBOS
    except Exception:  # a class this process cannot import: keep what DBOS stored
        return text[:200]
    return f"{type(error).__name__}: {error}"[:200]


def state_of(status: str | None, outputs: set[str]) -> str:
    """The pipeline state of a workflow from its DBOS status and the steps checkpointed."""
    if status == "ENQUEUED":
        return "summarized" if "summarize" in outputs else "queued"
    if status == "PENDING":
        return "publishing" if "summarize" in outputs else "summarizing"
    return {"SUCCESS": "published", "CANCELLED": "cancelled"}.get(status or "", "failed")


def payload_hashes(conn: sqlite3.Connection) -> dict[str, str | None]:
    """Every workflow's payload fingerprint, from its stored inputs."""
    hashes = {}
    for job, text in conn.execute("SELECT workflow_uuid, inputs FROM workflow_input"):
        payload = payload_of(text)
        hashes[job] = None if payload is None else payload_hash(payload)
    return hashes


def read(conn: sqlite3.Connection) -> list[Event]:
    """Every audit row as operations, in commit order."""
    hashes = payload_hashes(conn)
    events: list[Event] = []
    jobs: dict[str, dict] = {}
    for seq, t, tbl, op, job, status, executor, recovery, step, failed in conn.execute(
            "SELECT seq, t, tbl, op, job, status, executor, recovery, step, failed"
            " FROM ninelives_audit ORDER BY seq"):
        base = {"t": t, "src": "engine", "seq": seq, "completion": "ok", "job": job}
        events += [{**base, **o} for o in replay(jobs, job, tbl, op, status, executor,
                                                 recovery, step, failed, hashes.get(job))]
    return events


#: DBOS counts a step's failed attempts only in the executor's memory, so no operation
#: carries a count: None, not 0 (a 0 would read as a park before any attempt failed).

def _who(executor: str | None) -> dict:
    # DBOS records the executor id, not the process: an executor id outlives its process
    return {"worker": executor, "pid": None, "token": None}


def replay(jobs: dict[str, dict], job: str, tbl: str, op: str, status: str | None,
           executor: str | None, recovery: int | None, step: str | None, failed: int | None,
           digest: str | None) -> list[dict]:
    """The operations one audit row stands for, given (and updating) the job's replayed row."""
    row = jobs.get(job)
    if tbl == "status" and op == "insert":
        jobs[job] = {"status": status, "outputs": set(), "executor": executor,
                     "recovery": recovery or 0, "claims": 0}
        state = state_of(status, set())
        return [{"type": "submitted", "state": state, "from": None, "to": state,
                 "payload_hash": digest}]
    if row is None:
        return []
    before = state_of(row["status"], row["outputs"])
    if tbl == "status" and op == "delete":
        del jobs[job]
        return [{"type": "removed", "from": before, "to": None}]
    ops: list[dict] = []
    if tbl == "step":
        if step in STEPS and not failed:
            row["outputs"].add(step)
            if step == "summarize":  # DBOS stores the step's output, not what it cost
                ops.append({"type": "memo", "op": "insert", "step": step, "cost": None,
                            "actor": "worker", **_who(row["executor"])})
        after = state_of(row["status"], row["outputs"])
        if after != before:
            # the step's checkpoint moves the workflow on to its next step under the same run
            ops.append({"type": "claimed", "step": "publish", "from": before, "to": after,
                        "continued": True, "attempts": None, "claims": row["claims"],
                        "lease_until": None, **_who(row["executor"])})
        return ops
    took = status == "PENDING" and row["status"] != "PENDING"
    row.update(status=status, executor=executor, recovery=recovery or 0)
    after = state_of(status, row["outputs"])
    common = {"from": before, "to": after, "attempts": None, "lease_until": None,
              **_who(executor)}
    if took:
        row["claims"] += 1
        name = "publish" if "summarize" in row["outputs"] else "summarize"
        return [{"type": "claimed", "step": name, "continued": False, "claims": row["claims"],
                 **common}]
    actor = "worker" if status in ("PENDING", "SUCCESS", "ERROR") else "harness"
    if status == "ENQUEUED":
        actor = "worker"  # DBOS's recovery puts a pending workflow back on the queue
    return [{"type": "state", "actor": actor, "next_run_at": None, "last_error": None,
             "cause": "attempts" if status == "ERROR" else None, "heartbeat": False,
             "took_lease": False, "claims": row["claims"], **common}]
