"""The harness's lease_expiry fault on the reference engine's SQLite store: every live lease,
a job's and an outbox row's, ended at once. Used by the adapter (real runs) and by its
in-process driver (`ninelives sim`, on the virtual clock)."""
from __future__ import annotations


def expire_leases(conn, now: float) -> int:
    """End every live lease now, a job's and an outbox row's, in the caller's transaction;
    how many. The rows become due at once, as a lease that ran out would."""
    past = now - 0.001
    jobs = conn.execute("UPDATE job SET lease_until=?, next_run_at=?, updated_by='nemesis'"
                        " WHERE lease_until > ?", (past, past, now)).rowcount
    rows = conn.execute("UPDATE outbox SET lease_until=?, next_attempt_at=?,"
                        " updated_by='nemesis' WHERE sent_at IS NULL AND dead_at IS NULL"
                        " AND lease_until > ?", (past, past, now)).rowcount
    return jobs + rows
