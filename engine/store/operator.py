"""The operator's actions, shared by both stores (the four read-only queries and the alerts are
in `queries`).

Actions are compare-and-swap writes on the job's state that bump its lease token, so a worker
that still believes it owns the job is fenced out of anything it writes afterwards.
"""
from __future__ import annotations

import sqlite3
from contextlib import AbstractContextManager
from typing import Any, Callable

from ..states import IllegalTransition, Pipeline, get_pipeline
from .base import DatabaseError, canonical_json
from .queries import OperatorQueries


class OperatorError(ValueError):
    """An operator action that does not apply to the job as it stands (nothing changed)."""


class OperatorSQL(OperatorQueries):
    """Mixed into a SQLite store: needs `conn`, `write()` and `query()`."""

    conn: sqlite3.Connection
    write: Callable[[], AbstractContextManager[sqlite3.Connection]]
    query: Callable[..., list[dict]]
    #: What the action's read of the job appends: nothing on SQLite, whose write
    #: transaction already holds the database's one write lock (BEGIN IMMEDIATE).
    ROW_LOCK = ""

    # -- actions ---------------------------------------------------------------------

    def _job_for_action(self, conn: sqlite3.Connection, job_id: str) -> tuple[Pipeline, dict]:
        # The row is read locked where the write transaction does not lock it already, so a
        # worker's commit between this read and the move waits for the operator instead of
        # turning the move's compare-and-swap into "changed under the operator".
        cur = conn.execute("SELECT * FROM job WHERE id=?" + self.ROW_LOCK, (job_id,))
        row = cur.fetchone()
        if row is None:
            raise OperatorError(f"no job {job_id!r}")
        job = dict(zip([d[0] for d in cur.description], row))
        return get_pipeline(job["pipeline"]), job

    def _operator_move(self, conn: sqlite3.Connection, job: dict, pipeline: Pipeline, to: str,
                       by: str, now: float, next_run_at: float | None) -> None:
        frm = job["state"]
        try:
            pipeline.check(frm, to, operator=True)
        except IllegalTransition:
            raise OperatorError(f"job {job['id']!r} is {frm!r}; an operator cannot move it to "
                                f"{to!r} (allowed from here: "
                                f"{', '.join(pipeline.operator_edges.get(frm, ())) or 'none'})") from None
        n = conn.execute(
            "UPDATE job SET state=?, attempts=0, claims=0, next_run_at=?, lease_until=0,"
            " lease_owner=NULL, lease_token=lease_token+1, last_error=?, updated_by=?,"
            " updated=? WHERE id=? AND state=? AND lease_token=?",
            (to, next_run_at, f"{by}: moved {frm} -> {to}", by, now, job["id"], frm,
             job["lease_token"])).rowcount
        if n != 1:
            raise DatabaseError(f"job {job['id']!r} changed under the operator; nothing done")

    def cancel(self, job_id: str, by: str, now: float) -> str:
        """Cancel a job that is ready or parked. Returns the state it left."""
        with self.write() as conn:
            pipeline, job = self._job_for_action(conn, job_id)
            self._operator_move(conn, job, pipeline, "cancelled", by, now, None)
        return job["state"]

    def requeue(self, job_id: str, by: str, now: float) -> str:
        """Send a parked job back to its step's ready state. Returns the new state."""
        with self.write() as conn:
            pipeline, job = self._job_for_action(conn, job_id)
            step = self._parked_step(pipeline, job)
            self._operator_move(conn, job, pipeline, step.ready, by, now, now)
        return step.ready

    def resolve(self, job_id: str, by: str, now: float, output: Any | None = None) -> str:
        """Settle a parked step by hand: with `output`, record it as the step's result (the
        step is then skipped); without, discard the step's memo so the step runs again."""
        with self.write() as conn:
            pipeline, job = self._job_for_action(conn, job_id)
            step = self._parked_step(pipeline, job)
            conn.execute("DELETE FROM step_result WHERE job_id=? AND step=?", (job_id, step.name))
            if output is not None:
                conn.execute("INSERT INTO step_result (job_id, step, output, cost, at, worker)"
                             " VALUES (?,?,?,0,?,?)",
                             (job_id, step.name, canonical_json(output), now, by))
            self._operator_move(conn, job, pipeline, step.ready, by, now, now)
        return step.ready

    @staticmethod
    def _parked_step(pipeline: Pipeline, job: dict):
        for step in pipeline.steps:
            if job["state"] in (step.parked, step.alternate):
                return step
        raise OperatorError(f"job {job['id']!r} is {job['state']!r}, not parked "
                            f"(parked states: {', '.join(sorted(pipeline.parked_states))})")
