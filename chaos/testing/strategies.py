"""Hypothesis strategies for your own property tests of an engine: draw scenarios, fault
plans and whole simulated runs within the harness's bounds, and shrink a failure.

    from hypothesis import given, settings
    from chaos.testing.strategies import assert_holds, scenarios, simulations

    @settings(max_examples=20, deadline=None)
    @given(simulations(scenarios("smoke", engine="myproject.adapter:ENGINE")))
    def test_my_engine_holds_its_invariants(run):
        assert_holds(run)

`scenarios()` draws a Scenario from a base scenario file with its [run] and [faults]
redrawn (`runs()`, `faults()`), each value inside chaos.spec.limits and checked as a scenario
file's are; `fault_plans()` the plan a drawn scenario and seed give; `simulations()` runs one
in simulation at a drawn seed. When a run fails, Hypothesis shrinks the scenario and the seed
(towards fewer jobs, workers and faults), and `assert_holds`, for the example Hypothesis
reports, writes the run's folder and shrinks its schedule with the simulation's shrinker
(`ninelives sim --shrink`: towards a sequential interleaving), each with the command that
replays it; every failing example's message has the witnesses and the story.

Importing this module imports Hypothesis; the pytest plugin never does.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any

from hypothesis import strategies as st

from chaos.spec.scenario import Faults, Run, Scenario

#: Fault rates drawn (per second of the chaos phase), with the most each is drawn at.
RATES = {"kill": 2.0, "pause": 1.0, "lease_expiry": 1.0, "contention": 1.0, "operator": 1.0}
#: Fault shares drawn (of calls, of requests, of documents), with the most of each.
SHARES = {"provider_429": 0.2, "provider_5xx": 0.2, "hang": 0.1, "slow": 0.2, "reset": 0.1,
          "receiver_5xx": 0.2, "receiver_timeout": 0.1, "receiver_drop": 0.1,
          "receiver_lost": 0.1, "duplicate_same": 0.2, "duplicate_different": 0.2,
          "declined": 0.1, "poison": 0.2, "crash_loop": 0.15, "unavailable": 0.1}
#: Faults that make a correct engine pay for a call twice by design (a call outlives its
#: timeout or its lease): a drawn scenario with any of them allows that duplicate spend, as
#: scenarios/everything.toml does, so that lease-exclusive judges overlap, not the fault.
SPENDTHRIFT = ("slow", "pause", "lease_expiry")
SPENDTHRIFT_ALLOWANCE = 1.0
#: Durations drawn, in seconds: (least, most).
SECONDS = {"pause_seconds": (0.1, 4.0), "hang_seconds": (0.1, 4.0),
           "slow_seconds": (0.1, 4.0), "contention_seconds": (0.05, 1.0)}


def _share(most: float) -> st.SearchStrategy[float]:
    return st.floats(0.0, most, allow_nan=False, allow_infinity=False)


def runs(*, jobs: tuple[int, int] = (1, 12), workers: tuple[int, int] = (1, 3),
         senders: tuple[int, int] = (1, 2),
         chaos: tuple[float, float] = (0.5, 6.0)) -> st.SearchStrategy[Run]:
    """A scenario's [run] table: counts and the chaos phase within the given (least, most)
    bounds (kept small by default: each run is a simulation of its own). At least one
    sender by default: without one, no effect is ever sent, which effects-complete fails."""
    return st.builds(
        Run, jobs=st.integers(*jobs), workers=st.integers(*workers),
        senders=st.integers(*senders),
        chaos=st.floats(*chaos, allow_nan=False, allow_infinity=False),
        heal=st.just(0.5), drain=st.just(60.0), needs_review=_share(0.1))


def faults(*, kinds: tuple[str, ...] | None = None,
           crash_points: bool = True) -> st.SearchStrategy[Faults]:
    """A scenario's [faults] table: each kind of `kinds` (default: every fault simulation
    applies, RATES and SHARES) left out or drawn within its bound, and crash points armed
    everywhere at a drawn probability. Faults only a PostgreSQL server undergoes are never
    drawn (the simulation has none). Leaving faults out is the simpler case Hypothesis
    shrinks towards. Raises ValueError at once for a kind it does not draw."""
    chosen = kinds if kinds is not None else tuple(RATES) + tuple(SHARES)
    unknown = [k for k in chosen if k not in RATES and k not in SHARES]
    if unknown:
        raise ValueError(f"faults(kinds=...): {unknown[0]!r} is not a fault this strategy "
                         f"draws (known: {', '.join([*RATES, *SHARES])})")
    return _faults(tuple(chosen), crash_points)


@st.composite
def _faults(draw: Any, chosen: tuple[str, ...], crash_points: bool) -> Faults:
    values: dict[str, Any] = {}
    for kind in chosen:
        most = RATES.get(kind) or SHARES[kind]
        if draw(st.booleans()):
            values[kind] = draw(_share(most))
    for name, (least, most) in SECONDS.items():
        values[name] = draw(st.floats(least, most, allow_nan=False, allow_infinity=False))
    if crash_points and draw(st.booleans()):
        values["crash_points"] = ("*",)
        values["crash_point_probability"] = draw(st.floats(0.005, 0.1))
    return Faults(**values)


@st.composite
def scenarios(draw: Any, base: str = "smoke", *, profile: str = "ci", engine: Any = None,
              engine_set: dict[str, Any] | None = None,
              run: st.SearchStrategy[Run] | None = None,
              fault_tables: st.SearchStrategy[Faults] | None = None) -> Scenario:
    """A scenario: the file (or name) `base` loaded for `engine` (an adapter or its spec;
    default the reference) at `profile` with `engine_set` over its [engine] table (as
    --engine-set gives it), with its [run] and [faults] drawn from `run` and
    `fault_tables` (default `runs()`, `faults()`), its [engine] table kept (its duplicate
    spend allowance raised to SPENDTHRIFT_ALLOWANCE when a SPENDTHRIFT fault is drawn). Each
    drawn scenario passes the checks a scenario file passes (chaos.spec.scenario.check_saved) and the
    engine's (its crash points)."""
    from chaos.spec.scenario import check_for_engine, check_saved
    engine = _engine(engine)[0]
    loaded = _base(base, profile, engine, engine_set)
    table = draw(run if run is not None else runs())
    drawn = draw(fault_tables if fault_tables is not None else faults())
    drawn = dataclasses.replace(
        drawn, heartbeat_off_workers=min(drawn.heartbeat_off_workers, table.workers),
        skewed_workers=min(drawn.skewed_workers, table.workers),
        kill=drawn.kill if table.workers + table.senders else 0.0)
    expect = loaded.expect
    if any(getattr(drawn, name) for name in SPENDTHRIFT):
        expect = dataclasses.replace(expect, duplicate_spend_allowance=max(
            expect.duplicate_spend_allowance, SPENDTHRIFT_ALLOWANCE))
    scenario = dataclasses.replace(loaded, run=table, faults=drawn, expect=expect)
    check_saved(scenario, f"a scenario drawn from {loaded.name}")
    check_for_engine(scenario, engine)
    return scenario


