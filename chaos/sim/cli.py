"""`ninelives sim`: explore seeds in simulation, shrink a failure, replay a saved schedule.

    ninelives sim SCENARIO [--seed N | --seeds N|A..B [--shard I/N]] [--profile P] [--engine E]
                  [--out DIR] [--engine-set NAME=VALUE ...] [--swarm] [--shrink] [--budget K]
    ninelives sim --replay FILE [--out DIR]

Over several seeds it writes the campaign's record into --out (chaos.run.campaign:
campaign.json, summary.md, junit.xml, report.html); `--shard I/N` runs the seeds of shard I
only (chaos.run.shards) and `ninelives merge` combines the shards' folders.

Exit codes: 0 every explored schedule passed, 1 one failed, 2 the command could not run.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from typing import Any

from chaos.spec.aim import summary_lines as aim_summary_lines
from chaos.run.campaign import Tally, campaign_key, campaign_lines, campaign_record, write_campaign
from chaos.reports.console import Progress
from chaos.commands.flags import SEEDS_HELP, at_least, seeds, seeds_text
from chaos.reports.report_text import situations_lines, verdict_table
from chaos.run.shards import SHARD_HELP, WHOLE, shard
from chaos.sim.choices import SeededChoices
from chaos.sim.output import run_dir_for, write_run
from chaos.sim.run import simulate
from chaos.sim.spec import SimResult, SimSpec, scratch_dir
from chaos.sim.shrink import Shrunk, replay, save_schedule, shrink
from chaos.sim.story import headline, shape, tell
from chaos.sim.swarm import describe as describe_swarm, swarm_spec


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The `sim` subcommand's arguments."""
    p = sub.add_parser("sim", help="simulate a scenario in one process: exact replays, "
                                   "shrinking to a minimal failing schedule")
    p.add_argument("scenario", nargs="?", help="a scenario file, or a name from scenarios/")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--seed", type=int, default=None,
                       help="one seed: its run folder is written, pass or fail")
    which.add_argument("--seeds", type=seeds, default="1..20",
                       help=f"seeds to explore: {SEEDS_HELP} (default 1..20); a failing "
                            "seed's run folder is written")
    p.add_argument("--profile", default=None, help="smoke, ci (default) or soak")
    p.add_argument("--engine", default="reference", help="reference, or module:object "
                   "(an adapter that declares in_process, e.g. chaos.mutants:NAME or "
                   "examples.toy_engine.adapter:TOY)")
    p.add_argument("--engine-set", action="append", default=[], metavar="NAME=VALUE",
                   help="an engine setting over the scenario's [engine] table, e.g. slots=4 "
                        "(a TOML value; repeat for more); recorded, and given again by the "
                        "command that explores the seed again")
    p.add_argument("--out", default="reports", help="where run folders go")
    p.add_argument("--replay", metavar="FILE", help="run a saved schedule.json or "
                   "counterexample.json again")
    p.add_argument("--swarm", action="store_true",
                   help="swarm testing: each seed runs its own mix of the scenario's faults "
                        "(some left out, the others at 0.5-3x), recorded in the run")
    p.add_argument("--shrink", action="store_true",
                   help="shrink the first failing seed to a minimal schedule")
    p.add_argument("--budget", type=at_least(1), default=500,
                   help="simulations a shrink may run (default 500)")
    p.add_argument("--shard", type=shard, default=None, help=SHARD_HELP)
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--require-exercised", action="store_true",
                   help="with --seed or --replay: an invariant that passed without reaching "
                        "any of the dangerous situations that exercise it ('pass, not "
                        "exercised') makes the result an error, exit 2")


def cmd_sim(args: argparse.Namespace) -> int:
    if args.shard is not None and (args.seed is not None or args.replay):
        raise ValueError(f"--shard {args.shard} splits --seeds A..B among shards; "
                         f"{'--seed N' if args.seed is not None else '--replay'} runs one")
    if args.replay:
        return _replay(args)
    if not args.scenario:
        raise ValueError("ninelives sim needs a SCENARIO (or --replay FILE)")
    from chaos.contract import load_engine
    from chaos.spec.scenario import POSTGRES_FAULTS, ScenarioError, load_scenario, parse_engine_set
    engine = load_engine(args.engine)
    scenario = load_scenario(args.scenario, args.profile, engine,
                             parse_engine_set(args.engine_set))
    server = [name for name in POSTGRES_FAULTS if getattr(scenario.faults, name)]
    if server:  # the simulation has no database server: no silent pass without its faults
        raise ScenarioError(f"{scenario.path}: faults.{server[0]} {POSTGRES_FAULTS[server[0]]}"
                            "; run it with `ninelives run --backend postgres`, not sim")
    chosen = args.seeds if args.seed is None else range(args.seed, args.seed + 1)
    mine = (args.shard or WHOLE).seeds(chosen)  # ValueError naming --shard: none of them
    say = (lambda *a: None) if args.quiet else (lambda *a: print(*a, file=sys.stderr,
                                                                    flush=True))
    say(f"ninelives sim {scenario.name} (profile {scenario.profile}, engine {args.engine}): "
        f"seeds {seeds_text(chosen)}"
        + (f", shard {args.shard}: {len(mine)} seeds" if args.shard else "")
        + f", {scenario.run.jobs} jobs, "
        f"{scenario.run.workers} workers" + (f" x {scenario.engine['slots']} slots"
                                             if scenario.engine.get("slots", 1) > 1 else ""))
    if len(chosen) == 1 and args.shard is None:
        return _one(_spec(scenario, chosen.start, engine, args), args)
    return _explore(scenario, engine, mine, args)


