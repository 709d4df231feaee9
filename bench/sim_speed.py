"""Simulation speed: schedules per minute on N cores for a smoke-sized scenario (10 jobs, 3
workers), and, for each mutant of the catalog (chaos.mutants), how many simulated schedules and
how many seconds it takes to catch it.

    python bench/sim_speed.py [--seconds 60] [--processes 2] [--scenario smoke] [--jobs 10]
                              [--workers 3] [--engines reference,...] [--engine-set slots=4]
                              [--mutants all|none|NAME,...] [--seeds 20|A..B]

Speed: every process simulates seeds 1, 1 + N, 1 + 2N, ... of the scenario (smoke profile,
resized to --jobs and --workers) for --seconds; the figure is all schedules over the wall
time. Target: 1,000 schedules/min on 2 cores (the reference engine). With several --engines
(adapter specs, e.g. examples.toy_engine.adapter:TOY), each is measured in turn in the same
run, and its rate is printed as a ratio to the first's. Detection: each mutant on its provoking
scenario (the catalog's, at its profile) over the --seeds: the first seed where one of
its expected invariants fails (schedules to first detection), the wall time until then, and
how many seeds catch it; the reference engine runs the same seeds (false alarms). The load
average is printed before and after: on a shared machine the wall-clock figures move with it,
so the CPU time per schedule (and the rate it allows on cores of its own) is printed too.
"""
from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from chaos import flags  # noqa: E402
from chaos.contract import load_engine  # noqa: E402
from chaos.spec.scenario import load_scenario, parse_engine_set  # noqa: E402
from chaos.sim import SeededChoices, SimSpec, simulate  # noqa: E402

TARGET = 1000  # schedules per minute on 2 cores, 10 jobs, 3 workers


def sized(name: str, jobs: int, workers: int, engine=None, engine_set=None):
    scenario = load_scenario(name, "smoke", engine=engine, engine_set=engine_set)
    return dataclasses.replace(scenario, run=dataclasses.replace(scenario.run, jobs=jobs,
                                                                 workers=workers))


def speed_worker(task: tuple) -> dict:
    """One process: seeds first, first + step, ... for `seconds`; counts and turns."""
    name, jobs, workers, first, step, seconds, spec, engine_set = task
    engine = load_engine(spec)
    scenario = sized(name, jobs, workers, engine, engine_set)
    started, cpu = time.perf_counter(), time.process_time()
    seed, count, turns, failed = first, 0, 0, 0
    while time.perf_counter() - started < seconds:
        result = simulate(SimSpec(scenario, seed, engine, spec), SeededChoices(seed))
        count, turns, failed = count + 1, turns + result.turns, failed + bool(result.failed)
        seed += step
    return {"count": count, "turns": turns, "failed": failed,
            "seconds": time.perf_counter() - started, "cpu": time.process_time() - cpu}


def speed(args: argparse.Namespace) -> None:
    first, *others = args.engines.split(",")
    base = speed_of(args, first)
    for spec in others:
        print(f"  {speed_of(args, spec) / base:.2f}x the schedules/min of {first}")


def speed_of(args: argparse.Namespace, spec: str) -> float:
    """Measure one engine; print its figures and return its schedules per minute."""
    engine_set = parse_engine_set(args.engine_set)
    tasks = [(args.scenario, args.jobs, args.workers, 1 + i, args.processes, args.seconds, spec,
              engine_set) for i in range(args.processes)]
    context = multiprocessing.get_context("spawn")
    started = time.perf_counter()
    with context.Pool(args.processes) as pool:
        parts = pool.map(speed_worker, tasks)
    wall = time.perf_counter() - started
    busy = max(p["seconds"] for p in parts)
    count = sum(p["count"] for p in parts)
    per_minute = count / busy * 60
    print(f"speed: {spec} on {args.scenario} (smoke profile) resized to {args.jobs} jobs, "
          f"{args.workers} workers, on {args.processes} processes"
          + "".join(f", {k}={v}" for k, v in engine_set.items()))
    print(f"  {count} schedules in {busy:.1f} s ({wall:.1f} s with process start-up): "
          f"{per_minute:.0f} schedules/min, {busy / count * args.processes * 1000:.0f} ms per "
          f"schedule per process, {sum(p['turns'] for p in parts) / count:.0f} turns per "
          f"schedule; {sum(p['failed'] for p in parts)} failed")
    cpu_ms = sum(p["cpu"] for p in parts) / count * 1000
    dedicated = 60_000 / cpu_ms * args.processes
    print(f"  CPU time {cpu_ms:.0f} ms per schedule: {dedicated:.0f} schedules/min on "
          f"{args.processes} cores the simulation had to itself")
    if spec == "reference":
        verdict = "meets" if per_minute >= TARGET else "misses"
        print(f"  target {TARGET}/min on 2 cores: {verdict} it (wall-clock figure)")
    return per_minute


