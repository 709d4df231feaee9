"""The engine contract (`chaos.contract`), promise by promise, against every adapter present.
Each test states one promise; each runs once per adapter (see conftest.PRESENT)."""
from __future__ import annotations

import importlib
import math
import re
import threading

import pytest

from chaos import history
from chaos.contract import (CAPABILITIES, NEEDS, REQUIRED, names, Command, EngineSettings,
                            ProcessContext, has, validate)
from chaos.pipeline import Pipeline

from .conftest import KNOWN, OTHER_PAYLOAD, PAYLOAD, wait_for

SECRET = "sk-contract-secret-7f3a9c"
SECRET_NAME = re.compile(r"key|token|secret|password", re.IGNORECASE)
#: setting names an engine may give its provider credential.
SECRET_CANDIDATES = ("provider_key", "api_key", "provider_api_key", "key", "token",
                     "secret", "password")
#: environment variables an adapter might copy a credential from.
SECRET_VARIABLES = ("NINELIVES_PROVIDER_KEY", "OPENAI_API_KEY", "PROVIDER_KEY",
                    "TOY_PROVIDER_KEY", "ARTICLE_PROVIDER_KEY")


def raw(spec: str):
    """The adapter object itself, before validation (what `--engine` would name)."""
    target = "chaos.reference:REFERENCE" if spec == "reference" else spec
    module, _, attr = target.partition(":")
    obj = getattr(importlib.import_module(module), attr)
    return obj() if isinstance(obj, type) else obj


def ctx_for(db: str, engine_table: dict) -> ProcessContext:
    return ProcessContext(db=db, provider_url="http://127.0.0.1:9/v1",
                          receiver_url="http://127.0.0.1:9/v1/effects", engine=engine_table)


def test_validate_accepts_the_adapter(spec):
    adapter = raw(spec)
    assert validate(adapter, spec) is adapter
    assert isinstance(adapter.name, str) and adapter.name
    assert set(adapter.capabilities) <= set(CAPABILITIES)


def test_pipeline_is_a_chaos_pipeline_with_every_step_in_its_table(engine):
    p = engine.pipeline
    assert isinstance(p, Pipeline)
    for step in p.steps:
        assert step.working in p.edges.get(step.ready, ()), f"{step.name}: no claim edge"
        assert {step.done, step.ready} <= set(p.edges.get(step.working, ())), step.name
        for state in (step.ready, step.working, step.done, step.parked, step.alternate):
            assert state is None or state in p.states, f"{step.name}: {state!r} not a state"
        reached = {t for to in p.edges.values() for t in to} | set(p.edges) | p.terminal
        assert step.parked in reached, f"{step.name}: parked state {step.parked!r} unreachable"
    assert p.initial == p.steps[0].ready
    assert p.steps[-1].done in p.terminal, "the last step's done state must be terminal"
    assert all(isinstance(kind, str) and kind for kind in p.effects)


def test_submit_is_idempotent_on_the_id_and_rejects_another_payload(engine, installed):
    job = "contract-submit-1"
    assert engine.submit(installed, job, PAYLOAD) == "created"
    before = engine.snapshot(installed)["jobs"][job]
    assert engine.submit(installed, job, PAYLOAD) == "exists"
    assert engine.submit(installed, job, OTHER_PAYLOAD) == "rejected"
    ops = [op for op in engine.operations(installed) if op.get("job") == job]
    assert [op["type"] for op in ops] == ["submitted"], ops
    assert ops[0]["state"] == engine.pipeline.initial
    expected = getattr(history, "payload_hash", None)
    assert ops[0]["payload_hash"] == before["payload_hash"]
    if expected is not None:
        assert ops[0]["payload_hash"] == expected(PAYLOAD)
    assert engine.snapshot(installed)["jobs"][job] == before, "a duplicate changed the job"


@pytest.mark.parametrize("role", ["worker", "sender"])
def test_command_keeps_secrets_out_of_argv(engine, db, role, monkeypatch):
    for variable in SECRET_VARIABLES:
        monkeypatch.setenv(variable, SECRET)
    table = {}
    for name in SECRET_CANDIDATES:
        try:
            engine.settings({name: SECRET})
        except ValueError:
            continue
        table[name] = SECRET
    assert all(SECRET_NAME.search(name) for name in table)
    command = engine.command(role, ctx_for(db, table))
    assert isinstance(command, Command)
    assert command.argv and all(isinstance(a, str) for a in command.argv)
    leaked = [a for a in command.argv if SECRET in a]
    assert not leaked, f"a secret is on the {role} command line: {leaked}"
    if table:
        assert SECRET in command.env.values(), (
            f"settings {sorted(table)} were accepted but the secret reaches the {role} "
            "neither by argv nor by its environment")


def test_settings_refuse_an_unknown_field_by_name(engine):
    assert isinstance(engine.settings({}), EngineSettings)
    with pytest.raises(ValueError, match="no_such_setting_42"):
        engine.settings({"no_such_setting_42": 1})


def _numeric_field(engine) -> str:
    """A number-valued setting the engine accepts under the harness's own name."""
    defaults = engine.settings({})
    for name in ("lease", "call_timeout", "outbox_lease", "send_timeout"):
        value = getattr(defaults, name)
        if isinstance(value, (int, float)) and math.isfinite(value):
            try:
                engine.settings({name: float(value)})
            except ValueError:
                continue
            return name
    pytest.fail("the engine accepts none of lease, call_timeout, outbox_lease, send_timeout")


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, -1.0, 0.0],
                         ids=["nan", "inf", "-inf", "negative", "zero"])
