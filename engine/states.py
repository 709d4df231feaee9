"""The state table and pipelines as data: which states exist, which edges are legal.

A pipeline is a list of steps; each step names its ready, working, done and parked states.
Pipelines are validated when they are built, so a bad definition fails at construction,
naming the offending state or edge.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping


class IllegalTransition(Exception):
    """A transition that is not an edge of the pipeline's state table."""


class PipelineError(ValueError):
    """A pipeline definition that cannot work (unreachable state, missing retry edge, ...)."""


@dataclass(frozen=True)
class Step:
    """One step of a pipeline.

    ready:   the state a job waits in before the step (the retry edge leads back here);
    working: the state while one leased worker runs the step;
    done:    the state after the step committed;
    parked:  where the job waits for an operator when the step fails for good;
    alternate: an optional second outcome of the step (the verify step's `needs_human`).
    """

    name: str
    ready: str
    working: str
    done: str
    parked: str
    alternate: str | None = None


@dataclass(frozen=True)
class Pipeline:
    """A validated pipeline: its steps, its state table and the kinds of its states."""

    name: str
    steps: tuple[Step, ...]
    terminal: frozenset[str]
    edges: Mapping[str, tuple[str, ...]] = field(repr=False)
    operator_edges: Mapping[str, tuple[str, ...]] = field(repr=False)

    @property
    def states(self) -> frozenset[str]:
        return frozenset(self.edges)

    @property
    def ready_states(self) -> frozenset[str]:
        return frozenset(s.ready for s in self.steps)

    @property
    def working_states(self) -> frozenset[str]:
        return frozenset(s.working for s in self.steps)

    @property
    def parked_states(self) -> frozenset[str]:
        return frozenset(s.parked for s in self.steps) | frozenset(
            s.alternate for s in self.steps if s.alternate)

    @property
    def initial(self) -> str:
        return self.steps[0].ready

    def step_for(self, state: str) -> Step:
        """The step whose ready or working state is `state`; KeyError otherwise."""
        for step in self.steps:
            if state in (step.ready, step.working):
                return step
        raise KeyError(f"no step of pipeline {self.name!r} starts from state {state!r}")

    def step_named(self, name: str) -> Step:
        for step in self.steps:
            if step.name == name:
                return step
        raise KeyError(f"pipeline {self.name!r} has no step {name!r}")

    def check(self, frm: str, to: str, *, operator: bool = False) -> None:
        """Raise IllegalTransition unless frm -> to is an edge (operator edges if operator)."""
        allowed = self.edges.get(frm)
        if allowed is None:
            raise IllegalTransition(f"unknown state {frm!r} in pipeline {self.name!r}")
        if to in allowed:
            return
        if operator and to in self.operator_edges.get(frm, ()):
            return
        raise IllegalTransition(f"illegal transition {frm} -> {to} in pipeline {self.name!r}")

    def is_edge(self, frm: str, to: str, *, operator: bool = False) -> bool:
        try:
            self.check(frm, to, operator=operator)
        except IllegalTransition:
            return False
        return True


def build_pipeline(name: str, steps: list[Step], *, cancelled: str = "cancelled") -> Pipeline:
    """Derive and validate a pipeline's state table from its steps.

    Worker edges: ready -> working; working -> done | parked | ready (retry) | alternate;
    the last step's done state is terminal, every other done state is the next step's ready.
    Operator edges: parked -> the step's ready state (requeue); alternate -> the step's ready
    state (resolve); every ready and parked state -> cancelled.
    Raises PipelineError naming the offending step or state.
    """
    if not steps:
        raise PipelineError(f"pipeline {name!r} has no steps")
    _check_names(name, steps)
    edges: dict[str, list[str]] = {}
    operator: dict[str, list[str]] = {}

    def add(table: dict[str, list[str]], frm: str, to: str) -> None:
        table.setdefault(frm, [])
        if to not in table[frm]:
            table[frm].append(to)

    for i, step in enumerate(steps):
        add(edges, step.ready, step.working)
        for to in (step.done, step.parked, step.ready) + ((step.alternate,) if step.alternate else ()):
            add(edges, step.working, to)
        nxt = steps[i + 1].ready if i + 1 < len(steps) else None
        if nxt is not None and nxt != step.done:
            raise PipelineError(
                f"pipeline {name!r}: step {step.name!r} ends in {step.done!r} but the next step "
                f"{steps[i + 1].name!r} starts from {nxt!r}")
        for parked in (step.parked, step.alternate):
            if parked:
                edges.setdefault(parked, [])
                add(operator, parked, step.ready)
                add(operator, parked, cancelled)
        add(operator, step.ready, cancelled)
    final = steps[-1].done
    edges.setdefault(final, [])
    edges.setdefault(cancelled, [])
    pipeline = Pipeline(
        name=name,
        steps=tuple(steps),
        terminal=frozenset({final, cancelled}),
        edges=MappingProxyType({k: tuple(v) for k, v in edges.items()}),
        operator_edges=MappingProxyType({k: tuple(v) for k, v in operator.items()}),
    )
    _check_reachable(pipeline)
    return pipeline


