"""`ninelives explore`: seek the rare situations in simulation, within a time budget.

    ninelives explore SCENARIO [--engine E] [--budget 5m] [--seed N] [--corpus DIR]
                      [--out DIR] [--profile P] [--engine-set NAME=VALUE ...] [--no-swarm]
                      [--shrink-budget K] [--shard I/N] [--quiet]

Prints a line for each situation first reached (and every few seconds how far it got), stops
at the first failure with its shrunk counterexample and the command that replays it (exit
1), or at the end of the budget with the table of situations reached and not (exit 0). Exit
2: the command could not run (an engine without the in_process capability among others).
The campaign's record goes into --out (chaos.run.campaign: campaign.json, summary.md, junit.xml,
report.html). `--shard I/N` explores 1/N of the budget with the seeds of shard I alone
(chaos.run.shards); `ninelives merge` combines the shards' folders.
"""
from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import sys
import time

from chaos.run.campaign import Tally, campaign_key, campaign_lines, campaign_record, write_campaign
from chaos.reports.console import Column, table
from chaos.contract import has
from chaos.run.shards import WHOLE, shard
from chaos.sim.choices import ReplayChoices
from chaos.sim.cli import shrink_and_tell
from chaos.sim.output import run_dir_for, write_run
from chaos.sim.run import simulate
from chaos.sim.spec import SimResult, scratch_dir
from chaos.sim.story import headline
from chaos.sim.swarm import describe as describe_swarm
from chaos.explore.corpus import Corpus, default_dir
from chaos.explore.coverage import catalog
from chaos.explore.schedules import Candidate, PrefixChoices
from chaos.explore.search import Explorer, Listener, Outcome

#: Seconds between two progress lines when nothing new is reached.
QUIET_LINE_EVERY = 10.0


def budget(text: str) -> float:
    """An argparse type for --budget: seconds, as `90`, `90s`, `5m` or `1h`."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not match or float(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"must be seconds > 0, as 90, 90s, 5m or 1h; got "
                                         f"{text[:40]!r}")
    return float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `explore` subcommand's arguments."""
    from chaos.commands.flags import at_least
    p = sub.add_parser("explore", help="coverage-guided search in simulation for the rare "
                                       "situations, with swarm testing and a kept corpus")
    p.add_argument("scenario", help="a scenario file, or a name from scenarios/")
    p.add_argument("--engine", default="reference", help="reference, or module:object (an "
                   "adapter that declares in_process)")
    p.add_argument("--budget", type=budget, default=300.0,
                   help="how long to explore: seconds, or with s/m/h (default 5m)")
    p.add_argument("--seed", type=int, default=0, help="the explorer's own seed (default 0)")
    p.add_argument("--corpus", default=None, help="the folder of kept schedules, replayed "
                   "first (default .ninelives/corpus/<scenario>-<profile>-<engine>)")
    p.add_argument("--out", default="reports", help="where a failure's run folder goes")
    p.add_argument("--profile", default=None, help="smoke, ci (default) or soak")
    p.add_argument("--engine-set", action="append", default=[], metavar="NAME=VALUE",
                   help="an engine setting over the scenario's [engine] table (repeatable)")
    p.add_argument("--no-swarm", dest="swarm", action="store_false",
                   help="fresh seeds run the scenario's faults as written, not a mix each")
    p.add_argument("--shrink-budget", type=at_least(1), default=300,
                   help="simulations the shrink of a failure may run (default 300)")
    p.add_argument("--shard", type=shard, default=None,
                   help="I/N: explore as shard I of N, for 1/N of the budget, drawing, "
                        "replaying and mutating only the seeds s with (s - 1) %% N == I - 1; "
                        "`ninelives merge` combines the N shards' folders")
    p.add_argument("--quiet", action="store_true", help="no progress lines")


