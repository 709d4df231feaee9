"""The operator's read-only SQL for SQLite: the four queries, the job list and the alerts.
They change nothing, so they are not part of the engine's safety code
(`engine/store/operator.py` holds the actions)."""
from __future__ import annotations

from typing import Callable


class OperatorQueries:
    """Mixed into a SQLite store: needs `query()`."""

    query: Callable[..., list[dict]]

    # -- the four queries --------------------------------------------------------------

    def status(self, now: float) -> list[dict]:
        """1. Where is everything? Jobs per state and their average age in seconds."""
        return self.query("SELECT state, COUNT(*) AS jobs, ROUND(AVG(? - updated)) AS avg_age_s"
                          " FROM job GROUP BY state ORDER BY 2 DESC, 1", (now,))

    def outbox_status(self, now: float) -> list[dict]:
        """Beside `status`: outbox rows per state and the age of the oldest, in seconds.

        pending: waiting for a sender; sending: leased by a sender now; sent; dead: given up
        (a job is `delivered` once its rows are written, before any of them is sent).
        """
        return self.query(
            "WITH r AS (SELECT CASE WHEN sent_at IS NOT NULL THEN 'sent'"
            "  WHEN dead_at IS NOT NULL THEN 'dead' WHEN lease_until > ? THEN 'sending'"
            "  ELSE 'pending' END AS state, created FROM outbox)"
            " SELECT state, COUNT(*) AS rows, ROUND(? - MIN(created)) AS oldest_age_s FROM r"
            " GROUP BY state ORDER BY CASE state WHEN 'pending' THEN 1 WHEN 'sending' THEN 2"
            "  WHEN 'sent' THEN 3 ELSE 4 END", (now, now))

    def unsent(self, now: float, older_than: float, limit: int = 50) -> list[dict]:
        """Outbox rows neither sent nor dead-lettered, created more than `older_than` s ago."""
        return self.query("SELECT id, job_id, kind, attempts, ROUND(? - created) AS age_s,"
                          " last_error FROM outbox WHERE sent_at IS NULL AND dead_at IS NULL"
                          " AND created < ? ORDER BY created, id LIMIT ?",
                          (now, now - older_than, limit))

    def stuck(self, now: float, limit: int = 50) -> list[dict]:
        """2. What is stuck? Jobs whose lease expired while they were being worked."""
        return self.query("SELECT id, state, attempts, claims, lease_owner, last_error FROM job"
                          " WHERE lease_until > 0 AND lease_until < ? ORDER BY updated LIMIT ?",
                          (now, limit))

    def failures(self, parked: frozenset[str]) -> list[dict]:
        """3. What is failing, and is it one cause or many? Parked jobs by their whole error."""
        marks = ",".join("?" * len(parked))
        return self.query(f"SELECT state, COUNT(*) AS jobs, last_error AS error"
                          f" FROM job WHERE state IN ({marks}) GROUP BY state, error"
                          f" ORDER BY 2 DESC, 1, 3", tuple(sorted(parked)))

    def jobs(self, states: frozenset[str], now: float, limit: int = 50) -> tuple[list[dict], int]:
        """Which jobs, by id? The jobs in `states`, oldest write first, at most `limit`: id,
        pipeline, state, attempts, age_s (seconds since its last write), error; and how many
        jobs are in `states` in all (one statement, so the two agree)."""
        marks = ",".join("?" * len(states))
        rows = self.query(f"SELECT id, pipeline, state, attempts, ROUND(? - updated) AS age_s,"
                          f" last_error AS error, COUNT(*) OVER () AS total FROM job"
                          f" WHERE state IN ({marks}) ORDER BY updated, id LIMIT ?",
                          (now, *sorted(states), limit))
        total = rows[0]["total"] if rows else 0
        return [{k: v for k, v in r.items() if k != "total"} for r in rows], total

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

    def alerts(self, now: float, terminal: frozenset[str], parked: frozenset[str],
               unsent_after: float = 300.0) -> dict:
        """The oldest job in a non-terminal state, parked rows, dead letters, expired leases,
        and outbox rows still unsent `unsent_after` seconds after they were written."""
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
                "dead_letters": dead, "stuck": len(self.stuck(now, limit=1000)),
                "unsent_after_s": unsent_after, "unsent": self.unsent(now, unsent_after)}
