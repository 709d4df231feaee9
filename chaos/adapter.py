"""The system under test: a small adapter between the harness and an engine.

The harness never imports an engine's internals. It asks the adapter how to start a worker
and a sender (a command line), how to prepare a database and install the audit observer,
how to submit a job, how to act as an operator, what the state table is, and for a final
snapshot. `--engine module:object` plugs in any object with this shape; the reference
engine is `chaos.adapter:REFERENCE`, and the broken variants of `ninelives mutants` are
adapters that start a patched engine.
"""
from __future__ import annotations

import importlib
import sqlite3
import sys
import time
from typing import Any, Protocol

from engine import CRASHPOINTS, DOCUMENT, Pipeline, open_store
from engine.store import OperatorError, SubmissionConflict, canonical_json

from . import audit
from .history import Event


class SystemUnderTest(Protocol):
    """What the harness needs from an engine."""

    name: str
    pipeline: Pipeline
    crashpoints: tuple[str, ...]

    def command(self, role: str) -> list[str]:
        """The argv that starts one process of `role` ("worker" or "send"); settings are
        appended as `--name value` flags."""

    def prepare(self, db: str) -> None:
        """Create the database and install the audit observer."""

    def submit(self, db: str, job_id: str, payload: Any) -> str:
        """Submit a job: "created", "exists" or "rejected"."""

    def operator(self, db: str, action: str, job_id: str) -> str:
        """Cancel, requeue or resolve a job; returns what happened (or why not)."""

    def expire_leases(self, db: str) -> int:
        """Expire every in-flight lease now (a forced lease expiry); returns how many."""

    def audit(self, db: str, after_seq: int = 0) -> list[Event]:
        """The audit events committed after `after_seq`."""

    def progress(self, db: str) -> dict[str, Any]:
        """{"states": {state: jobs}, "unsent": outbox rows neither sent nor dead-lettered}."""

    def snapshot(self, db: str) -> dict[str, Any]:
        """jobs, memos, outbox, spend, orphans and integrity of the database now."""


