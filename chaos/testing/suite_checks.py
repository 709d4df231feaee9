"""The crash-safety checks a test suite runs against its engine, each ending in an Outcome
that says pass, fail or error with the evidence a failing test shows: simulated seeds
(`check_sim`), real-process runs (`check_run`) and a time-boxed exploration
(`check_explore`). The pytest plugin (chaos.testing.pytest_plugin) is their front; they read no
pytest and can be called from any test runner.

A seed that fails is remembered (chaos.testing.remembered) and tried first next time; the first
failure ends a check, as Hypothesis stops at its first failing example. The evidence is the
harness's own rendering (chaos.reports.report, chaos.sim.story), so a failing test reads as
`ninelives sim` or `ninelives run` would print it, with the commands that replay it.
"""
from __future__ import annotations

import contextlib
import io
import os
import shutil
from dataclasses import dataclass, field
from typing import Any, Iterable

from chaos.testing.remembered import FORGET_AFTER, RememberedSeeds, check_key, order, slug

#: Witness sentences shown per failed invariant (the rest are in report.json).
WITNESSES_SHOWN = 3
#: Lines of the failing schedule's story shown (its middle is cut past this).
STORY_LINES = 40


@dataclass
class Outcome:
    """How a check ended: `result` pass, fail or error; `lines` the evidence (`message`);
    `tried` the seeds run in order as (seed, remembered, result); `report` and `run_dir` of
    the failing run (None for a pass); `not_exercised` the invariants that passed without
    reaching any of their situations in every run of the check."""

    mode: str
    title: str
    result: str = "pass"
    lines: list[str] = field(default_factory=list)
    tried: list[tuple[int, bool, str]] = field(default_factory=list)
    report: dict | None = None
    run_dir: str | None = None
    not_exercised: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.result == "pass"

    def __bool__(self) -> bool:  # `assert outcome` reads as "the engine held"
        return self.passed

    @property
    def message(self) -> str:
        return "\n".join([self.title, *self.lines])


class _Tally:
    """What the passing runs of a check reached: the situations (summed) and, per invariant
    that declares situations, whether any run exercised it."""

    def __init__(self) -> None:
        self.reached: dict[str, Any] = {}
        self.exercised: dict[str, bool] = {}

    def add(self, verdicts: Iterable[dict], situations: dict[str, Any]) -> None:
        from chaos.situations import Reached
        for v in verdicts:
            if v.get("exercised") is not None:
                self.exercised[v["name"]] = self.exercised.get(v["name"], False) or bool(
                    v["exercised"])
        for name, r in situations.items():
            have = self.reached.setdefault(name, Reached(name, observable=False, why=r.why))
            have.count += r.count
            have.observable = have.observable or r.observable

    def lines(self, runs: int) -> list[str]:
        from chaos.situations import summary_line
        if not self.reached:
            return []
        return [f"over {runs} run(s): {summary_line(self.reached)}"]

    def unexercised(self) -> list[str]:
        return sorted(n for n, done in self.exercised.items() if not done)


def tried_line(tried: list[tuple[int, bool, str]]) -> str:
    """"seeds tried, in order: 2 (remembered) fail" and so on, shortened past 12 seeds."""
    words = [f"{s}{' (remembered)' if r else ''} {res}" for s, r, res in tried]
    if len(words) > 12:
        words = words[:6] + [f"... {len(words) - 12} more ..."] + words[-6:]
    return "seeds tried, in order: " + ", ".join(words)


def witness_lines(report: dict, most: int = WITNESSES_SHOWN) -> list[str]:
    """Each failed invariant's first witnesses, as the sentences its checker wrote."""
    lines = []
    for v in report.get("verdicts") or []:
        if v["verdict"] != "fail":
            continue
        for error in (v.get("errors") or [])[:most]:
            lines.append(f"  {v['name']} ({error['type']}): {error['message']}")
        if v["error_count"] > most:
            lines.append(f"  ... {v['error_count'] - most} more {v['name']} error(s) in "
                         f"{os.path.join(report.get('run_dir', ''), 'report.json')}")
    return ["witnesses:", *lines] if lines else []


def _passed(outcome: Outcome, tally: _Tally, runs: int, require_exercised: bool,
            flag: str) -> Outcome:
    """The outcome of a check whose runs all passed; with `require_exercised`, an error when
    an invariant passed unexercised in every one (`flag`: the option that asked)."""
    outcome.not_exercised = tally.unexercised()
    outcome.lines += [tried_line(outcome.tried)] if outcome.tried else []
    outcome.lines += tally.lines(runs)
    if outcome.not_exercised:
        say = (f"ERROR: passed, but not exercised ({flag}): " if require_exercised else
               "pass, not exercised: ")
        outcome.lines.append(say + ", ".join(outcome.not_exercised) + " reached none of "
                             "their situations in any run")
        if require_exercised:
            outcome.result = "error"
    if outcome.passed:
        outcome.lines.append("PASS: every invariant with evidence holds")
    return outcome


