"""Progress latency: a claim that waited for a lease nobody used is told apart from one that
followed a release."""
from __future__ import annotations

from chaos.reports.progress import progress_latency


def op(t, type_, frm, to, worker="w1", lease_until=0.0, next_run_at=None, **extra):
    return {"t": t, "src": "engine", "type": type_, "job": "j", "from": frm, "to": to,
            "worker": worker, "lease_until": lease_until, "next_run_at": next_run_at, **extra}


def test_a_memo_hit_that_keeps_its_lease_shows_as_a_wait_of_a_whole_lease():
    history = [op(0.0, "submitted", None, "pending"),
               op(1.0, "claimed", "pending", "pending", lease_until=31.0),  # then nothing
               op(31.2, "claimed", "pending", "pending", worker="w2", lease_until=61.2)]
    held = progress_latency(history)["after_held_lease"]
    assert held["count"] == 1 and held["max"] == 30.2
    assert progress_latency(history)["after_holder_alive"]["count"] == 1
    assert progress_latency(history)["slowest"][0]["job"] == "j"


def test_a_lease_left_by_a_holder_that_died_is_a_crash_s_price_not_a_live_holder_s():
    history = [op(1.0, "claimed", "pending", "pending", lease_until=31.0, pid=7),
               {"t": 2.0, "src": "process", "type": "exit", "pid": 7, "killed": True},
               op(31.2, "claimed", "pending", "pending", worker="w2", lease_until=61.2)]
    result = progress_latency(history)
    assert result["after_holder_died"]["count"] == 1
    assert result["after_holder_alive"] == {"count": 0} and result["slowest"] == []


def test_a_claim_after_a_release_or_a_retry_time_waits_only_its_own_latency():
    history = [op(0.0, "submitted", None, "pending"),
               op(1.0, "claimed", "pending", "fetching", lease_until=31.0),
               op(2.0, "state", "fetching", "pending", next_run_at=4.0),   # a retry at 4.0
               op(4.1, "claimed", "pending", "fetching", worker="w2", lease_until=34.1)]
    result = progress_latency(history)
    assert result["after_held_lease"] == {"count": 0}
    assert result["after_release"]["count"] == 2 and result["after_release"]["max"] == 1.0
    assert abs(result["after_release"]["total"] - 1.1) < 1e-9


def test_moving_on_under_a_held_lease_is_not_a_wait():
    history = [op(1.0, "claimed", "pending", "fetching", lease_until=31.0),
               op(2.0, "state", "fetching", "fetched"),
               op(2.0, "claimed", "fetched", "extracting", lease_until=31.0, continued=True)]
    assert progress_latency(history)["claims"] == 0
