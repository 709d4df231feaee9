"""False alarms: the reference engine (or any in-process engine) over many simulated seeds of
every scenario, counting each invariant that did not pass.

    python bench/false_alarms.py [--seeds 200|A..B] [--scenarios all|NAME,...] [--profile ci]
                                 [--engine reference] [--processes 2] [--engine-set slots=4]

The reference engine holds every invariant it is checked against, so every failed verdict is
a false alarm (a harness bug, or an engine bug: either way one to look at). `unknown`
verdicts are listed apart, with their reasons: a check whose faults the scenario does not
inject (deadlines-kept without hangs) has nothing to judge, and says so. Each scenario's
seeds run on a pool of --processes; the table gives per scenario the schedules run, the
failed and unknown verdicts by invariant, and the first seeds of each; the total is the
false-alarm count. Exits 1 when there was any. `--engine-set NAME=VALUE` runs every scenario
with that engine setting over its [engine] table (slots=4: every scenario with job slots).
"""
from __future__ import annotations

import argparse
import glob
import multiprocessing
import os
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from chaos import flags  # noqa: E402
from chaos.contract import load_engine  # noqa: E402
from chaos.run.supervisor import die_with_parent  # noqa: E402
from chaos.spec.scenario import load_scenario, parse_engine_set  # noqa: E402
from chaos.sim import SeededChoices, SimSpec, simulate  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def scenario_names() -> list[str]:
    """Every scenario a user runs (scenarios/*.toml; the mutant catalog's own aside)."""
    return sorted(os.path.splitext(os.path.basename(p))[0]
                  for p in glob.glob(os.path.join(ROOT, "scenarios", "*.toml"))
                  if not p.endswith("profiles.toml"))


def one(task: tuple) -> tuple[str, int, list[tuple[str, str, str]], float]:
    """(scenario, seed, [(invariant, "fail" | "unknown", first message or reason)], seconds)."""
    name, seed, profile, spec, engine_set = task
    engine = load_engine(spec)
    started = time.perf_counter()
    scenario = load_scenario(name, profile, engine=engine, engine_set=engine_set)
    result = simulate(SimSpec(scenario, seed, engine, spec), SeededChoices(seed))
    bad = [(v.name, "fail" if v.valid is False else "unknown",
            v.failures[0].message if v.failures else v.reason)
           for v in result.verdicts if v.valid is not True]
    bad += [("thread-error", "fail", e["traceback"].strip().splitlines()[-1])
            for e in result.errors]
    return name, seed, bad, time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=flags.seeds, default=flags.parse_seeds("200"),
                        help=flags.SEEDS_HELP)
    parser.add_argument("--scenarios", default="all")
    parser.add_argument("--profile", default="ci")
    parser.add_argument("--engine", default="reference")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--engine-set", action="append", default=[], metavar="NAME=VALUE",
                        help="an engine setting over every scenario's [engine] table, e.g. "
                             "slots=4 (repeatable)")
    args = parser.parse_args()
    if args.processes < 1:
        parser.error("--processes must be at least 1")
    names = scenario_names() if args.scenarios == "all" else args.scenarios.split(",")
    engine_set = parse_engine_set(args.engine_set)
    tasks = [(n, s, args.profile, args.engine, engine_set) for n in names for s in args.seeds]
    print(f"false alarms: {args.engine}"
          + "".join(f" ({k}={v})" for k, v in engine_set.items())
          + f", {len(names)} scenarios x {len(args.seeds)} seeds "
          f"(profile {args.profile}) on {args.processes} processes; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    started = time.perf_counter()
    found: dict[str, dict[tuple[str, str], list]] = defaultdict(lambda: defaultdict(list))
    runs: dict[str, int] = defaultdict(int)
    spent: dict[str, float] = defaultdict(float)
    # each pool process dies with this script, however it ends
    with multiprocessing.get_context("spawn").Pool(args.processes,
                                                   initializer=die_with_parent) as pool:
        for name, seed, bad, seconds in pool.imap_unordered(one, tasks, chunksize=4):
            runs[name] += 1
            spent[name] += seconds
            for invariant, kind, message in bad:
                found[name][(invariant, kind)].append((seed, message))
    total = 0
    for name in names:
        alarms = found.get(name, {})
        count = sum(len(v) for (_, kind), v in alarms.items() if kind == "fail")
        total += count
        print(f"  {name:<18} {runs[name]:>4} schedules  {spent[name] / runs[name]:.2f} s each  "
              f"{count} false alarm(s)")
        for (invariant, kind), hits in sorted(alarms.items()):
            hits.sort()
            print(f"      {invariant} {kind}: {len(hits)} at seeds "
                  f"{', '.join(str(s) for s, _ in hits[:8])}: {hits[0][1][:160]}")
    print(f"total: {total} false alarm(s) over {sum(runs.values())} schedules in "
          f"{time.perf_counter() - started:.0f} s; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
