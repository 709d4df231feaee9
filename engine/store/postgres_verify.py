"""Whether a write whose COMMIT's answer was lost committed, read from the rows it writes:
what decides when its transaction id cannot (the server restarted; see
PostgresSession._outcome). Each check names what only that write leaves behind."""
from __future__ import annotations

from typing import Any

from .base import Claim, OutboxClaim, Spend


class CommitEvidence:
    """The checks, for a store with `_read` (a PostgresSession)."""

    _read: Any

    def _holds(self, table: str, claim: Claim | OutboxClaim | None, owner: str) -> bool:
        """Whether a claim committed: its row still carries its token and its owner (worker
        ids are unique per boot, and only a claim writes an owner). A claim that committed
        and was since taken over counts as not committed: it holds nothing any more, and
        claiming afresh is what the caller would do either way. No claim (nothing was due):
        nothing to keep, run it again."""
        if claim is None:
            return False
        key = claim.job_id if table == "job" else claim.id
        return self._read(f"SELECT 1 FROM {table} WHERE id=? AND lease_token=? AND"
                          " lease_owner=?", (key, claim.lease_token, owner)).fetchone() is not None

    def _finished(self, claim: Claim, spend: Spend | None, moved: int) -> bool:
        """Whether a step's completion or failure committed: its spend record is there (one
        per call: its worker, token and start time), or else it moved the job out of the
        working state under its token (nothing else does). A body fenced out wrote no
        transition: running it again is harmless."""
        if spend is not None:
            return self._spent(spend)
        if moved != 1:
            return False
        row = self._read("SELECT lease_token, state FROM job WHERE id=?",
                         (claim.job_id,)).fetchone()
        return row is not None and row[0] == claim.lease_token and row[1] != claim.step.working

    def _spent(self, spend: Spend) -> bool:
        return self._read("SELECT 1 FROM spend WHERE job_id=? AND step=? AND worker=? AND"
                          " lease_token=? AND started=?",
                          (spend.job_id, spend.step, spend.worker, spend.lease_token,
                           spend.started)).fetchone() is not None