def detect_worker(task: tuple) -> dict:
    """One mutant (or the reference, name None) on a scenario over seeds 1..K: which seeds
    fail one of the expected invariants (any invariant, for the reference), and the wall
    time until the first did."""
    name, scenario_name, profile, expect, seeds = task
    from chaos.reference.mutants.catalog import ENGINES
    from chaos.reference import REFERENCE
    scenario = load_scenario(scenario_name, profile)
    engine, spec = (ENGINES[name], f"chaos.mutants:{name}") if name else (REFERENCE,
                                                                           "reference")
    started, caught, first_seconds, failed = time.perf_counter(), [], None, set()
    for seed in seeds:
        result = simulate(SimSpec(scenario, seed, engine, spec), SeededChoices(seed))
        names = {v.name for v in result.failed}
        if names & set(expect) if name else names:
            caught.append(seed)
            failed |= names
            if first_seconds is None:
                first_seconds = time.perf_counter() - started
    return {"name": name, "scenario": scenario_name, "expect": expect, "caught": caught,
            "first_seconds": first_seconds, "failed": sorted(failed), "seeds": len(seeds),
            "seconds": time.perf_counter() - started}


def detection(args: argparse.Namespace) -> None:
    try:
        from chaos.reference.mutants.catalog import CATALOG
    except ImportError:
        print("detection: no mutant catalog (chaos.mutants) in this tree")
        return
    chosen = [m for m in CATALOG if args.mutants == "all" or m.name in args.mutants.split(",")]
    tasks = [(m.name, m.scenario, m.profile, m.expect, args.seeds) for m in chosen]
    scenarios = sorted({(m.scenario, m.profile) for m in chosen})
    if not args.no_reference:
        tasks += [(None, sc, p, (), args.seeds) for sc, p in scenarios]
    context = multiprocessing.get_context("spawn")
    with context.Pool(args.processes) as pool:
        rows = pool.map(detect_worker, tasks)
    alarms = {r["scenario"]: r for r in rows if r["name"] is None}
    rows = [r for r in rows if r["name"] is not None]
    width, swidth = max(len(r["name"]) for r in rows), max(len(r["scenario"]) for r in rows)
    print(f"\ndetection: each mutant on its catalog scenario, seeds {flags.seeds_text(args.seeds)}")
    print(f"  {'mutant':<{width}}  {'scenario':<{swidth}}  first  seconds  caught  by / the "
          "reference on the same seeds")
    for r in rows:
        first = r["caught"][0] if r["caught"] else "-"
        secs = f"{r['first_seconds']:.1f}" if r["caught"] else "-"
        by = ", ".join(n for n in r["failed"] if n in r["expect"]) or "NOT CAUGHT"
        ref = alarms.get(r["scenario"])
        ref_note = "" if ref is None else (
            "  [reference passes]" if not ref["caught"] else
            f"  [reference fails seeds {ref['caught'][:5]}: {', '.join(ref['failed'])}]")
        print(f"  {r['name']:<{width}}  {r['scenario']:<{swidth}}  {first:>5}  {secs:>7}  "
              f"{len(r['caught']):>3}/{r['seeds']:<3} {by}{ref_note}")
    firsts = sorted(r["caught"][0] for r in rows if r["caught"])
    print(f"  caught {len(firsts)}/{len(rows)} mutants; schedules to first detection: median "
          f"{firsts[len(firsts) // 2] if firsts else '-'}, max {firsts[-1] if firsts else '-'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--scenario", default="smoke")
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--engines", default="reference",
                        help="comma-separated --engine specs, measured in turn")
    parser.add_argument("--engine-set", action="append", default=[], metavar="NAME=VALUE",
                        help="an engine setting for the speed runs, e.g. slots=4 (repeatable)")
    parser.add_argument("--mutants", default="all", help="all, none, or NAME,NAME,...")
    parser.add_argument("--seeds", type=flags.seeds, default=flags.parse_seeds("20"),
                        help="seeds per mutant: " + flags.SEEDS_HELP)
    parser.add_argument("--no-reference", action="store_true",
                        help="skip the reference engine's runs on the mutants' seeds")
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} "
          f"({os.cpu_count()} CPUs)")
    speed(args)
    if args.mutants != "none":
        detection(args)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
