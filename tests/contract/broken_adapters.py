"""Adapters that raise: the toy engine's adapter with one method broken each, for the tests
of what the harness does when adapter code raises (tests/integration/test_adapter_errors.py).

`--engine tests.contract.broken_adapters:BROKEN_<METHOD>` names one; each raises
RuntimeError("broken <method> on purpose") from that method and behaves as the toy
otherwise. `BrokenConstructor` raises when built; the module
`tests.contract.broken_on_import` raises when imported.
"""
from __future__ import annotations

from typing import Any

from examples.toy_engine.adapter import ToyEngine

#: The methods a broken adapter is made for (every one the harness calls in a run or a sim).
METHODS = ("submit", "command", "settings", "install", "operations", "progress", "snapshot",
           "integrity", "operator")


def message(method: str) -> str:
    return f"broken {method} on purpose"


def broken(method: str) -> ToyEngine:
    """A toy adapter whose `method` raises RuntimeError (KeyError for settings: a ValueError
    there is the contract's refusal of a setting, not a failure)."""
    def raising(self: Any, *args: Any, **kwargs: Any) -> Any:
        if method == "settings":
            raise KeyError(message(method))
        raise RuntimeError(message(method))
    cls = type(f"Broken{method.title()}", (ToyEngine,), {method: raising})
    return cls()


class BrokenConstructor(ToyEngine):
    def __init__(self) -> None:
        raise RuntimeError(message("constructor"))


globals().update({f"BROKEN_{m.upper()}": broken(m) for m in METHODS})


class UnreadableOperations(ToyEngine):
    """Its observer leaves a claim's step out: operations the vocabulary cannot read."""

    def operations(self, db: str) -> list:
        ops = super().operations(db)
        for op in ops:
            if op.get("type") == "claimed":
                op.pop("step", None)
        return ops


class UnreadableSnapshot(ToyEngine):
    """Its snapshot's outbox rows lack their idempotency key."""

    def snapshot(self, db: str) -> dict:
        snap = super().snapshot(db)
        for row in snap["outbox"]:
            row.pop("key", None)
        return snap


class LackingEvidence(ToyEngine):
    """Its observer cannot read a claim's lease: the claims leave `lease_until` out."""

    def operations(self, db: str, *args: Any, **kwargs: Any) -> list:
        ops = super().operations(db, *args, **kwargs)
        for op in ops:
            if op.get("type") == "claimed":
                op.pop("lease_until", None)
        return ops


UNREADABLE_OPERATIONS = UnreadableOperations()
UNREADABLE_SNAPSHOT = UnreadableSnapshot()
LACKING_EVIDENCE = LackingEvidence()
