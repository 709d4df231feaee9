"""Which engine a simulation runs: the reference, or a broken variant applied in-process.

A simulation runs the engine's classes in its own process, so an engine other than the
reference must change them here, for the run only. An adapter may say how itself with a
`patch()` context manager. The mutants of `chaos.mutants` have none (their patches break a
whole engine process for good), so their patch is applied inside `restored()`, which puts
every class and function of the engine back as it was afterwards. A patch applies to every
store opened while it is in force: the simulation opens its harness's own stores (runner,
nemesis) before, as a real run keeps them in a process no mutant changes.
"""
from __future__ import annotations

import importlib
import threading
from contextlib import contextmanager, nullcontext
from typing import Any, ContextManager, Iterator

from chaos.engines.adapter_guard import unguarded

#: The engine modules a patch may touch; `restored()` puts their contents back.
ENGINE_MODULES = ("engine.worker", "engine.slots", "engine.outbox", "engine.retry",
                  "engine.steps", "engine.provider", "engine.http", "engine.hooks",
                  "engine.store.sqlite", "engine.store.operator", "engine.store.queries",
                  "engine.store.base")


_RESTORING = threading.Lock()


@contextmanager
def restored() -> Iterator[None]:
    """Whatever the block does to the engine's modules and classes is undone after it.

    One block at a time in the process: what it patches is the process's, and a block that
    began inside another's (on another thread) would save the other's patches as the state
    to restore, and leave them for good."""
    with _RESTORING:
        yield from _restoring()


def _restoring() -> Iterator[None]:
    saved = []
    for name in ENGINE_MODULES:
        module = importlib.import_module(name)
        saved.append((module, dict(vars(module))))
        for value in list(vars(module).values()):
            if isinstance(value, type) and value.__module__ == name:
                saved.append((value, dict(vars(value))))
    try:
        yield
    finally:
        for owner, before in saved:
            now = dict(vars(owner))
            for key in now.keys() - before.keys():
                delattr(owner, key)
            for key, value in before.items():
                if now.get(key) is not value:
                    setattr(owner, key, value)


def in_process(engine: Any, spec: str = "?") -> ContextManager[None]:
    """A context manager that runs `engine` in this process (see the module docstring).

    Raises ValueError for an engine that cannot be simulated."""
    patch = getattr(engine, "patch", None)
    if patch is not None:
        return patch()
    if vars(type(unguarded(engine))).get("in_process_as_is"):  # the class's own word, not
        return nullcontext()                                   # a subclass's inherited one
    mutant = getattr(getattr(engine, "mutant", None), "name", None)
    if mutant is not None:
        return _mutant(mutant)
    raise ValueError(f"engine {spec!r} cannot run in simulation: its adapter has no patch() "
                     "to apply its change in this process")


@contextmanager
def _mutant(name: str) -> Iterator[None]:
    from chaos.reference.mutants import patches, sql
    with restored():
        if name in patches.NAMES:
            patches.apply(name, ("sqlite",))  # the simulation runs on SQLite
        elif name == "submit_replaces":
            _replacing_submit(sql.sql_edits("sqlite")[name], patches.EditingConnection)
        else:
            raise ValueError(f"mutant {name!r} has no in-process patch")
        yield


def _replacing_submit(edits, editing) -> None:
    """The mutant's change lives in its adapter's submit (the harness's own call): every
    submit in the simulation runs its SQL through the same edits, for that call only."""
    from engine.store import SQLiteStore
    original = SQLiteStore.submit

    def submit(self, *args, **kwargs):
        conn, self.conn = self.conn, editing(self.conn, edits)
        try:
            return original(self, *args, **kwargs)
        finally:
            self.conn = conn

    SQLiteStore.submit = submit
