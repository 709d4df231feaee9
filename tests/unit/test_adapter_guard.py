"""The adapter guard (chaos.engines.adapter_guard): what an adapter raises becomes AdapterError,
and everything else about the adapter reads as before."""
from __future__ import annotations

import inspect
import pickle
from contextlib import contextmanager

import pytest

from chaos.engines.adapter_guard import AdapterError, described, guard, unguarded
from chaos.contract import has, load_engine


class Adapter:
    name = "fake"
    capabilities = frozenset({"write_lock"})
    crashpoints = ("after_claim",)

    def __init__(self) -> None:
        self.exits: list[str] = []

    def submit(self, db: str, job_id: str, payload, settings=None) -> str:
        if job_id == "bad":
            raise RuntimeError(f"cannot submit {job_id} to postgresql://u:hunter22@h/db")
        return "created"

    def settings(self, table: dict):
        raise ValueError("engine setting leese is unknown")

    @contextmanager
    def hold_write_lock(self, db: str):
        if db == "enter":
            raise OSError("no lock")
        try:
            yield "held"
        finally:
            self.exits.append(db)
            if db == "exit":
                raise RuntimeError("cannot release")

    def log_lines(self, db: str):
        yield from ("one", "two")


def test_a_method_that_raises_raises_adapter_error_naming_it_and_no_secret():
    engine = guard(Adapter(), "pkg:FAKE")
    assert engine.submit("db", "ok", {}) == "created"
    with pytest.raises(AdapterError) as raised:
        engine.submit("db", "bad", {})
    error = raised.value
    assert (error.spec, error.method, type(error.error)) == ("pkg:FAKE", "submit", RuntimeError)
    assert str(error).startswith("adapter pkg:FAKE: submit raised RuntimeError: cannot submit")
    assert "hunter22" not in str(error) and "hunter22" not in error.trace
    assert "Traceback" in error.trace


def test_settings_refuses_with_its_own_value_error():
    with pytest.raises(ValueError, match="leese") as raised:
        guard(Adapter(), "pkg:FAKE").settings({"leese": 1})
    assert not isinstance(raised.value, AdapterError)


def test_a_context_manager_is_guarded_on_enter_and_exit_and_lets_the_block_raise():
    adapter = Adapter()
    engine = guard(adapter, "pkg:FAKE")
    with engine.hold_write_lock("db") as held:
        assert held == "held"
    for where in ("enter", "exit"):
        with pytest.raises(AdapterError, match="hold_write_lock raised"):
            with engine.hold_write_lock(where):
                pass
    with pytest.raises(KeyError):  # the harness's own exception in the block, unchanged
        with engine.hold_write_lock("block"):
            raise KeyError("the block's")
    assert adapter.exits == ["db", "exit", "block"]


def test_every_other_attribute_reads_as_before():
    adapter = Adapter()
    engine = guard(adapter, "pkg:FAKE")
    assert engine.name == "fake" and engine.crashpoints == ("after_claim",)
    assert has(engine, "write_lock") and hasattr(engine, "submit")
    assert not hasattr(engine, "integrity")
    assert "settings" in inspect.signature(engine.submit).parameters
    assert list(engine.log_lines("db")) == ["one", "two"]  # a generator, as given
    assert unguarded(engine) is adapter and guard(engine, "x") is engine
    assert unguarded(pickle.loads(pickle.dumps(engine))).name == "fake"


def test_an_adapter_error_crosses_a_process_pool_whole():
    class Odd(Exception):
        def __init__(self, a, b):
            super().__init__(a)
    try:
        raise Odd("odd", lambda: None)  # pickles neither its class nor its arguments
    except Odd as exc:
        error = AdapterError("pkg:FAKE", "progress", exc)
    again = pickle.loads(pickle.dumps(error))
    assert str(again) == str(error) == "adapter pkg:FAKE: progress raised Odd: odd"
    assert described(again) == "Odd: odd"


def test_the_reference_loads_guarded_and_still_simulates_as_itself():
    from chaos.reference import REFERENCE
    from chaos.reference.inprocess.patches import in_process
    engine = load_engine("reference")
    assert unguarded(engine) is REFERENCE
    with in_process(engine, "reference"):
        pass
