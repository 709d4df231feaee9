"""The no_state_guard mutant's claim on PostgreSQL: the design article's claim, as it would be
written against this store. The reference claims in ONE statement that locks the due row
(FOR UPDATE SKIP LOCKED) and re-checks it on the row's newest version; this one reads a due
job in one statement and takes it in a later transaction with an update guarded by lease
time alone (`lease_until <= now`), not by the state it read, as the SQLite mutant does."""
from __future__ import annotations

from typing import Any, Callable

from engine import hooks
from engine.store import Claim
from engine.store.postgres import NOW

PICK = ("SELECT id, state, claims, attempts FROM job WHERE pipeline=%(pipeline)s AND"
        f" next_run_at IS NOT NULL AND next_run_at <= {NOW} ORDER BY next_run_at LIMIT 1")
TAKE = (f"UPDATE job SET state=%(working)s, claims=%(claims)s, lease_until={NOW} + %(lease)s,"
        f" next_run_at={NOW} + %(lease)s, lease_owner=%(worker)s, lease_token=lease_token+1,"
        f" updated_by=%(worker)s, updated={NOW} WHERE id=%(job)s AND lease_until <= {NOW}"
        " RETURNING lease_token, payload")


def article_claim(original: Callable) -> Callable:
    """PostgresStore.claim replaced (`original`: the reference's, which still parks a job
    past the crash-loop cap, as the SQLite mutant keeps that cap too)."""
    def claim(self: Any, pipeline, worker_id: str, now: float, lease: float,
              max_claims: int) -> Claim | None:
        row = self._read(PICK, self._params(now, pipeline=pipeline.name)).fetchone()
        if row is None:
            return None
        job_id, state, claims, attempts = row
        step = pipeline.step_for(state)
        claims = 0 if state == step.ready else claims
        if claims >= max_claims:
            return original(self, pipeline, worker_id, now, lease, max_claims)

        def take(cur: Any) -> Claim | None:
            got = cur.execute(TAKE, self._params(
                now, working=step.working, claims=claims + 1, lease=lease, worker=worker_id,
                job=job_id)).fetchone()
            if got is None:
                return None  # someone took it first; poll again
            memos = dict(cur.execute("SELECT step, output FROM step_result WHERE job_id=?",
                                     (job_id,)).fetchall())
            hooks.crashpoint("claim.before_commit")
            return Claim(job_id=job_id, step=step, lease_token=got[0], claims=claims + 1,
                         attempts=attempts, lease_until=now + lease, payload=got[1],
                         memos=memos)

        return self._write(take, idempotent=False)
    return claim
