"""What a simulation runs and what it returns: the spec (scenario, seed, engine), the result
(history, snapshot, verdicts, choices), and the plan and documents a seed gives."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from chaos import history as hist
from chaos.checkers import Verdict
from chaos.contract import load_engine
from chaos.pipeline import Pipeline
from chaos.spec.plan import FaultPlan, documents_for, make_plan
from chaos.spec.scenario import Scenario, check_numbers

START = 1_000_000.0   # the virtual epoch (seconds)


@dataclass(frozen=True)
class SimSpec:
    """What a simulated run simulates: a scenario, a seed, and the engine (an adapter that
    declares the in_process capability); with swarm testing, the scenario is the seed's own
    mix of faults (`swarm`)."""

    scenario: Scenario
    seed: int
    engine: Any = field(default_factory=lambda: load_engine("reference"))
    engine_spec: str = "reference"
    #: the swarm configuration the scenario was drawn with (chaos.sim.swarm), None for the
    #: scenario as written
    swarm: dict | None = None

    def __post_init__(self) -> None:
        check_numbers(self.scenario)  # a saved schedule's scenario was never loaded from TOML


@dataclass(repr=False)
class SimResult:
    """A finished simulated run: history, snapshot, verdicts, and how to replay it."""

    spec: SimSpec
    plan: FaultPlan
    choices: list[int]
    shape_choices: int           # how many of the choices decided the schedule's shape
    history: list[hist.Event]
    snapshot: dict[str, Any]
    verdicts: list[Verdict]
    applied: Counter
    turns: int
    virtual_seconds: float
    wall_seconds: float
    errors: list[dict] = field(default_factory=list)
    ledgers: dict[str, list[dict]] = field(default_factory=dict)
    events: list[hist.Event] = field(default_factory=list)
    db: str | None = None

    @property
    def failed(self) -> list[Verdict]:
        """The verdicts that failed (an `unknown` one did not: it had no evidence)."""
        return [v for v in self.verdicts if v.valid is False]

    @property
    def unknown(self) -> list[Verdict]:
        """The verdicts without evidence either way, each with its reason."""
        return [v for v in self.verdicts if v.valid is None]

    @property
    def exit_code(self) -> int:
        """1 when an invariant failed, else 2 when a checker crashed, else 0 (as a real
        run's, except that an unfired fault does not make it 2)."""
        if self.failed:
            return 1
        return 2 if any("traceback" in v.metrics for v in self.verdicts) else 0

    def __repr__(self) -> str:  # short: Hypothesis prints the values it shrinks
        return (f"SimResult(seed={self.spec.seed}, choices={len(self.choices)}, "
                f"turns={self.turns}, failed={[v.name for v in self.failed]})")

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(repr(self))  # Hypothesis's pretty-printer would spell out every field

    def signature(self) -> list[tuple[str, str]]:
        """(invariant, error type) of every failure: what a shrunk schedule must keep."""
        return [(v.name, t) for v in self.failed for t in (v.by_type or {"unknown": 0})]


_PLANS: dict[tuple[str, int], tuple[FaultPlan, list]] = {}


def plan_for(scenario: Scenario, seed: int,
             pipeline: Pipeline) -> tuple[FaultPlan, list[tuple[str, dict]]]:
    """The run's fault plan and documents, cached (a shrink replays one seed many times).
    Both are read, never changed, by a simulation."""
    key = (json.dumps(scenario.to_json(), sort_keys=True), seed,
           json.dumps(pipeline.to_json(), sort_keys=True))
    if key not in _PLANS:
        if len(_PLANS) >= 16:
            _PLANS.clear()
        plan = make_plan(scenario, seed, pipeline)
        _PLANS[key] = (plan, documents_for(plan))
    return _PLANS[key]


SCRATCH_PREFIX = "ninelives-sim-"


def scratch_dir() -> str:
    """A fresh directory for a simulated database: in memory-backed /dev/shm when there is one
    (durability is not what a simulation tests), else the system's temp directory. Its name
    carries this process's id; the directories of processes no longer alive (a simulation
    SIGKILLed before it could remove its own) are removed first, so that memory is not kept."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    _remove_abandoned(base or tempfile.gettempdir())
    return tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-", dir=base)


def _remove_abandoned(base: str) -> None:
    try:
        names = os.listdir(base)
    except OSError:
        return
    for name in names:
        pid = name[len(SCRATCH_PREFIX):].split("-", 1)[0]
        if not (name.startswith(SCRATCH_PREFIX) and pid.isdigit()) or _alive(int(pid)):
            continue
        shutil.rmtree(os.path.join(base, name), ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: alive, and not ours to clean
    return True
