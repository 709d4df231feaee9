"""The operator's SQL for SQLite: the four queries, the alerts and the operator actions.

Actions are compare-and-swap writes on the job's state that bump its lease token, so a worker
that still believes it owns the job is fenced out of anything it writes afterwards.
"""
from __future__ import annotations

import sqlite3
from contextlib import AbstractContextManager
from typing import Any, Callable

from ..states import IllegalTransition, Pipeline, get_pipeline
from .base import DatabaseError, canonical_json


class OperatorError(ValueError):
    """An operator action that does not apply to the job as it stands (nothing changed)."""


class OperatorSQL:
    """Mixed into a SQLite store: needs `conn`, `write()` and `query()`."""

    conn: sqlite3.Connection
    write: Callable[[], AbstractContextManager[sqlite3.Connection]]
    query: Callable[..., list[dict]]

    # -- the four queries --------------------------------------------------------------

    def status(self, now: float) -> list[dict]:
        """1. Where is everything? Jobs per state and their average age in seconds."""
        return self.query("SELECT state, COUNT(*) AS jobs, ROUND(AVG(? - updated)) AS avg_age_s"
                          " FROM job GROUP BY state ORDER BY 2 DESC, 1", (now,))

    def stuck(self, now: float, limit: int = 50) -> list[dict]:
        """2. What is stuck? Jobs whose lease expired while they were being worked."""
        return self.query("SELECT id, state, attempts, claims, lease_owner, last_error FROM job"
                          " WHERE lease_until > 0 AND lease_until < ? ORDER BY updated LIMIT ?",
                          (now, limit))

    def failures(self, parked: frozenset[str]) -> list[dict]:
        """3. What is failing, and is it one cause or many? Parked jobs by error."""
        marks = ",".join("?" * len(parked))
        return self.query(f"SELECT state, substr(last_error, 1, 60) AS error, COUNT(*) AS jobs"
                          f" FROM job WHERE state IN ({marks}) GROUP BY state, error"
                          f" ORDER BY 3 DESC", tuple(sorted(parked)))

    def costs(self, now: float, window: float = 86400.0) -> list[dict]:
        """4. Which step costs the money? Committed cost per step, beside all billed spend.

        wasted = billed (every recorded call) - committed (the calls whose results were kept).
        """
        return self.query(
            "WITH c AS (SELECT step, COUNT(*) AS results, SUM(cost) AS committed FROM step_result"
            "  WHERE at > ? GROUP BY step),"
            " b AS (SELECT step, COUNT(*) AS calls, SUM(COALESCE(cost, 0)) AS billed FROM spend"
            "  WHERE started > ? GROUP BY step)"
            " SELECT c.step, c.results, ROUND(c.committed, 6) AS committed,"
            "  ROUND(c.committed / c.results, 6) AS mean, COALESCE(b.calls, 0) AS calls,"
            "  ROUND(COALESCE(b.billed, 0), 6) AS billed,"
            "  ROUND(MAX(COALESCE(b.billed, 0) - c.committed, 0), 6) AS wasted"
            " FROM c LEFT JOIN b USING (step) ORDER BY committed DESC",
            (now - window, now - window))

    def alerts(self, now: float, terminal: frozenset[str], parked: frozenset[str]) -> dict:
        """The oldest job in a non-terminal state, parked rows, dead letters, expired leases."""
        done = tuple(sorted(terminal))
        oldest = self.query(
            f"SELECT id, state, ROUND(? - created) AS age_s FROM job WHERE state NOT IN"
            f" ({','.join('?' * len(done))}) ORDER BY created LIMIT 1", (now, *done))
        marks = ",".join("?" * len(parked))
        parked_rows = self.query(f"SELECT state, COUNT(*) AS jobs FROM job WHERE state IN"
                                 f" ({marks}) GROUP BY state ORDER BY 1", tuple(sorted(parked)))
        dead = self.query("SELECT id, job_id, kind, attempts, last_error FROM outbox"
                          " WHERE dead_at IS NOT NULL ORDER BY id LIMIT 50")
        return {"oldest_unfinished": oldest[0] if oldest else None, "parked": parked_rows,
                "dead_letters": dead, "stuck": len(self.stuck(now, limit=1000))}

    # -- actions ---------------------------------------------------------------------

    def _job_for_action(self, conn: sqlite3.Connection, job_id: str) -> tuple[Pipeline, dict]:
        cur = conn.execute("SELECT * FROM job WHERE id=?", (job_id,))
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