def cmd_explore(args: argparse.Namespace) -> int:
    from chaos.contract import load_engine
    from chaos.spec.scenario import POSTGRES_FAULTS, ScenarioError, load_scenario, parse_engine_set
    engine = load_engine(args.engine)
    if not has(engine, "in_process"):
        raise ValueError(f"engine {args.engine!r} cannot be explored: it does not declare the "
                         "in_process capability, which simulation needs (see docs/engines.md)")
    scenario = load_scenario(args.scenario, args.profile, engine,
                             parse_engine_set(args.engine_set))
    server = [name for name in POSTGRES_FAULTS if getattr(scenario.faults, name)]
    if server:
        raise ScenarioError(f"{scenario.path}: faults.{server[0]} {POSTGRES_FAULTS[server[0]]}"
                            "; explore runs in simulation, which has no database server")
    corpus = Corpus(args.corpus or default_dir(scenario.name, scenario.profile, args.engine,
                                               args.swarm))
    print(f"ninelives explore {scenario.name} (profile {scenario.profile}, engine "
          f"{args.engine}): budget {args.budget:g} s, "
          f"{'swarm testing' if args.swarm else 'faults as written'}, explorer seed "
          f"{args.seed}, corpus {corpus.folder}", flush=True)
    printer, began = _Printer(args.quiet), time.time()
    part = args.shard or WHOLE
    explorer = Explorer(scenario, engine, args.engine, seed=args.seed, swarm=args.swarm,
                        corpus=corpus, listener=printer, shard=part)
    from chaos.reports.console import Progress
    # where it stands on stderr at a steady rate, however long one schedule takes; the lines
    # of news (a situation first reached) stay on stdout
    with Progress("explore", args.budget / part.count, unit="s",
                  enabled=not args.quiet) as printer.shown:
        printer.shown.update(0, detail="the first schedule")
        outcome = explorer.explore(args.budget / part.count)
    for warning in corpus.warnings:
        print(f"warning: corpus {warning}", file=sys.stderr)
    if outcome.failure is not None:
        code = _failed(outcome, corpus, args, printer.tally)
    else:
        _summary(outcome, corpus)
        code = 2 if outcome.crashed else 0
    key = campaign_key("explore", scenario, args.engine, swarm=bool(args.swarm),
                       explorer_seed=args.seed, budget=args.budget)
    record = campaign_record(key, printer.tally, [part], began,
                             budget_per_shard=args.budget / part.count)
    write_campaign(args.out, record)
    print("\n".join(campaign_lines(record, args.out)))
    return code


class _Printer(Listener):
    """Progress lines on stdout: each situation first reached, and a line every
    QUIET_LINE_EVERY seconds otherwise."""

    def __init__(self, quiet: bool) -> None:
        self.quiet, self.last = quiet, 0.0
        self.shown = None  # the command's Progress line, while it explores
        self.total = len(catalog())
        self.tally = Tally(list_seeds=False)  # every schedule run, for campaign.json

    def _say(self, explorer: Explorer, text: str) -> None:
        self.last = explorer.elapsed
        if not self.quiet:
            print(f"{explorer.elapsed:7.1f} s {explorer.runs:6d} schedules "
                  f"{len(explorer.first):3d}/{self.total} situations  {text}", flush=True)

    def replaying(self, count: int, folder: str) -> None:
        if not self.quiet:
            print(f"replaying the corpus first: {count} schedules from {folder}", flush=True)

    def reached(self, explorer: Explorer, new: list[str], candidate: Candidate) -> None:
        fresh = [n for n in new if "@" not in n and "*" not in n]
        if fresh:
            self._say(explorer, f"+{', '.join(fresh)} ({_origin(candidate)})")

    def ran(self, explorer: Explorer, result: SimResult) -> None:
        _tally(self.tally, result)
        if self.shown is not None:
            self.shown.update(min(explorer.elapsed, self.shown.total),
                              detail=f"{explorer.runs} schedules, {len(explorer.first)}/"
                                     f"{self.total} situations")
        if explorer.elapsed - self.last >= QUIET_LINE_EVERY:
            self._say(explorer, f"{len(explorer.hits)} features, {len(explorer.kept)} kept")

    def checker_crashed(self, explorer: Explorer, result: SimResult) -> None:
        crashed = ", ".join(v.name for v in result.verdicts if "traceback" in v.metrics)
        print(f"seed {result.spec.seed}: ERROR a checker crashed: {crashed}", file=sys.stderr,
              flush=True)