def _refuse_server_faults(scenario: Any, what: str) -> None:
    from chaos.spec.scenario import POSTGRES_FAULTS, ScenarioError
    server = [name for name in POSTGRES_FAULTS if getattr(scenario.faults, name)]
    if server:  # the simulation has no database server: no silent pass without its faults
        raise ScenarioError(f"{scenario.path}: faults.{server[0]} {POSTGRES_FAULTS[server[0]]}"
                            f"; {what} runs in simulation, which has no database server")


def check_sim(scenario: str, engine_spec: str, *, seeds: Iterable[int], profile: str | None,
              engine_set: dict[str, Any] | None = None, swarm: bool = False,
              require_exercised: bool = False, database: str | None = None,
              out: str = "reports", shrink_budget: int = 0, shard: Any = None) -> Outcome:
    """Simulate `scenario` on the engine `engine_spec` (an adapter that declares in_process)
    at the remembered failing seeds, then at `seeds`, until one fails. A failing seed's run
    folder goes under `out`, with its schedule; with `shrink_budget` > 0 it is shrunk within
    that many simulations; with `shard` (chaos.run.shards.Shard) only that shard's seeds run.
    Raises ScenarioError, ValueError for a scenario or engine that cannot run, as `ninelives
    sim` refuses them."""
    from chaos.contract import load_engine
    from chaos.spec.scenario import load_scenario
    from chaos.sim.choices import SeededChoices
    from chaos.sim.run import simulate
    from chaos.sim.spec import SimSpec
    from chaos.sim.swarm import swarm_spec
    from chaos.situations import recognise
    engine = load_engine(engine_spec)
    loaded = load_scenario(scenario, profile, engine, engine_set)
    _refuse_server_faults(loaded, "ninelives sim")
    bank = RememberedSeeds(database, check_key("sim", engine_spec, loaded.name, loaded.profile,
                                               loaded.engine_set, swarm))
    outcome = Outcome("sim", f"ninelives sim {loaded.name} (profile {loaded.profile}, engine "
                             f"{engine_spec}{', swarm' if swarm else ''})")
    tally = _Tally()
    for seed, remembered in _sharded(bank.seeds(), seeds, shard):
        spec = SimSpec(loaded, seed, engine, engine_spec)
        spec = swarm_spec(spec) if swarm else spec
        result = simulate(spec, SeededChoices(seed))
        if result.exit_code == 0:
            outcome.tried.append((seed, remembered, "pass"))
            tally.add([v.to_json() for v in result.verdicts],
                      recognise(result.history, result.snapshot))
            if remembered and bank.passed(seed):
                outcome.lines.append(f"seed {seed} passed {FORGET_AFTER} times in a row "
                                     "since it failed: forgotten")
            continue
        outcome.tried.append((seed, remembered, "fail" if result.failed else "error"))
        if result.failed:
            bank.failed(seed, result.signature())
        return _sim_failure(outcome, spec, bank, out, shrink_budget)
    return _passed(outcome, tally, len(outcome.tried), require_exercised,
                   "--ninelives-require-exercised")


def _sim_failure(outcome: Outcome, spec: Any, bank: RememberedSeeds, out: str,
                 shrink_budget: int) -> Outcome:
    """Run the failing seed again keeping its files, and say everything about it."""
    from chaos.sim.choices import SeededChoices
    result, run_dir, report = _write_sim(spec, SeededChoices(spec.seed), out, "pytest")
    _failure_lines(outcome, result, run_dir, report)
    outcome.lines.append(f"shrink it: {report['run_command']} --shrink")
    if shrink_budget > 0 and result.failed:
        outcome.lines += shrunk_lines(result, run_dir, shrink_budget)
    if bank.folder and result.failed:
        outcome.lines.append(f"seed {spec.seed} is remembered in {bank.folder} and tried first "
                             "next time")
    return outcome


