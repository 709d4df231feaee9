"""A row the harness held locked (the row_lock fault, PostgreSQL) excuses only what that row's
lock explains: no claim of that job (or outbox row) while it was held, and its holder's
writes kept waiting; every other job, and the same job outside the lock, is judged as
before. An engine that promises leases from their write (lease_from_write) gets no excuse
for a lock wait."""
from __future__ import annotations

from builders import W1, W2, job, nemesis, snapshot_with_effects

from chaos.checkers.lease_kept import check_lease_kept
from chaos.checkers.ops import disturbed, harness_windows
from chaos.checkers.promptness import check_claims_prompt

LATENCY = 0.03


def row_lock(a: float, b: float, row: str = "a", table: str = "job") -> list[dict]:
    return [nemesis(a, "row_lock", table=table, row=row, job=row, seconds=b - a),
            nemesis(b, "row_lock_end", table=table, row=row, job=row)]


def test_a_row_lock_is_a_window_of_its_own_row_only():
    windows = harness_windows(row_lock(1.0, 2.0) + row_lock(1.5, 3.0, row=7, table="outbox"))
    assert windows["row_locks"] == [("job", "a", 1.0, 2.0), ("outbox", 7, 1.5, 3.0)]
    assert windows["locks"] == []  # no other writer is held up
    assert disturbed(windows, None, 1.5, 1.6, job="a")
    assert not disturbed(windows, None, 1.5, 1.6, job="b")
    assert not disturbed(windows, None, 2.1, 2.5, job="a")


def test_an_unended_row_lock_runs_to_the_end():
    windows = harness_windows(row_lock(1.0, 2.0)[:1])
    assert windows["row_locks"] == [("job", "a", 1.0, float("inf"))]


def declared(history: list[dict]):
    snap = snapshot_with_effects(history)
    snap["settings"] = {**snap["settings"], "claim_latency": LATENCY}
    return check_claims_prompt(sorted(history, key=lambda e: e["t"]), snap)


def waiting_beside_a_free_worker(claimed_at: float) -> list[dict]:
    """W1 is free from 1.0; job a is due from 1.0 and claimed by W2 at `claimed_at`."""
    return [job(0.9, "x", "pending", "fetching", W1, 1, old_token=0, claims=1, lease_until=3.0),
            job(1.0, "x", "fetching", "delivered", W1, 1),
            job(1.0, "a", None, "pending", "submitter", 0, op="insert", next_run_at=1.0),
            job(claimed_at, "a", "pending", "fetching", W2, 1, old_token=0, claims=1,
                lease_until=claimed_at + 2.0),
            job(claimed_at + 0.1, "a", "fetching", "delivered", W2, 1)]


def test_a_job_passed_over_while_its_row_was_locked_is_not_a_late_claim():
    history = waiting_beside_a_free_worker(4.0) + row_lock(1.01, 3.95)
    verdict = declared(history)
    assert verdict.status == "pass", verdict.reason


def test_the_wait_after_the_lock_went_is_judged():
    verdict = declared(waiting_beside_a_free_worker(6.0) + row_lock(1.01, 3.0))
    assert verdict.by_type == {"due-job-waited": 1}, verdict.reason


def test_another_jobs_row_lock_excuses_nothing():
    verdict = declared(waiting_beside_a_free_worker(4.0) + row_lock(1.01, 3.95, row="other"))
    assert verdict.by_type == {"due-job-waited": 1}, verdict.reason


def short_claim(lease_from_write: bool, locked: str | None) -> tuple[list[dict], dict]:
    """W1's claim of job a commits at 2.0 with a lease from 0.5: it waited 1.5 s (a row lock,
    if `locked` names the job held)."""
    history = [job(0.1, "a", None, "pending", "submitter", 0, op="insert", next_run_at=0.1),
               job(2.0, "a", "pending", "fetching", W1, 1, old_token=0, claims=1,
                   lease_until=2.5)]
    if locked:
        history += row_lock(0.4, 1.99, row=locked)
    snap = snapshot_with_effects(history)
    snap["settings"] = {**snap["settings"], "lease": 2.0, "lease_from_write": lease_from_write}
    return sorted(history, key=lambda e: e["t"]), snap


def test_a_short_lease_under_a_row_lock_on_its_job_is_excused_for_a_half_lease_engine():
    assert check_lease_kept(*short_claim(False, None)).by_type.get("claim-lease-short")
    assert not check_lease_kept(*short_claim(False, "a")).by_type.get("claim-lease-short")
    assert check_lease_kept(*short_claim(False, "b")).by_type.get("claim-lease-short")


def test_a_lock_wait_is_no_excuse_where_leases_run_from_their_write():
    assert check_lease_kept(*short_claim(True, "a")).by_type.get("claim-lease-short")