def _one(spec: SimSpec, args: argparse.Namespace) -> int:
    result, run_dir = _run_and_write(spec, args.out)
    _print_result(result, run_dir)
    if result.failed and args.shrink:
        _shrink(result, run_dir, args)
    return _required(run_dir, result.exit_code, args)


def _required(run_dir: str, code: int, args: argparse.Namespace) -> int:
    """--require-exercised over the run written in `run_dir`: its report says so, and a
    pass with an invariant not exercised becomes an error (exit 2)."""
    if not getattr(args, "require_exercised", False):
        return code
    from chaos.reports.report import require_exercised, write_report
    from chaos.reports.report_text import result_line
    from chaos.run.runner import render_reports
    from chaos.run.saved import load_report
    report = require_exercised(load_report(run_dir))
    write_report(run_dir, report)
    render_reports(run_dir)
    if report["exit_code"] != code:
        print(result_line(report))
    return report["exit_code"]


def _explore(scenario, engine, seeds: range, args: argparse.Namespace) -> int:
    """Run every seed's schedule, counting them on a progress line; a failing one is run
    again to keep its folder, and with --shrink the first is shrunk and ends the search."""
    started, began = time.perf_counter(), time.time()
    tally = Tally()
    with Progress("sim", len(seeds), unit="schedules", enabled=not args.quiet) as shown:
        failing, crashed, first_failure = _explore_seeds(scenario, engine, seeds, args, shown,
                                                         tally)
    record = _campaign(scenario, args, tally, began, stopped=first_failure is not None)
    if first_failure is not None:
        _shrink(*first_failure, args)  # after the count's line: one progress line at a time
    took = time.perf_counter() - started
    done = seeds.index(failing[-1]) + 1 if failing and args.shrink else len(seeds)
    print(f"{done} schedules in {took:.1f} s ({done / took * 60:.0f}/min): "
          + (f"{len(failing)} failed (seeds {', '.join(map(str, failing))})" if failing
             else "no invariant failed in any schedule"))
    print("\n".join(campaign_lines(record, args.out)))
    return 1 if failing else (2 if crashed else 0)


def _campaign(scenario, args: argparse.Namespace, tally: Tally, began: float,
              stopped: bool) -> dict:
    """Write the campaign's record and pages (chaos.run.campaign) into --out; returns it."""
    key = campaign_key("sim", scenario, args.engine, seeds=seeds_text(args.seeds),
                       swarm=bool(args.swarm))
    extra = {"stopped_at_first_failure": True} if stopped else {}
    record = campaign_record(key, tally, [args.shard or WHOLE], began, **extra)
    write_campaign(args.out, record)
    return record


def _tally(tally: Tally, result: SimResult, run_dir: str | None, out: str) -> None:
    """Add one seed's run to the campaign: a failing one with its folder and commands."""
    from chaos.situations import recognise
    from chaos.sim.output import sim_command
    kept = {} if run_dir is None else {
        "run_dir": os.path.relpath(run_dir, out), "rerun": sim_command(result),
        "replay": f"ninelives sim --replay {os.path.join(run_dir, 'schedule.json')}"}
    tally.add(result.spec.seed, [v.to_json() for v in result.verdicts],
              recognise(result.history, result.snapshot) if result.history else {},
              result.exit_code, **kept)


def _explore_seeds(scenario, engine, seeds: range, args: argparse.Namespace, shown: Progress,
                   tally: Tally) -> tuple[list[int], list[int], tuple[SimResult, str] | None]:
    """(failing seeds, seeds whose checker crashed, the first failure's result and folder
    when --shrink asks for it, which stops the search); each seed's run goes to `tally`."""
    failing, crashed = [], []
    for i, seed in enumerate(seeds, 1):
        spec = _spec(scenario, seed, engine, args)
        result, run_dir = simulate(spec, SeededChoices(seed)), None
        if result.exit_code == 2:
            crashed.append(seed)
            print(f"seed {seed}: ERROR a checker crashed: "
                  f"{', '.join(v.name for v in result.verdicts if 'traceback' in v.metrics)}",
                  file=sys.stderr, flush=True)
        if result.failed:
            first = result.signature()
            result, run_dir = _run_and_write(spec, args.out)  # again, keeping its files
            if result.signature() != first:
                print(f"seed {seed}: WARNING the second run of this seed failed differently: "
                      "the simulation is not deterministic here (a bug)", file=sys.stderr)
            failing.append(seed)
            print(f"seed {seed}: FAIL {headline(result.verdicts)}\n  {run_dir}", flush=True)
            if spec.swarm is not None:
                print(f"  {describe_swarm(spec.swarm)}", flush=True)
        _tally(tally, result, run_dir, args.out)
        if result.failed and args.shrink:
            return failing, crashed, (result, run_dir)
        shown.update(i, detail=f"{len(failing)} failed")
    return failing, crashed, None