def _check_names(name: str, steps: list[Step]) -> None:
    seen_steps: set[str] = set()
    working: set[str] = set()
    for step in steps:
        if step.name in seen_steps:
            raise PipelineError(f"pipeline {name!r}: step name {step.name!r} is used twice")
        seen_steps.add(step.name)
        for attr in ("name", "ready", "working", "done", "parked"):
            if not getattr(step, attr):
                raise PipelineError(f"pipeline {name!r}: step {step.name!r} has an empty {attr!r}")
        if step.working in working:
            raise PipelineError(f"pipeline {name!r}: working state {step.working!r} is used twice")
        working.add(step.working)
        if len({step.ready, step.working, step.done, step.parked}) < 4:
            raise PipelineError(
                f"pipeline {name!r}: step {step.name!r} must use four distinct states "
                "(ready, working, done, parked)")


def _check_reachable(pipeline: Pipeline) -> None:
    """Every state reachable from the initial one; terminals have no way out."""
    seen, todo = {pipeline.initial}, [pipeline.initial]
    while todo:
        state = todo.pop()
        for to in pipeline.edges.get(state, ()) + pipeline.operator_edges.get(state, ()):
            if to not in seen:
                seen.add(to)
                todo.append(to)
    for state in sorted(pipeline.states - seen):
        raise PipelineError(f"pipeline {pipeline.name!r}: state {state!r} is unreachable")
    for state in pipeline.terminal:
        if pipeline.edges.get(state) or pipeline.operator_edges.get(state):
            raise PipelineError(f"pipeline {pipeline.name!r}: terminal state {state!r} has an edge out")


#: The four-step document pipeline (the design article's state table).
DOCUMENT = build_pipeline("document", [
    Step("fetch", ready="pending", working="fetching", done="fetched", parked="failed_fetch"),
    Step("extract", ready="fetched", working="extracting", done="extracted", parked="failed_extract"),
    Step("verify", ready="extracted", working="verifying", done="verified", parked="needs_human"),
    Step("deliver", ready="verified", working="delivering", done="delivered", parked="failed_deliver"),
])

#: The document pipeline's state table, as a plain constant (worker and operator edges).
STATES: Mapping[str, tuple[str, ...]] = MappingProxyType({
    state: DOCUMENT.edges[state] + DOCUMENT.operator_edges.get(state, ())
    for state in sorted(DOCUMENT.states)
})

PIPELINES: dict[str, Pipeline] = {DOCUMENT.name: DOCUMENT}


def register_pipeline(pipeline: Pipeline) -> None:
    """Make a validated pipeline available by name to workers and submit."""
    PIPELINES[pipeline.name] = pipeline


def get_pipeline(name: str) -> Pipeline:
    """The registered pipeline called `name`, or the one declared in the TOML file `name`.

    Raises PipelineError naming the pipeline (or the file and the offending entry).
    """
    if name in PIPELINES:
        return PIPELINES[name]
    if name.endswith(".toml"):
        pipeline = load_pipeline_file(name)
        register_pipeline(pipeline)
        return pipeline
    known = ", ".join(sorted(PIPELINES))
    raise PipelineError(f"unknown pipeline {name!r} (known: {known}, or a .toml file)")


def load_pipeline_file(path: str) -> Pipeline:
    """Read a pipeline declared as data:

        name = "invoices"
        [[step]]
        name = "ocr"
        ready = "received"; working = "reading"; done = "read"; parked = "failed_ocr"

    Raises PipelineError naming the file and the offending step or field.
    """
    import tomllib
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise PipelineError(f"pipeline file {path}: {exc}") from None
    fields = {"name", "ready", "working", "done", "parked", "alternate"}
    steps = []
    for i, entry in enumerate(data.get("step", []), 1):
        unknown = set(entry) - fields
        if unknown:
            raise PipelineError(f"pipeline file {path}: step {i} has unknown field(s) "
                                f"{', '.join(sorted(unknown))}")
        try:
            steps.append(Step(**entry))
        except TypeError:
            missing = sorted(fields - {"alternate"} - set(entry))
            raise PipelineError(f"pipeline file {path}: step {i} lacks {', '.join(missing)}") from None
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise PipelineError(f"pipeline file {path}: missing top-level 'name'")
    try:
        return build_pipeline(name, steps)
    except PipelineError as exc:
        raise PipelineError(f"pipeline file {path}: {exc}") from None
