"""The sweep's arithmetic: latency specs, recovery times from a history, the recommendation."""
from __future__ import annotations

import pytest

from chaos.spec.latency import LatencyError, parse_latency
from chaos.commands.sweep import Cell, cell_scenario, recommend, recovery_times
from chaos.spec.scenario import load_scenario


@pytest.mark.parametrize("spec, q, expected", [
    ("fixed:1.5", 0.3, 1.5), ("uniform:1:3", 0.5, 2.0), ("lognormal:0.8:3.0", 0.5, 0.8),
    ("lognormal:0.8:3.0", 0.99, 3.0)])
def test_latency_quantiles(spec, q, expected):
    assert parse_latency(spec).quantile(q) == pytest.approx(expected, rel=1e-6)


def test_latency_from_a_file_is_the_empirical_distribution(tmp_path):
    path = tmp_path / "lat.txt"
    path.write_text("0.2\n0.4\n\n0.6\n0.8\n")
    latency = parse_latency(f"file:{path}")
    assert [latency.quantile(q) for q in (0.0, 0.3, 0.6, 0.99)] == [0.2, 0.4, 0.6, 0.8]


@pytest.mark.parametrize("spec, words", [
    ("fixed", "takes 1"), ("gauss:1", "kind must be"), ("uniform:3:1", "low must not"),
    ("lognormal:3:1", "p50 < p99"), ("fixed:-1", "negative"), ("fixed:abc", "seconds"),
    ("file:/no/such/file", "cannot read")])
def test_bad_latency_specs_are_named(spec, words):
    with pytest.raises(LatencyError, match=words) as err:
        parse_latency(spec)
    assert spec in str(err.value)


def test_a_cell_fits_the_call_timeout_to_the_latency_and_measures_duplicates():
    base = load_scenario("lease-sweep", "smoke")
    cell = cell_scenario(base, Cell(0.5, False), "fixed:2.0")
    assert cell.engine["lease"] == 0.5 and cell.engine["heartbeat"] is False
    assert cell.engine["call_timeout"] > 2.0 and cell.engine["unsafe_long_calls"] is True
    assert cell.expect.duplicate_spend_allowance == float("inf")
    safe = cell_scenario(base, Cell(10.0, False), "fixed:2.0")
    assert safe.engine["unsafe_long_calls"] is False


def engine_op(t, type_, job, frm, to, worker, pid, actor="worker", **fields):
    return {"t": t, "src": "engine", "type": type_, "job": job, "from": frm, "to": to,
            "worker": worker, "pid": pid, "actor": actor, **fields}


def test_recovery_is_from_the_kill_to_the_next_write_by_another_worker():
    w1, w2 = "w1@h", "w2@h"     # worker ids of any format: the pid is the operation's
    events = [
        engine_op(1.0, "claimed", "j", "pending", "fetching", w1, 11, step="fetch",
                  continued=False),
        engine_op(1.1, "claimed", "k", "pending", "fetching", w1, 11, step="fetch",
                  continued=False),
        engine_op(1.2, "state", "k", "fetching", "fetched", w1, 11),
        {"t": 2.0, "src": "nemesis", "type": "kill", "pid": 11, "target": "worker-0.1"},
        engine_op(2.5, "state", "j", "fetching", "fetching", "nemesis", None, actor="harness"),
        engine_op(3.5, "claimed", "j", "fetching", "fetching", w2, 12, step="fetch",
                  continued=False),
    ]
    assert recovery_times(events) == [0.5]  # the nemesis's write is progress by another hand


def test_a_job_that_left_its_step_or_moved_on_is_waited_for_only_while_held():
    w1, w2 = "w1@h", "w2@h"
    events = [
        engine_op(1.0, "claimed", "j", "pending", "fetching", w1, 11, step="fetch",
                  continued=False),
        engine_op(1.2, "state", "j", "fetching", "fetched", w1, 11),
        engine_op(1.3, "claimed", "j", "fetched", "extracting", w1, 11, step="extract",
                  continued=True),
        engine_op(1.4, "claimed", "k", "pending", "fetching", w2, 12, step="fetch",
                  continued=False),
        engine_op(1.5, "state", "k", "fetching", "pending", w2, 12),
        {"t": 2.0, "src": "nemesis", "type": "kill", "target": "worker-0.1"},
        {"t": 2.0, "src": "nemesis", "type": "kill", "target": "worker-1.2"},
        engine_op(3.0, "claimed", "k", "pending", "fetching", "w3@h", 13, step="fetch",
                  continued=False),
        engine_op(4.0, "claimed", "j", "extracting", "extracting", "w4@h", 14,
                  step="extract", continued=False),
    ]
    spawns = [{"t": 0.0, "src": "process", "type": "spawn", "name": name, "pid": pid}
              for name, pid in (("worker-0.1", 11), ("worker-1.2", 12))]
    assert recovery_times(spawns + events) == [2.0]  # j, held under its continued lease


def test_the_recommendation_is_the_shortest_lease_without_duplicate_spend():
    rows = [{"lease": lease, "heartbeat": hb, "duplicate_spend": spend, "failing_invariants": [],
             "recovery_p50": lease, "recovery_p99": lease}
            for lease, hb, spend in ((0.5, True, 0.0), (1.0, True, 0.0), (0.5, False, 0.2),
                                     (1.0, False, 0.1), (2.0, False, 0.0), (4.0, False, 0.0))]
    rec = recommend(rows, "fixed:1.5")
    assert rec["heartbeat_on"]["lease"] == 0.5 and rec["heartbeat_off"]["lease"] == 2.0
    rows[4]["failing_invariants"] = ["fenced-writes"]
    assert recommend(rows, "fixed:1.5")["heartbeat_off"]["lease"] == 4.0
    none = recommend([r for r in rows if r["heartbeat"] is False and r["lease"] < 2], "x")
    assert none["heartbeat_off"]["lease"] is None and "longer" in none["heartbeat_off"]["text"]
