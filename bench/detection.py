"""Seconds to detect each mutant: every broken engine of the catalog on its provoking scenario
over the seeds (N: 1..N), and the reference engine on the same scenarios and seeds (false alarms).

    python bench/detection.py [--seeds 10|A..B] [--only NAME,...] [--profile P] [--parallel 2]
                              [--sim] [--out reports/bench-detection]

A mutant is detected in a run when one of its expected invariants fails there; the time to
detect is the wall time of that campaign, start to failing verdict (its duration: the
verdicts come at the end). With --sim each seed is one simulated schedule instead of a real
campaign, and its time the schedule's wall time (simulation and checks). Targets: every mutant detected in every seed, median under
10 s, max under 60 s, no reference run failing. The raw runs go to OUT/<id>/detection.json.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from datetime import datetime, timezone

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from chaos import flags  # noqa: E402
from chaos.reference.mutants.catalog import Mutant  # noqa: E402
from chaos.mutants.matrix import REFERENCE, Task, caught_by, run_task, select  # noqa: E402
from chaos.run.supervisor import die_with_parent  # noqa: E402


def tasks_for(mutants: list[Mutant], seeds: range, profile: str | None, out: str) -> list[Task]:
    runs = os.path.join(out, "runs")
    tasks = [Task(m.name, m.scenario, profile or m.profile, s, runs)
             for m in mutants for s in seeds]
    scenarios = sorted({(t.scenario, t.profile) for t in tasks})
    return tasks + [Task(REFERENCE, sc, p, s, runs) for sc, p in scenarios
                    for s in seeds]


def sim_task(task: Task) -> dict:
    """One simulated schedule of a task (in a pool process), as run_task reports a run."""
    from chaos.contract import load_engine
    from chaos.spec.scenario import load_scenario
    from chaos.sim import SeededChoices, SimSpec, simulate
    started = time.perf_counter()
    engine = load_engine(task.spec)
    result = simulate(SimSpec(load_scenario(task.scenario, task.profile, engine), task.seed,
                              engine, task.spec), SeededChoices(task.seed))
    failed = [v.name for v in result.failed]
    return {"engine": task.engine, "scenario": task.scenario, "profile": task.profile,
            "seed": task.seed, "spec": task.spec, "run_dir": None,
            "result": "fail" if failed or result.errors else "pass", "failed": failed,
            "unknown": [v.name for v in result.verdicts if v.status == "unknown"],
            "seconds": round(time.perf_counter() - started, 3)}


def run_all(tasks: list[Task], parallel: int, sim: bool = False) -> list[dict]:
    """Every task's run, printing one line per finished run."""
    results = []
    context = multiprocessing.get_context("spawn")
    # each pool process dies with this script, however it ends
    with ProcessPoolExecutor(max_workers=parallel, mp_context=context,
                             initializer=die_with_parent) as pool:
        futures = [pool.submit(sim_task if sim else run_task, t) for t in tasks]
        for n, future in enumerate(as_completed(futures), 1):
            run = future.result()
            results.append(run)
            print(f"  [{n}/{len(tasks)}] {run['engine']} {run['scenario']} seed {run['seed']}: "
                  f"{run['result']} {','.join(run['failed'])} {run['seconds']:.1f} s",
                  file=sys.stderr, flush=True)
    return results


def mutant_row(mutant: Mutant, runs: list[dict]) -> dict:
    hits = [r for r in runs if caught_by(mutant, r)]
    seconds = [r["seconds"] for r in hits]
    others = sorted({n for r in runs for n in r["failed"] if n not in mutant.expect})
    return {"name": mutant.name, "scenario": mutant.scenario, "expect": list(mutant.expect),
            "runs": len(runs), "detected": len(hits),
            "median": statistics.median(seconds) if seconds else None,
            "p90": _p90(seconds), "max": max(seconds) if seconds else None, "also": others,
            "missed_seeds": sorted(r["seed"] for r in runs if r not in hits)}


def _p90(values: list[float]) -> float | None:
    """The 90th percentile (nearest rank)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, -(-9 * len(ordered) // 10) - 1))]


def table(rows: list[dict], reference: list[dict]) -> str:
    width = max(len(r["name"]) for r in rows)
    swidth = max(len(r["scenario"]) for r in rows)
    fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    lines = [f"{'mutant':<{width}}  {'scenario':<{swidth}}  detected  median s  p90 s  "
             f"max s  expected invariant(s) / also failing"]
    for r in rows:
        also = f"  (also {', '.join(r['also'])})" if r["also"] else ""
        missed = f"  missed seeds {r['missed_seeds']}" if r["missed_seeds"] else ""
        lines.append(f"{r['name']:<{width}}  {r['scenario']:<{swidth}}  "
                     f"{r['detected']:>3}/{r['runs']:<4}  {fmt(r['median']):>8}  "
                     f"{fmt(r['p90']):>5}  {fmt(r['max']):>5}  {', '.join(r['expect'])}"
                     f"{also}{missed}")
    hits = [s for r in rows for s in ([r["median"]] if r["median"] is not None else [])]
    alarms = [r for r in reference if r["result"] != "pass"]
    lines += ["", f"detected: {sum(r['detected'] for r in rows)}/{sum(r['runs'] for r in rows)}"
              f" runs; mutants detected in every seed: "
              f"{sum(r['detected'] == r['runs'] for r in rows)}/{len(rows)}; worst median "
              f"{fmt(max(hits, default=None))} s, worst max "
              f"{fmt(max((r['max'] for r in rows if r['max'] is not None), default=None))} s",
              f"reference engine: {len(reference)} runs on the same scenarios and seeds, "
              f"{len(alarms)} false alarm(s)"]
    for r in sorted(alarms, key=lambda r: (r["scenario"], r["seed"])):
        lines.append(f"  {r['scenario']} seed {r['seed']}: {r['result']} "
                     f"({', '.join(r['failed'] + r['unknown']) or r.get('error', '')}) "
                     f"{r['run_dir']}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=flags.seeds, default=flags.parse_seeds("10"),
                        help=flags.SEEDS_HELP)
    parser.add_argument("--only", default=None)
    parser.add_argument("--profile", default=None, help="default: each mutant's own (smoke)")
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--sim", action="store_true",
                        help="simulated schedules instead of real-process campaigns")
    parser.add_argument("--out", default=os.path.join("reports", "bench-detection"))
    args = parser.parse_args()
    mutants = select(args.only)
    out = os.path.join(args.out, datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ"))
    tasks = tasks_for(mutants, args.seeds, args.profile, out)
    print(f"detection ({'sim' if args.sim else 'run'}): {len(mutants)} mutants x {len(args.seeds)} "
          f"seeds, and the reference on the same scenarios: {len(tasks)} "
          f"{'schedules' if args.sim else 'campaigns'}, {args.parallel} at a time -> {out}",
          file=sys.stderr, flush=True)
    started = time.time()
    results = run_all(tasks, args.parallel, args.sim)
    reference = [r for r in results if r["engine"] == REFERENCE]
    rows = [mutant_row(m, [r for r in results if r["engine"] == m.name]) for m in mutants]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "detection.json"), "w", encoding="utf-8") as fh:
        json.dump({"seeds": list(args.seeds), "profile": args.profile, "sim": args.sim, "mutants": rows,
                   "runs": results, "seconds": round(time.time() - started, 1)}, fh, indent=2)
    print(table(rows, reference))
    print(f"({len(tasks)} {'schedules' if args.sim else 'campaigns'} in "
          f"{time.time() - started:.0f} s; raw runs in "
          f"{os.path.join(out, 'detection.json')})")


if __name__ == "__main__":
    main()
