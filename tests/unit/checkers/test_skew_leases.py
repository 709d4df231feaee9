"""Workers on a skewed clock, judged by whose clock places leases (settings.lease_clock):
where the store's does (PostgreSQL), a skewed worker that takes a live lease fails
lease-exclusive and one whose lease runs past a lease fails lease-kept; where each worker's
own does (SQLite), what the skew did is counted and stated as expected, not failed; and a
worker on the true clock that takes a live lease fails on either."""
from __future__ import annotations

from builders import W1, W2, call, job, nemesis, snapshot, spend

from chaos.checkers.lease_kept import check_lease_kept
from chaos.checkers.leases import check_fenced_writes, check_lease_exclusive

SKEW = 5.0


def settings(clock: str) -> dict:
    base = snapshot()["settings"]
    return {**base, "lease_clock": clock, "heartbeat_interval": 0.5}


def snap(clock: str, **overrides) -> dict:
    return snapshot(settings=settings(clock), **overrides)


def skewed_w2() -> list[dict]:
    """W2's clock runs SKEW seconds ahead (the runner's record, as the simulation makes it)."""
    return [nemesis(0.5, "skew", pid=102, seconds=SKEW)]


def stolen(by_w2_at: float = 2.0) -> list[dict]:
    """W1 claims j1 with a lease to 3.1; W2 claims it at `by_w2_at`."""
    return [job(1.0, "j1", None, "pending", "submit", 0, op="insert"),
            job(1.1, "j1", "pending", "fetching", W1, 1, old_token=0, claims=1,
                lease_until=3.1),
            job(by_w2_at, "j1", "fetching", "fetching", W2, 2, old_token=1, claims=2,
                lease_until=by_w2_at + 2.0)]


def test_a_skewed_worker_taking_a_live_lease_fails_where_the_store_clock_places_leases():
    v = check_lease_exclusive(skewed_w2() + stolen(), snap("store"))
    assert v.valid is False and v.by_type == {"live-lease-taken": 1}
    assert "claimed it at" in v.reason and "1.100 s later" in v.reason
    assert "its clock +5 s off" in v.reason
    assert v.metrics["skew"]["live_leases_taken"] == 1 and v.metrics["skew"]["judged"] is True


def test_the_same_take_is_counted_and_expected_where_each_workers_clock_places_leases():
    v = check_lease_exclusive(skewed_w2() + stolen(), snap("worker"))
    assert v.valid is True
    skew = v.metrics["skew"]
    assert skew["judged"] is False and skew["lease_clock"] == "worker"
    assert (skew["claims"], skew["live_leases_taken"]) == (1, 1)
    assert skew["workers"] == [W2] and skew["seconds"] == [SKEW]
    assert "1 of a lease still live" in v.reason and "expected, not judged" in v.reason


def test_a_worker_on_the_true_clock_taking_a_live_lease_fails_on_either_clock():
    for clock in ("worker", "store"):
        v = check_lease_exclusive(stolen(), snap(clock))
        assert v.valid is False and v.by_type == {"live-lease-taken": 1}, clock
        assert "skew" not in v.metrics


def test_a_skewed_claim_after_the_lease_ended_holds_and_says_it_was_judged():
    v = check_lease_exclusive(skewed_w2() + stolen(by_w2_at=3.2), snap("store"))
    assert v.valid is True
    assert v.metrics["skew"]["live_leases_taken"] == 0
    assert "0 of a lease still live" in v.reason and "judged" in v.reason


def test_a_lease_the_harness_ended_is_no_live_lease():
    history = stolen(by_w2_at=2.0)
    expiry = job(1.5, "j1", "fetching", "fetching", "nemesis", 1, lease_until=1.499)
    history.insert(2, expiry)
    v = check_lease_exclusive(skewed_w2() + history, snap("store"))
    assert v.valid is True, v.reason


def test_a_lease_released_by_its_holder_is_no_live_lease():
    history = stolen(by_w2_at=2.0)
    history.insert(2, job(1.5, "j1", "fetching", "fetching", W1, 1, attempts=1,
                          lease_until=0.0, next_run_at=1.5, last_error="boom"))
    v = check_lease_exclusive(history, snap("store"))
    assert v.valid is True, v.reason


def kept_past_its_end(clock: str) -> list[dict]:
    """Skewed W2 claims j1 writing a lease SKEW seconds past one lease (its clock is ahead)."""
    return skewed_w2() + [
        job(1.0, "j1", None, "pending", "submit", 0, op="insert"),
        job(1.1, "j1", "pending", "fetching", W2, 1, old_token=0, claims=1,
            lease_until=1.1 + SKEW + 2.0)]


def test_a_skewed_worker_keeping_its_lease_past_a_lease_fails_lease_kept_on_the_store_clock():
    v = check_lease_kept(kept_past_its_end("store"), snap("store"))
    assert v.valid is False and "claim-lease-long" in v.by_type


def test_on_the_worker_clock_the_long_lease_is_counted_not_failed():
    history = kept_past_its_end("worker")
    assert "claim-lease-long" not in check_lease_kept(history, snap("worker")).by_type
    skew = check_lease_exclusive(history, snap("worker")).metrics["skew"]
    assert skew["leases_kept_past_end"] == 1 and skew["judged"] is False


def begun_after(clock_started: float) -> list[dict]:
    """Skewed W2 holds j1 to 3.1 (the store's clock) and records a call it began at
    `clock_started` by its own clock."""
    return skewed_w2() + [
        job(1.0, "j1", None, "pending", "submit", 0, op="insert"),
        job(1.1, "j1", "pending", "fetching", W2, 1, old_token=0, claims=1, lease_until=3.1),
        call(clock_started - SKEW, clock_started - SKEW + 0.05, "j1", "fetch", W2),
        spend(clock_started - SKEW + 0.06, "j1", "fetch", W2, 1, started=clock_started)]


def test_a_skewed_workers_call_start_is_read_on_the_true_clock_where_the_store_places_leases():
    # began at 2.0 true (7.0 by its clock): inside the lease
    within = check_fenced_writes(begun_after(2.0 + SKEW), snap("store"))
    assert "call-after-lease" not in within.by_type, within.reason
    # began at 3.5 true (8.5 by its clock): after the lease ran out at 3.1
    after = check_fenced_writes(begun_after(3.5 + SKEW), snap("store"))
    assert "call-after-lease" in after.by_type
