"""The context each engine process starts with: a heartbeat-off slot gets a call timeout
shorter than its lease, and an engine with no lease at all (DBOS) starts its processes
unchanged rather than crashing the run."""
from __future__ import annotations

from types import SimpleNamespace

from chaos.contract import EngineSettings
from chaos.run.expect import process_context
from chaos.spec.scenario import load_scenario

PLAN = SimpleNamespace(skewed=[])


def _last_worker(settings: EngineSettings):
    scenario = load_scenario("everything", "smoke")
    assert scenario.faults.heartbeat_off_workers >= 1
    return process_context(scenario, PLAN, settings, "worker", scenario.run.workers - 1,
                           "store.db", "http://127.0.0.1:9/v1", "http://127.0.0.1:9/e")


def test_a_heartbeat_off_slot_gets_a_call_timeout_inside_its_lease():
    ctx = _last_worker(EngineSettings(lease=2.0, heartbeat=True, call_timeout=5.0))
    assert ctx.heartbeat is False and ctx.call_timeout == 1.6


def test_an_engine_without_a_lease_has_no_heartbeat_to_turn_off():
    ctx = _last_worker(EngineSettings(call_timeout=5.0))
    assert ctx.heartbeat is None and ctx.call_timeout is None