def _origin(candidate: Candidate | None) -> str:
    if candidate is None:
        return "?"
    if candidate.origin == "fresh":
        return f"fresh seed {candidate.seed}"
    if candidate.origin == "corpus":
        return f"corpus, seed {candidate.seed}"
    return f"{candidate.origin} of seed {candidate.seed}"


def _tally(tally: Tally, result: SimResult, **failing) -> None:
    from chaos.situations import recognise
    tally.add(result.spec.seed, [v.to_json() for v in result.verdicts],
              recognise(result.history, result.snapshot) if result.history else {},
              result.exit_code, **failing)


def _failed(outcome: Outcome, corpus: Corpus, args: argparse.Namespace, tally: Tally) -> int:
    """Keep the failing run's folder, shrink it, print the counterexample and how to replay
    it, and keep it in the corpus (so that the next exploration replays it first); the
    failing run goes to `tally` with its folder and the commands that rerun it."""
    failure = outcome.failure
    print(f"\nFAIL after {outcome.seconds:.1f} s and {outcome.runs} schedules "
          f"({_origin(outcome.candidate)}): {headline(failure.verdicts)}", flush=True)
    if failure.spec.swarm is not None:
        print(describe_swarm(failure.spec.swarm))
    result, run_dir = _write_failure(failure, args.out)
    print(f"run folder: {run_dir}\nreplay it: ninelives sim --replay "
          f"{os.path.join(run_dir, 'schedule.json')}", flush=True)
    replay = f"ninelives sim --replay {os.path.join(run_dir, 'schedule.json')}"
    _tally(tally, failure, run_dir=os.path.relpath(run_dir, args.out), rerun=replay,
           replay=replay)
    shrunk = shrink_and_tell(result, run_dir, args.shrink_budget, args.quiet,
                             turns=_own_turns(outcome, result))
    corpus.keep(shrunk.result, [], target=shrunk.target)
    return 1


def _own_turns(outcome: Outcome, result: SimResult):
    """For the shrinker's pass over the schedule's shape: the failing run's own turns, when
    they are not its seed's (a mutated schedule); None for a fresh seed's run."""
    if outcome.candidate is not None and outcome.candidate.origin == "fresh":
        return None
    record = tuple(result.choices[result.shape_choices:])
    return lambda: PrefixChoices(record, random.Random(0))


def _write_failure(failure: SimResult, out: str) -> tuple[SimResult, str]:
    """Run the failing schedule again from its record, keeping its database, and write its
    folder (the record replays exactly: a second run that fails otherwise is warned of)."""
    db = os.path.join(scratch_dir(), "engine.db")
    try:
        result = simulate(failure.spec, ReplayChoices(failure.choices), keep_db=db)
        if result.signature() != failure.signature():
            print("WARNING the failing schedule failed differently when run again: the "
                  "simulation is not deterministic here (a bug)", file=sys.stderr)
        run_dir = run_dir_for(out, result, "explore")
        write_run(result, run_dir, db=db)
    finally:
        shutil.rmtree(os.path.dirname(db), ignore_errors=True)
    return (result if result.failed else failure), run_dir


SITUATION_COLUMNS = (Column("situation"), Column("first reached", "right"),
                     Column("schedules", "right"), Column("what it is", wraps=True))


def _summary(outcome: Outcome, corpus: Corpus) -> None:
    known = catalog()
    reached = sorted(outcome.first_reached, key=lambda n: outcome.first_reached[n])
    rows = [[name, f"+{outcome.first_reached[name][0]:.1f} s (#{outcome.first_reached[name][1]})",
             outcome.schedules_reaching[name], known.get(name, "")] for name in reached]
    missing = [n for n in known if n not in outcome.first_reached]
    rows += [[name, "not observable" if name in outcome.unobservable else "not reached", 0,
              outcome.unobservable.get(name) or known[name]] for name in missing]
    print(f"\n{outcome.seconds:.1f} s, {outcome.runs} schedules ({outcome.replayed} from the "
          f"corpus), {outcome.features} features, {outcome.kept} schedules kept in "
          f"{corpus.folder}: no invariant failed")
    print(f"situations reached: {len(reached)} of {len(known)}")
    print(table(SITUATION_COLUMNS, rows))