def test_settings_refuse_a_number_out_of_range_by_name(engine, bad):
    name = _numeric_field(engine)
    with pytest.raises(ValueError, match=name):
        engine.settings({name: bad})


def test_progress_and_snapshot_of_a_fresh_store(engine, installed):
    engine.submit(installed, "contract-fresh-1", PAYLOAD)
    progress = engine.progress(installed)
    assert progress["states"] == {engine.pipeline.initial: 1}
    assert progress["unsent"] == 0
    snap = engine.snapshot(installed)
    assert {"jobs", "memos", "outbox", "spend", "orphans"} <= set(snap)
    assert snap["jobs"]["contract-fresh-1"]["state"] == engine.pipeline.initial


# --- controls, each with its capability ---------------------------------------------------

def test_operator_cancel_of_a_pending_job_is_an_operator_write(engine, installed):
    if not has(engine, "operator"):
        assert not hasattr(engine, "operator") or callable(engine.operator)
        return
    job = "contract-cancel-1"
    engine.submit(installed, job, PAYLOAD)
    assert engine.operator(installed, "cancel", job) == "done"
    writes = [op for op in engine.operations(installed)
              if op.get("job") == job and op["type"] == "state"]
    assert len(writes) == 1 and writes[0]["actor"] == "operator", writes
    assert writes[0]["from"] == engine.pipeline.initial
    assert writes[0]["to"] in engine.pipeline.operator_edges.get(engine.pipeline.initial, ())
    assert writes[0]["to"] in engine.pipeline.terminal
    assert engine.operator(installed, "cancel", job).startswith("refused")


def test_expire_leases_returns_how_many(engine, installed):
    if not has(engine, "lease_expiry"):
        return
    engine.submit(installed, "contract-expire-1", PAYLOAD)
    n = engine.expire_leases(installed)
    assert isinstance(n, int) and not isinstance(n, bool) and n == 0  # nothing is leased


def test_hold_write_lock_blocks_another_writer_while_held(engine, installed):
    if not has(engine, "write_lock"):
        return
    results: list[str] = []
    writer = threading.Thread(target=lambda: results.append(
        engine.submit(installed, "contract-lock-1", PAYLOAD)))
    with engine.hold_write_lock(installed):
        writer.start()
        writer.join(timeout=0.5)  # it must still be waiting when the deadline passes
        assert writer.is_alive() and not results, "a write went through the held lock"
    wait_for(lambda: results, 10.0, "the blocked submit to go through once the lock is released")
    writer.join(timeout=10)
    assert results == ["created"]


def test_integrity_of_an_intact_store_is_ok(engine, installed):
    if not has(engine, "integrity"):
        return
    engine.submit(installed, "contract-intact-1", PAYLOAD)
    assert engine.integrity(installed) == "ok"


def test_a_control_may_be_absent_when_its_capability_is_not_declared(spec):
    adapter = raw(spec)
    declared = set(adapter.capabilities)
    kept = set(REQUIRED) | {name for cap in declared for need in NEEDS.get(cap, ())
                            for name in names(need)}
    view = type("View", (), {name: getattr(adapter, name) for name in kept
                             if hasattr(adapter, name)})()
    validate(view, f"{spec} without the controls of undeclared capabilities")
    for cap in sorted(declared & set(NEEDS)):
        needed = {name for need in NEEDS[cap] for name in names(need)}
        lacking = type("Lacking", (), {n: getattr(view, n) for n in kept
                                       if n not in needed and hasattr(view, n)})()
        with pytest.raises(ValueError, match=cap):
            validate(lacking, f"{spec} without {cap}")


def test_every_known_adapter_is_listed():
    assert set(KNOWN) == {"reference", "article", "toy", "dbos"}


#: adapters that cannot run in simulation, and why; every other adapter must.
NO_SIMULATION = {
    "dbos": "DBOS is one instance per interpreter (the DBOS class holds it), running its own "
            "queue, executor and background threads: simulated processes share one "
            "interpreter, so two DBOS executors cannot run in one simulation"}


def test_an_in_process_engine_runs_a_schedule_of_its_own_loops_in_simulation(spec):
    from chaos.spec.scenario import load_scenario
    from chaos.sim import SeededChoices, SimSpec, simulate
    engine = raw(spec)
    if any(KNOWN[name] == spec for name in NO_SIMULATION):
        assert not has(engine, "in_process"), f"{spec} is listed in NO_SIMULATION"
        return
    assert has(engine, "in_process"), f"{spec} declares no in_process capability"
    scen = load_scenario("smoke", "smoke", engine=engine)
    result = simulate(SimSpec(scen, 1, engine, spec), SeededChoices(1))
    assert not result.errors, result.errors      # no thread of the engine raised
    assert result.snapshot["phases"]["drained"]
    ops = [e for e in result.history if e.get("src") == "engine"]
    assert {"submitted", "claimed", "memo"} <= {e["type"] for e in ops}
    start = result.history[0]["t"]
    assert all(start <= e["t"] <= start + result.virtual_seconds + 1 for e in ops)  # virtual
    assert all(e.get("pid") for e in ops if e["type"] == "claimed")