def fault_plans(scenario_strategy: st.SearchStrategy[Scenario] | None = None, *,
                engine: Any = None,
                seeds: st.SearchStrategy[int] = st.integers(1, 2**31 - 1)
                ) -> st.SearchStrategy[Any]:
    """The fault plan (chaos.spec.plan.FaultPlan) of a drawn scenario (default `scenarios()`)
    and seed on `engine`'s pipeline: what a run of them will do, decided before it starts."""
    from chaos.spec.plan import make_plan
    adapter = _engine(engine)[0]
    drawn = scenario_strategy if scenario_strategy is not None else scenarios(engine=adapter)
    return st.builds(lambda s, seed: make_plan(s, seed, adapter.pipeline), drawn, seeds)


@st.composite
def simulations(draw: Any, scenario_strategy: st.SearchStrategy[Scenario] | None = None, *,
                engine: Any = "reference",
                seeds: st.SearchStrategy[int] = st.integers(1, 10_000)) -> Any:
    """A simulated run (chaos.sim.SimResult) of a drawn scenario (default `scenarios()`) and
    seed on `engine` (a spec, e.g. "myproject.adapter:ENGINE", which must declare
    in_process). Its schedule is the seed's, as `ninelives sim --seed N` runs it: a
    schedule drawn by Hypothesis itself would be unfair (it shrinks towards letting one
    thread run for ever, starving the others), so Hypothesis shrinks the scenario and the
    seed, and `assert_holds` shrinks the failing schedule with the simulation's shrinker."""
    from chaos.sim.choices import SeededChoices
    from chaos.sim.run import simulate
    from chaos.sim.spec import SimSpec
    adapter, spec = _engine(engine)
    if spec is None:
        raise TypeError(f"simulations(engine=...) takes an adapter spec (a string such as "
                        f"'myproject.adapter:ENGINE', which the replay command names), got "
                        f"{type(engine).__name__}")
    scenario = draw(scenario_strategy if scenario_strategy is not None
                    else scenarios(engine=adapter))
    seed = draw(seeds)
    return simulate(SimSpec(scenario, seed, adapter, spec), SeededChoices(seed))