def _write_sim(spec: Any, choices: Any, out: str, label: str) -> tuple[Any, str, dict]:
    """Simulate `spec` with `choices`, keeping its database, and write its run folder."""
    from chaos.sim.output import run_dir_for, write_run
    from chaos.sim.run import simulate
    from chaos.sim.spec import scratch_dir
    db = os.path.join(scratch_dir(), "engine.db")
    try:
        result = simulate(spec, choices, keep_db=db)
        run_dir = run_dir_for(out, result, label)
        report = write_run(result, run_dir, db=db)
    finally:
        shutil.rmtree(os.path.dirname(db), ignore_errors=True)
    return result, run_dir, report


def _failure_lines(outcome: Outcome, result: Any, run_dir: str, report: dict) -> None:
    """The evidence of a failing simulated run, as `ninelives sim` prints it."""
    from chaos.reports.report_text import situations_lines, verdict_table
    from chaos.sim.story import headline, tell
    outcome.result = {1: "fail", 2: "error"}.get(result.exit_code, "fail")
    outcome.report, outcome.run_dir = report, run_dir
    word = "FAIL" if result.failed else "ERROR (a checker crashed)"
    outcome.lines += [f"seed {result.spec.seed}: {word}: {headline(result.verdicts)}"]
    if outcome.tried:
        outcome.lines.append(tried_line(outcome.tried))
    outcome.lines += ["", verdict_table(report, console=None), *situations_lines(report), ""]
    outcome.lines += witness_lines(report)
    if result.failed:
        story = tell(result.history, result.verdicts, limit=STORY_LINES)
        outcome.lines += ["", "what happened (the failing schedule; <- marks a witness):",
                          *story]
    outcome.lines += ["", f"run folder: {run_dir}", f"replay it: {report['replay_command']}",
                      f"rerun this seed: {report['run_command']}"]


def shrunk_lines(result: Any, run_dir: str, budget: int) -> list[str]:
    """Shrink `result` within `budget` simulations: the shrinker's own account, which ends
    with the counterexample's replay command."""
    from chaos.sim.cli import shrink_and_tell
    told = io.StringIO()
    with contextlib.redirect_stdout(told):
        shrink_and_tell(result, run_dir, budget, quiet=True)
    return told.getvalue().rstrip("\n").split("\n")


def check_run(scenario: str, engine_spec: str, *, seeds: Iterable[int], profile: str | None,
              engine_set: dict[str, Any] | None = None, require_exercised: bool = False,
              database: str | None = None, out: str = "reports",
              shard: Any = None) -> Outcome:
    """Run `scenario` with real processes on the engine `engine_spec` at the remembered
    failing seeds, then at `seeds`, until one does not pass; each run's folder goes under
    `out`; with `shard`, only that shard's seeds. Raises ScenarioError, HarnessError as
    `ninelives run` would exit 2 on them."""
    from chaos.contract import load_engine
    from chaos.reports.report_text import summary
    from chaos.run.runner import run_campaign
    from chaos.spec.scenario import load_scenario
    engine = load_engine(engine_spec)
    loaded = load_scenario(scenario, profile, engine, engine_set)
    bank = RememberedSeeds(database, check_key("run", engine_spec, loaded.name, loaded.profile,
                                               loaded.engine_set))
    outcome = Outcome("run", f"ninelives run {loaded.name} (profile {loaded.profile}, engine "
                             f"{engine_spec})")
    tally = _Tally()
    for seed, remembered in _sharded(bank.seeds(), seeds, shard):
        run = run_campaign(loaded, seed, engine, out, engine_spec=engine_spec, progress=False)
        report = run.report
        outcome.tried.append((seed, remembered, report["result"]))
        if run.exit_code == 0:
            tally.add(report["verdicts"], _reached(report))
            if remembered:
                bank.passed(seed)
            continue
        if run.exit_code == 1:
            bank.failed(seed, [(v["name"], t) for v in report["verdicts"]
                               if v["verdict"] == "fail" for t in v["errors_by_type"]])
        outcome.result, outcome.report, outcome.run_dir = report["result"], report, run.run_dir
        outcome.lines += [tried_line(outcome.tried), "", summary(report, console=None), ""]
        outcome.lines += witness_lines(report)
        if bank.folder and run.exit_code == 1:
            outcome.lines.append(f"seed {seed} is remembered in {bank.folder} and tried first "
                                 "next time")
        return outcome
    return _passed(outcome, tally, len(outcome.tried), require_exercised,
                   "--ninelives-require-exercised")


def _sharded(remembered: list[int], seeds: Iterable[int],
             shard: Any) -> list[tuple[int, bool]]:
    """The seeds to try (chaos.testing.remembered.order), only `shard`'s when one is given: of the
    range, its own seeds (chaos.run.shards); of the remembered, those it would own in it."""
    seeds = list(seeds)
    if shard is None or not seeds:
        return order(remembered, seeds)
    mine = shard.seeds(seeds)
    return order([s for s in remembered if shard.owns(s, seeds[0])], mine)