def _spec(scenario, seed: int, engine, args: argparse.Namespace) -> SimSpec:
    """The spec of one seed: with --swarm, the seed's own mix of faults (chaos.sim.swarm)."""
    spec = SimSpec(scenario, seed, engine, args.engine)
    return swarm_spec(spec) if args.swarm else spec


def _run_and_write(spec: SimSpec, out: str, label: str = "") -> tuple[SimResult, str]:
    db = os.path.join(scratch_dir(), "engine.db")
    try:
        result = simulate(spec, SeededChoices(spec.seed), keep_db=db)
        run_dir = run_dir_for(out, result, label)
        write_run(result, run_dir, db=db)
    finally:
        _remove_scratch(db)
    return result, run_dir


def _remove_scratch(db: str) -> None:
    shutil.rmtree(os.path.dirname(db), ignore_errors=True)


def _print_result(result: SimResult, run_dir: str, target: str | None = None) -> None:
    from chaos.sim.output import report_for
    report = report_for(result, run_dir, os.path.join(run_dir, "schedule.json"))
    print(verdict_table(report))
    for line in situations_lines(report):
        print(line)
    for line in aim_summary_lines(report):  # aimed faults (chaos.spec.aim): fired, with evidence
        print(line)
    print(f"\n{'FAIL' if result.failed else 'PASS'}: {headline(result.verdicts, target)}")
    if result.spec.swarm is not None:
        print(describe_swarm(result.spec.swarm))
    print(f"{result.turns} turns, {result.virtual_seconds:.2f} virtual s, "
          f"{result.wall_seconds:.2f} s")
    ended = [e for e in result.errors if e.get("process")]
    if ended:
        print(f"{len(ended)} engine thread(s) raised (each ended its process, as it "
              f"would a real one): see sim.thread_errors in report.json")
    if len(ended) < len(result.errors):
        print(f"{len(result.errors) - len(ended)} thread(s) outside the simulation's actors "
              "raised: the simulation did not run the engine faithfully (see "
              "sim.thread_errors in report.json)")
    print(f"run folder: {run_dir}\nreplay it: {report['replay_command']}")


def _shrink(result: SimResult, run_dir: str, args: argparse.Namespace) -> None:
    shrink_and_tell(result, run_dir, args.budget, args.quiet)


def shrink_and_tell(result: SimResult, run_dir: str, budget: int, quiet: bool,
                    turns: Any = None) -> Shrunk:
    """Shrink a failing run within `budget` simulations (`turns`: see chaos.sim.shrink),
    write the shrunk run beside `run_dir`'s and its counterexample.json, print its story and
    how to replay it; returns what the shrinker found."""
    started = time.perf_counter()
    with Progress("shrinking", budget, unit="simulations", enabled=not quiet) as shown:
        shrunk = shrink(result, budget=budget, turns=turns,
                        progress=lambda runs, _: shown.update(runs))
    small = shrunk.result
    extra = {"shrunk_from": shrunk.original_choices, "shrink_runs": shrunk.runs}
    folder = os.path.join(run_dir, "shrunk")
    os.makedirs(folder, exist_ok=True)
    write_run(small, folder, target=shrunk.target, **extra)
    path = save_schedule(os.path.join(run_dir, "counterexample.json"), small, shrunk.target,
                         **extra)
    print(f"\nshrunk from {shrunk.original_choices} to {len(small.choices)} choices in "
          f"{shrunk.runs} simulations ({time.perf_counter() - started:.1f} s): "
          f"{shape(result.history)} -> {shape(small.history)}; still {shrunk.target[0]} "
          f"({shrunk.target[1]})")
    print(headline(small.verdicts, shrunk.target[0]))
    print("\n".join(tell(small.history, small.verdicts, shrunk.target[0])))
    print(f"\ncounterexample: {path}\nreplay it: ninelives sim --replay {path}", flush=True)
    return shrunk


def _replay(args: argparse.Namespace) -> int:
    db = os.path.join(scratch_dir(), "engine.db")
    try:
        result, saved = replay(args.replay, keep_db=db)
        want = saved.get("fails")
        target = (want["invariant"], want["type"]) if want else None
        run_dir = run_dir_for(args.out, result, "replay")
        write_run(result, run_dir, db=db, target=target)
    finally:
        _remove_scratch(db)
    target = target[0] if target else None
    if result.failed:
        print("\n".join(tell(result.history, result.verdicts, target)) + "\n")
    _print_result(result, run_dir, target)
    if want:
        same = (want["invariant"], want["type"]) in result.signature()
        print(f"{'reproduced' if same else 'NOT reproduced'}: the saved schedule failed "
              f"{want['invariant']} ({want['type']})")
    return _required(run_dir, result.exit_code, args)