class ReferenceEngine:
    """The reference engine, run through its own CLI (`python -m engine`)."""

    name = "reference"
    pipeline = DOCUMENT
    crashpoints = CRASHPOINTS
    module = "engine"

    def command(self, role: str) -> list[str]:
        return [sys.executable, "-m", self.module, role]

    def prepare(self, db: str) -> None:
        store = open_store(db)
        with store.write() as conn:
            audit.install(conn)
        store.close()

    def _store(self, db: str):
        return open_store(db, busy_timeout=10.0)

    def submit(self, db: str, job_id: str, payload: Any) -> str:
        return self.submit_with(self._store(db), job_id, payload)

    def submit_with(self, store, job_id: str, payload: Any) -> str:
        """Submit through `store` (then closed): "created", "exists" or "rejected"."""
        try:
            return "created" if store.submit(job_id, self.pipeline, payload,
                                             time.time()) else "exists"
        except SubmissionConflict:
            return "rejected"
        finally:
            store.close()

    def operator(self, db: str, action: str, job_id: str) -> str:
        store = self._store(db)
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
                now = time.time()
                return conn.execute(
                    "UPDATE job SET lease_until=?, next_run_at=?, updated_by='nemesis'"
                    " WHERE lease_until > ?", (now - 0.001, now - 0.001, now)).rowcount
        finally:
            store.close()

    def progress(self, db: str) -> dict[str, Any]:
        conn = sqlite3.connect(db, timeout=10.0)
        try:
            states = dict(conn.execute("SELECT state, COUNT(*) FROM job GROUP BY state"))
            unsent = conn.execute("SELECT COUNT(*) FROM outbox WHERE sent_at IS NULL AND"
                                  " dead_at IS NULL").fetchone()[0]
            return {"states": states, "unsent": unsent}
        finally:
            conn.close()

    def audit(self, db: str, after_seq: int = 0) -> list[Event]:
        conn = sqlite3.connect(db, timeout=10.0)
        try:
            return audit.read_audit(conn, after_seq)
        finally:
            conn.close()

    def snapshot(self, db: str) -> dict[str, Any]:
        store = open_store(db, read_only=True)
        try:
            jobs = {r["id"]: {
                "state": r["state"], "attempts": r["attempts"], "claims": r["claims"],
                "lease_token": r["lease_token"], "last_error": r["last_error"],
                "payload_hash": audit.payload_hash(r["payload"]),
                "next_run_at": r["next_run_at"], "lease_until": r["lease_until"]}
                for r in store.query("SELECT * FROM job")}
            memos = [{"job": r["job_id"], "step": r["step"], "cost": r["cost"],
                      "worker": r["worker"], "lease_token": r["lease_token"], "at": r["at"]}
                     for r in store.query("SELECT * FROM step_result")]
            outbox = [{"row": r["id"], "job": r["job_id"], "kind": r["kind"],
                       "key": r["idempotency_key"], "sent_at": r["sent_at"],
                       "dead_at": r["dead_at"], "attempts": r["attempts"],
                       "last_error": r["last_error"]} for r in store.query("SELECT * FROM outbox")]
            spend = [{"job": r["job_id"], "step": r["step"], "worker": r["worker"],
                      "lease_token": r["lease_token"], "started": r["started"],
                      "ended": r["ended"], "outcome": r["outcome"], "cost": r["cost"]}
                     for r in store.query("SELECT * FROM spend")]
            orphans = {f"{name}_without_job": store.query(
                f"SELECT COUNT(*) AS n FROM {table} WHERE job_id NOT IN (SELECT id FROM job)")[0]["n"]
                for name, table in (("memos", "step_result"), ("outbox", "outbox"),
                                    ("spend", "spend"))}
            return {"jobs": jobs, "memos": memos, "outbox": outbox, "spend": spend,
                    "orphans": orphans, "integrity": store.integrity_check()}
        finally:
            store.close()


def integrity(db: str) -> str:
    """PRAGMA integrity_check on its own connection ("ok" when intact)."""
    conn = sqlite3.connect(db, timeout=10.0)
    try:
        return "; ".join(r[0] for r in conn.execute("PRAGMA integrity_check"))
    finally:
        conn.close()


def pipeline_json(pipeline: Pipeline) -> dict:
    """The state table in the snapshot's form."""
    return {
        "name": pipeline.name,
        "steps": [{"name": s.name, "ready": s.ready, "working": s.working, "done": s.done,
                   "parked": s.parked, "alternate": s.alternate} for s in pipeline.steps],
        "edges": {k: list(v) for k, v in pipeline.edges.items()},
        "operator_edges": {k: list(v) for k, v in pipeline.operator_edges.items()},
        "terminal": sorted(pipeline.terminal), "parked": sorted(pipeline.parked_states),
        "ready": sorted(pipeline.ready_states), "working": sorted(pipeline.working_states),
    }


REFERENCE = ReferenceEngine()


def load_engine(spec: str | None) -> SystemUnderTest:
    """The engine named by `--engine`: None or "reference", or `module:object`."""
    if spec in (None, "", "reference"):
        return REFERENCE
    module, _, attr = spec.partition(":")
    if not attr:
        raise ValueError(f"--engine must be 'reference' or module:object, got {spec!r}")
    try:
        target = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"--engine {spec!r}: cannot load it: {exc}") from None
    engine = target() if isinstance(target, type) else target
    for needed in ("command", "prepare", "submit", "snapshot", "audit", "progress", "pipeline"):
        if not hasattr(engine, needed):
            raise ValueError(f"--engine {spec!r} lacks {needed!r} (see chaos.adapter."
                             "SystemUnderTest)")
    return engine


__all__ = ["REFERENCE", "ReferenceEngine", "SystemUnderTest", "canonical_json", "integrity",
           "load_engine", "pipeline_json"]