def _reached(report: dict) -> dict[str, Any]:
    from chaos.situations import Reached
    return {n: Reached.from_json(r) for n, r in (report.get("situations") or {}).items()}


def check_explore(scenario: str, engine_spec: str, *, budget: float, profile: str | None,
                  engine_set: dict[str, Any] | None = None, swarm: bool = True, seed: int = 0,
                  require_exercised: bool = False, database: str | None = None,
                  out: str = "reports", shard: Any = None) -> Outcome:
    """Explore `scenario` on the engine `engine_spec` for `budget` seconds (chaos.explore),
    replaying the check's corpus first (`<database>/corpus/...`, failures first), until a
    schedule fails. A failing schedule is kept in the corpus and its run folder written
    under `out`. With `require_exercised`, a pass whose exploration never reached any
    situation of an invariant that declares some is an error."""
    from chaos.contract import has, load_engine
    from chaos.explore.corpus import Corpus
    from chaos.explore.search import Explorer
    from chaos.spec.scenario import load_scenario
    engine = load_engine(engine_spec)
    if not has(engine, "in_process"):
        raise ValueError(f"engine {engine_spec!r} cannot be explored: it does not declare the "
                         "in_process capability, which simulation needs (see docs/engines.md)")
    loaded = load_scenario(scenario, profile, engine, engine_set)
    _refuse_server_faults(loaded, "ninelives explore")
    key = check_key("explore", engine_spec, loaded.name, loaded.profile, loaded.engine_set,
                    swarm)
    corpus = Corpus(os.path.join(database, "corpus", slug(key))) if database else None
    outcome = Outcome("explore", f"ninelives explore {loaded.name} (profile {loaded.profile}, "
                                 f"engine {engine_spec}, budget {budget:g} s)")
    from chaos.run.shards import WHOLE
    found = Explorer(loaded, engine, engine_spec, seed=seed, swarm=swarm, corpus=corpus,
                     shard=shard or WHOLE).explore(budget)
    if found.failure is not None:
        return _explore_failure(outcome, found, corpus, out)
    return _explored(outcome, found, corpus, require_exercised)


def _explore_failure(outcome: Outcome, found: Any, corpus: Any, out: str) -> Outcome:
    from chaos.sim.choices import ReplayChoices
    failure = found.failure
    result, run_dir, report = _write_sim(failure.spec, ReplayChoices(failure.choices), out,
                                         "explore")
    origin = found.candidate.origin if found.candidate is not None else "?"
    outcome.lines.append(f"failed after {found.seconds:.1f} s and {found.runs} schedules "
                         f"({'replayed from the corpus' if origin == 'corpus' else origin}, "
                         f"seed {failure.spec.seed}; {found.replayed} replayed from the "
                         "corpus first)")
    _failure_lines(outcome, result, run_dir, report)
    if corpus is not None:
        corpus.keep(failure, [], target=failure.signature()[0])
        outcome.lines.append(f"kept in {corpus.folder}: replayed first next time")
    return outcome


def _explored(outcome: Outcome, found: Any, corpus: Any, require_exercised: bool) -> Outcome:
    from chaos.situations import CATALOG, EXERCISES
    reached = set(found.first_reached)
    outcome.lines.append(f"{found.seconds:.1f} s, {found.runs} schedules ({found.replayed} "
                         f"from the corpus{' ' + corpus.folder if corpus else ''}): no "
                         "invariant failed")
    missed = [n for n in CATALOG if n not in reached]
    outcome.lines.append("situations reached: " + (", ".join(
        f"{n} x{found.schedules_reaching[n]}" for n in sorted(reached)) or "none")
        + "; not reached: " + (", ".join(missed) or "none"))
    outcome.not_exercised = sorted(n for n, wanted in EXERCISES.items()
                                   if wanted and not reached & set(wanted))
    if outcome.not_exercised:
        say = ("ERROR: passed, but not exercised (--ninelives-require-exercised): "
               if require_exercised else "pass, not exercised: ")
        outcome.lines.append(say + ", ".join(outcome.not_exercised) + " reached none of their "
                             "situations in any schedule")
        outcome.result = "error" if require_exercised else outcome.result
    if found.crashed:
        outcome.result = "error"
        outcome.lines.append(f"ERROR: a checker crashed in {found.crashed} schedule(s)")
    if outcome.passed:
        outcome.lines.append("PASS: every invariant with evidence holds")
    return outcome