def assert_holds(result: Any, *, out: str = os.path.join(".ninelives", "runs"),
                 shrink_budget: int = 100) -> None:
    """Raise AssertionError unless every invariant of the simulated run `result` held (an
    `unknown` verdict did not fail). The message has the witnesses and the story. For the
    final example Hypothesis reports (its smallest scenario and seed), or outside a
    Hypothesis test, it also has the verdict table, the run's folder (written under `out`)
    with the command that replays it, and the schedule shrunk by the simulation's shrinker
    within `shrink_budget` simulations (0: none) with its own replay command."""
    from chaos.sim.story import headline, tell
    if not result.failed:
        return
    lines = [f"FAIL: {headline(result.verdicts)} (seed {result.spec.seed})",
             *(f"  {v.name} ({f.type}): {f.message}" for v in result.failed
               for f in v.failures[:3])]
    lines += ["", "what happened:", *tell(result.history, result.verdicts, limit=40)]
    if _final():
        lines += _kept(result, out, shrink_budget)
    raise AssertionError("\n".join(lines))


def _final() -> bool:
    """Whether this is the example Hypothesis reports (or no Hypothesis test runs)."""
    try:
        from hypothesis.control import current_build_context
        return current_build_context().is_final
    except Exception:  # outside a Hypothesis test: there is no context
        return True


def _kept(result: Any, out: str, shrink_budget: int) -> list[str]:
    from chaos.reports.report_text import verdict_table
    from chaos.sim.output import run_dir_for, write_run
    run_dir = run_dir_for(out, result, "hypothesis")
    report = write_run(result, run_dir)
    lines = ["", verdict_table(report, console=None), "", f"run folder: {run_dir}",
             f"replay it: {report['replay_command']}"]
    return lines + (_shrunk_apart(result, run_dir, shrink_budget) if shrink_budget > 0 else [])


def _shrunk_apart(result: Any, run_dir: str, budget: int) -> list[str]:
    """The simulation's shrinker's account of `result`, run in a thread of its own, joined
    before this returns: the shrinker is a Hypothesis search, and one started from inside a
    test Hypothesis runs would be taken for a nested @given (Hypothesis knows its running
    test per thread). The outer example is the final one: nothing is generated meanwhile."""
    import threading

    from chaos.testing.suite_checks import shrunk_lines
    told: list[str] = []

    def shrink() -> None:
        try:
            told.extend(shrunk_lines(result, run_dir, budget))
        except Exception as exc:  # the evidence above stands without the shrink
            told.append(f"(the shrink failed: {type(exc).__name__}: {exc})")

    worker = threading.Thread(target=shrink, name="ninelives-shrink")
    worker.start()
    worker.join()
    return told


_ENGINES: dict[str, Any] = {}
_BASES: dict[tuple, Scenario] = {}


def _engine(engine: Any) -> tuple[Any, str | None]:
    """(the adapter, its spec) of `engine`: a spec string, None (the reference), or an
    adapter object (its spec None: nothing names it for a replay command)."""
    from chaos.contract import load_engine
    if engine is None or isinstance(engine, str):
        spec = engine or "reference"
        if spec not in _ENGINES:
            _ENGINES[spec] = load_engine(spec)
        return _ENGINES[spec], spec
    return engine, None


def _base(base: str, profile: str, engine: Any, engine_set: dict[str, Any] | None) -> Scenario:
    """The base scenario, loaded once per test session (a strategy draws many)."""
    from chaos.spec.scenario import load_scenario
    key = (base, profile, id(engine), repr(sorted((engine_set or {}).items())))
    if key not in _BASES:
        _BASES[key] = load_scenario(base, profile, engine, engine_set)
    return _BASES[key]


__all__ = ["assert_holds", "fault_plans", "faults", "runs", "scenarios", "simulations"]
