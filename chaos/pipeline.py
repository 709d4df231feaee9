"""A pipeline as the harness sees it: steps, states, edges and effect kinds, as plain data.

An adapter declares its engine's pipeline with these types; the plan, the fakes and the
checkers take steps, states and effect kinds from it and from nothing else. It is validated
when built, naming the offending step or state.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class Step:
    """One step: the ready state it waits in, the working state it runs in, the state it
    reaches when done, and the state it parks in when it gives up. `model` is False for a
    step that calls no model (delivery through the outbox, say); `memo` False for a step
    that records no memo when it completes."""

    name: str
    ready: str
    working: str
    done: str
    parked: str
    model: bool = True
    alternate: str | None = None     # another state the step may reach (e.g. needs_human)
    memo: bool = True


@dataclass(frozen=True)
class Pipeline:
    """The state table of one pipeline (see the module docstring).

    edges:          state -> the states a worker may move it to;
    operator_edges: state -> the states an operator may move it to (cancel, requeue, resolve);
    operator_actions: action -> the states from which the engine always carries the action
                    out (a refusal there is a bug); an action not named is not judged on
                    its refusals (the engine may refuse it for reasons beyond the state);
    effects:        the kinds of side effect a finished job leaves through the outbox.
    Raises ValueError at construction for a table that does not hold together."""

    name: str
    steps: tuple[Step, ...]
    edges: Mapping[str, tuple[str, ...]]
    terminal: frozenset[str]
    operator_edges: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    operator_actions: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    effects: tuple[str, ...] = ()
    initial: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", tuple(self.steps))
        object.__setattr__(self, "terminal", frozenset(self.terminal))
        object.__setattr__(self, "edges", {k: tuple(v) for k, v in self.edges.items()})
        object.__setattr__(self, "operator_edges",
                           {k: tuple(v) for k, v in self.operator_edges.items()})
        object.__setattr__(self, "operator_actions",
                           {k: tuple(v) for k, v in self.operator_actions.items()})
        object.__setattr__(self, "effects", tuple(self.effects))
        if not self.initial and self.steps:
            object.__setattr__(self, "initial", self.steps[0].ready)
        _validate(self)

    @property
    def states(self) -> frozenset[str]:
        named = set(self.edges) | {t for to in self.edges.values() for t in to}
        for s in self.steps:
            named |= {s.ready, s.working, s.done, s.parked} | ({s.alternate} - {None})
        return frozenset(named | self.terminal)

    @property
    def ready_states(self) -> frozenset[str]:
        return frozenset(s.ready for s in self.steps)

    @property
    def working_states(self) -> frozenset[str]:
        return frozenset(s.working for s in self.steps)

    @property
    def parked_states(self) -> frozenset[str]:
        return frozenset(s.parked for s in self.steps) | frozenset(
            s.alternate for s in self.steps if s.alternate and s.alternate not in self.terminal
            and s.alternate not in self.ready_states)

    @property
    def model_steps(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.steps if s.model)

    def step(self, name: str) -> Step:
        """The step called `name`; KeyError names it when there is none."""
        for s in self.steps:
            if s.name == name:
                return s
        raise KeyError(f"pipeline {self.name!r} has no step {name!r}")

    def to_json(self) -> dict[str, Any]:
        """The form a snapshot carries (and `from_json` reads back)."""
        return {
            "name": self.name, "initial": self.initial, "effects": list(self.effects),
            "steps": [{"name": s.name, "ready": s.ready, "working": s.working, "done": s.done,
                       "parked": s.parked, "alternate": s.alternate, "model": s.model,
                       "memo": s.memo}
                      for s in self.steps],
            "edges": {k: list(v) for k, v in self.edges.items()},
            "operator_edges": {k: list(v) for k, v in self.operator_edges.items()},
            "operator_actions": {k: list(v) for k, v in self.operator_actions.items()},
            "terminal": sorted(self.terminal), "parked": sorted(self.parked_states),
            "ready": sorted(self.ready_states), "working": sorted(self.working_states),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Pipeline":
        return cls(name=data["name"], initial=data.get("initial", ""),
                   effects=tuple(data.get("effects", ())),
                   steps=tuple(Step(s["name"], s["ready"], s["working"], s["done"], s["parked"],
                                    s.get("model", True), s.get("alternate"),
                                    s.get("memo", True))
                               for s in data["steps"]),
                   edges=data["edges"], terminal=frozenset(data["terminal"]),
                   operator_edges=data.get("operator_edges", {}),
                   operator_actions=data.get("operator_actions", {}))


def _validate(p: Pipeline) -> None:
    where = f"pipeline {p.name!r}"
    if not p.steps:
        raise ValueError(f"{where} has no step")
    names = [s.name for s in p.steps]
    if len(set(names)) != len(names):
        raise ValueError(f"{where} names a step twice: {names}")
    for s in p.steps:
        out = set(p.edges.get(s.working, ()))
        for needed, what in ((s.done, "done"), (s.ready, "retry")):
            if needed not in out:
                raise ValueError(f"{where}: step {s.name!r} has no {what} edge "
                                 f"{s.working!r} -> {needed!r}")
        if s.working not in p.edges.get(s.ready, ()):
            raise ValueError(f"{where}: step {s.name!r} has no claim edge "
                             f"{s.ready!r} -> {s.working!r}")
    for state in p.terminal:
        if p.edges.get(state):
            raise ValueError(f"{where}: terminal state {state!r} has edges {p.edges[state]}")
    if p.initial not in p.states:
        raise ValueError(f"{where}: initial state {p.initial!r} is not a state of the table")
    for action, states in p.operator_actions.items():
        for state in states:
            if not p.operator_edges.get(state):
                raise ValueError(f"{where}: operator_actions says {action!r} always applies "
                                 f"from {state!r}, which has no operator edge")
