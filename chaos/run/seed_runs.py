"""`ninelives run SCENARIO --seeds A..B [--shard I/N]`: one real run per seed, one after the
other, each in its own run folder as `run --seed N` writes it, and the campaign's record
(chaos.run.campaign: campaign.json, summary.md, junit.xml, report.html) in --out.

Real runs cannot be replayed exactly (the operating system schedules them), so a failing
seed is listed with the command that reruns it and the one that replays its saved plan.
Exit code: the campaign's (0 every run passed, 1 an invariant failed in some run, 2 a run
in error, an unfired fault among them, as `run` says of one run).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

from chaos.run.campaign import Tally, campaign_key, campaign_lines, campaign_record, write_campaign
from chaos.commands.flags import seeds_text
from chaos.run.shards import WHOLE


def run_seeds(args: argparse.Namespace, scenario: Any, engine: Any, backend: Any) -> int:
    """Run every seed of `args.seeds` that `args.shard` holds; write the campaign; returns
    its exit code. Raises ValueError naming --shard when the shard holds no seed."""
    from chaos.run.backends import command_backend
    from chaos.reports.report import RESULTS, require_exercised, write_report
    from chaos.run.runner import render_reports, run_campaign
    from chaos.situations import Reached
    part = args.shard or WHOLE
    mine = part.seeds(args.seeds)
    began, tally = time.time(), Tally()
    print(f"seeds {seeds_text(args.seeds)}" + (f", shard {part}" if args.shard else "")
          + f": {len(mine)} runs", file=sys.stderr, flush=True)
    with command_backend(backend) as shared:  # one server for every run on postgres
        for seed in mine:
            result = run_campaign(scenario, seed, engine, args.out, engine_spec=args.engine,
                                  backend=shared, progress=not args.quiet)
            report = result.report
            if args.require_exercised:
                write_report(result.run_dir, require_exercised(report))
                render_reports(result.run_dir)
            code = report["exit_code"]
            print(f"seed {seed}: {RESULTS[code].upper()}  {result.run_dir}", flush=True)
            kept = {"run_dir": os.path.relpath(result.run_dir, args.out),
                    "rerun": report.get("run_command"), "replay": report.get("replay_command")}
            if code == 2:
                kept["why"] = _why(report)
            tally.add(seed, report["verdicts"],
                      {n: Reached.from_json(r) for n, r in (report.get("situations") or {}
                                                            ).items()},
                      code, **(kept if code else {}))
    key = campaign_key("run", scenario, args.engine, seeds=seeds_text(args.seeds),
                       backend=backend.name)
    record = campaign_record(key, tally, [part], began)
    write_campaign(args.out, record)
    print("\n".join(campaign_lines(record, args.out)))
    return record["exit_code"]


def _why(report: dict) -> str:
    """Why a run ended in error, in a line."""
    if report.get("faults_unfired"):
        return f"configured faults never fired: {', '.join(report['faults_unfired'])}"
    if report.get("require_exercised") and report.get("not_exercised"):
        return f"passed, not exercised (--require-exercised): {', '.join(report['not_exercised'])}"
    crashed = [v["name"] for v in report.get("verdicts") or []
               if "traceback" in (v.get("metrics") or {})]
    if crashed:
        return f"checker crashed: {', '.join(crashed)}"
    return "no invariant had evidence either way"
