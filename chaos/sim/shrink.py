"""Shrinking a failing schedule with Hypothesis, and saving schedules so that they replay.

A schedule is its choice sequence (see `choices`). Hypothesis's shrinker works on exactly
that: the failing run's choices are planted in an example database, replayed by
`hypothesis.find` (phase `reuse`), and shrunk (phase `shrink`) while the run still fails the
same invariant with the same kind of error. Shrinking drives choices towards 0, which leaves
jobs, worker and sender slots and timeline faults out, lets the same thread go on, and
drops stalls and crashes: the result is a smaller, more sequential schedule.
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from chaos.spec.aim import read_aims
from chaos.contract import load_engine
from chaos.run.runfiles import scenario_record
from chaos.spec.scenario import Expect, Faults, Run, Scenario, check_saved
from chaos.sim.choices import DrawnChoices, ReplayChoices
from chaos.sim.run import simulate
from chaos.sim.spec import SimResult, SimSpec

SCHEDULE_FORMAT = "ninelives.sim-schedule/1"


@dataclass
class Shrunk:
    """The outcome of a shrink: the minimal failing run and what it took to get there."""

    result: SimResult
    target: tuple[str, str]      # (invariant, error type) the shrunk run still fails
    runs: int                    # simulations the shrinker ran
    original_choices: int


def shrink(failing: SimResult, target: tuple[str, str] | None = None, *, budget: int = 400,
           progress: Callable[[int, SimResult], None] | None = None,
           turns: Callable[[], Any] | None = None) -> Shrunk:
    """Minimise `failing` (a run that failed) to the smallest schedule Hypothesis finds that
    still fails `target` (invariant, error type; default: its first failure), within
    `budget` simulations.

    Two passes: first the schedule's shape alone (which jobs, worker and sender slots and
    timeline faults take part; the turns still come from the seed), which leaves things out
    quickly; then every choice, which also makes the interleaving sequential and drops
    stalls and crashes. `turns` makes the source of the first pass's turns (default: the
    seed's, as a seeded run draws them; a run that was not its seed's own passes one that
    replays its own). Raises ValueError if `failing` did not fail (that way), RuntimeError
    if its choices do not fail again (the simulation would not be deterministic).
    """
    from chaos.sim.choices import ShapeDrawnChoices
    signature = failing.signature()
    if not signature:
        raise ValueError("the run did not fail: there is nothing to shrink")
    if target is not None and target not in signature:
        raise ValueError(f"the run did not fail {target[0]} ({target[1]})")
    best = _Best(failing, target or signature[0], progress)
    seed = failing.spec.seed
    if failing.shape_choices and budget * 2 // 5:  # a budget of 1 or 2: no room for it
        # A run that is not its seed's own (a replay) does not reproduce here: skip to pass 2.
        _search(best, lambda draw: ShapeDrawnChoices(draw, seed, turns() if turns else None),
                failing.choices[:failing.shape_choices], budget * 2 // 5, required=False)
    _search(best, DrawnChoices, best.result.choices, budget, required=True)
    return Shrunk(best.result, best.target, best.runs, len(failing.choices))


def _search(best: "_Best", choices_for: Callable[[Any], Any], planted: list[int],
            until: int, required: bool) -> None:
    """One Hypothesis pass: replay `planted` and shrink while `best.target` still fails,
    until `best` has run `until` simulations in all."""
    from hypothesis import HealthCheck, Phase, Verbosity, find, settings
    from hypothesis import strategies as st
    from hypothesis.database import InMemoryExampleDatabase, choices_to_bytes
    from hypothesis.errors import FlakyStrategyDefinition, NoSuchExample

    @st.composite
    def schedules(draw: Any) -> SimResult:
        if best.runs >= until:
            raise _BudgetSpent()  # ends find(); the smallest failure so far is kept
        return best.run(choices_for(draw))

    key = b"ninelives.sim.shrink"
    db = InMemoryExampleDatabase()
    # One choice more than the run made: Hypothesis then treats the entry as a failure still
    # to shrink, not as one it shrank before (an exact replay of a saved entry skips shrinking).
    db.save(key, choices_to_bytes([*planted, 0]))
    config = settings(database=db, phases=[Phase.reuse, Phase.shrink], max_examples=until,
                      deadline=None, suppress_health_check=list(HealthCheck),
                      verbosity=Verbosity.quiet)
    try:
        with _fixed_seed():
            find(schedules(), lambda result: best.target in result.signature(),
                 settings=config, database_key=key)
    except NoSuchExample:
        if required:
            raise RuntimeError("the failing run's choices did not fail again when replayed: "
                               "the simulation is not deterministic here (a bug)") from None
    except _BudgetSpent:
        pass
    except FlakyStrategyDefinition:
        # find() replays the smallest failure once more before it returns; when the budget
        # ran out before that replay, the replay draws nothing and Hypothesis calls the
        # strategy inconsistent. `best` holds that failure already.
        if best.runs < until:
            raise


@contextmanager
def _fixed_seed() -> Iterator[None]:
    """Seed Hypothesis's random source, so that a shrink is itself reproducible.

    `find(random=...)` would, but a seeded find() ignores the example database, which is
    where the failing run is planted; `--hypothesis-seed` sets this module variable instead.
    """
    import hypothesis.core as core
    before = getattr(core, "global_force_seed", None)
    core.global_force_seed = 0
    try:
        yield
    finally:
        core.global_force_seed = before


class _BudgetSpent(KeyboardInterrupt):
    """Raised inside find() once the shrink has used its budget of simulations. Hypothesis
    lets a KeyboardInterrupt through at once, without recording the test case it cut short
    (any other exception would be recorded as a run that drew nothing, which Hypothesis
    then reports as an inconsistent strategy)."""


class _Best:
    """The smallest run so far that fails `target`, in Hypothesis's order (fewer choices,
    then smaller ones), and how many simulations the shrink has run."""

    def __init__(self, result: SimResult, target: tuple[str, str],
                 progress: Callable[[int, SimResult], None] | None) -> None:
        self.result, self.target, self.progress, self.runs = result, target, progress, 0

    def run(self, choices: Any) -> SimResult:
        self.runs += 1
        result = simulate(self.result.spec, choices)
        if self.target in result.signature() and _order(result) < _order(self.result):
            self.result = result
        if self.progress is not None:
            self.progress(self.runs, result)
        return result


def _order(result: SimResult) -> tuple:
    return (len(result.choices), result.choices)


# -- saved schedules -----------------------------------------------------------------------

def schedule_json(result: SimResult, target: tuple[str, str] | None = None,
                  **extra: Any) -> dict:
    """A run as a replayable schedule: scenario, seed, engine and the choices, and the
    failure it shows: `target` (invariant, error type), else its first failure."""
    fails = None
    failed = {v.name: v for v in result.failed}
    name = target[0] if target and target[0] in failed else next(iter(failed), None)
    if name is not None:
        verdict = failed[name]
        kind = target[1] if target and target[0] == name else next(iter(verdict.by_type),
                                                                    "unknown")
        fails = {"invariant": name, "type": kind, "message": verdict.reason}
    return {"format": SCHEDULE_FORMAT, "scenario": scenario_record(result.spec.scenario, result.spec.engine),
            "seed": result.spec.seed, "engine": result.spec.engine_spec,
            "choices": result.choices, "fails": fails,
            **({"swarm": result.spec.swarm} if result.spec.swarm is not None else {}), **extra}


def save_schedule(path: str, result: SimResult, target: tuple[str, str] | None = None,
                  **extra: Any) -> str:
    """Write `result` as a schedule (see schedule_json) to `path`; returns the path."""
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(schedule_json(result, target, **extra), fh, indent=1, sort_keys=True)
        fh.write("\n")
    return path


def load_schedule(path: str, engine: Any = None) -> tuple[SimSpec, list[int], dict]:
    """(spec, choices, the saved document). `engine`: the adapter to run it with (default:
    the one the schedule names, loaded like --engine). Raises ValueError naming what is
    wrong."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        raise ValueError(f"{path} does not exist") from None
    except ValueError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("format") != SCHEDULE_FORMAT:
        raise ValueError(f"{path} is not a saved simulation schedule (format "
                         f"{SCHEDULE_FORMAT!r})")
    try:
        scenario = scenario_from_json(data["scenario"])
        choices = [int(c) for c in data["choices"]]
        seed = int(data["seed"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: malformed schedule ({type(exc).__name__}: {exc})") from None
    check_saved(scenario, path)  # someone else's file: its name and counts are checked as a TOML's
    spec_name = data.get("engine") or "reference"
    engine = engine if engine is not None else load_engine(spec_name)
    # A swarm schedule's scenario is the seed's own mix already (chaos.sim.swarm).
    return SimSpec(scenario, seed, engine, spec_name, data.get("swarm")), choices, data


def replay(path: str, *, engine: Any = None,
           keep_db: str | None = None) -> tuple[SimResult, dict]:
    """Run a saved schedule again: the same choices give the same run."""
    spec, choices, data = load_schedule(path, engine)
    return simulate(spec, ReplayChoices(choices), keep_db=keep_db), data


def scenario_from_json(data: dict) -> Scenario:
    """The Scenario that `Scenario.to_json()` wrote (profile already applied)."""
    faults = dict(data["faults"])
    faults["crash_points"] = tuple(faults.get("crash_points", ()))
    faults["outages"] = tuple(tuple(w) for w in faults.get("outages", ()))
    return Scenario(name=data["name"], path=data["path"], description=data.get("description", ""),
                    profile=data["profile"], run=Run(**data["run"]), engine=dict(data["engine"]),
                    faults=Faults(**faults), expect=Expect(**data["expect"]),
                    engine_set=dict(data.get("engine_set") or {}),
                    aims=read_aims(data.get("aim", [])))


__all__ = ["SCHEDULE_FORMAT", "Shrunk", "load_schedule", "replay", "save_schedule",
           "scenario_from_json", "schedule_json", "shrink"]
