"""A simulated run's folder: the same files as a real run's, plus its replayable schedule.

`report.json` (schema "ninelives.report/1", built by chaos.reports.report.build_report) with
`report.html`, `junit.xml` and `summary.md` beside it, as a real run renders them; then
`history.jsonl`, `snapshot.json`, `plan.json`, `scenario.json`, `events.jsonl`, the ledgers
`provider.jsonl` and `receiver.jsonl`, `engine.db`; and `schedule.json` (replays with
`ninelives sim --replay`) and, for a failing run, `story.txt`.

In a simulation the exit code follows the verdicts alone (0 pass, 1 fail): a fault the
scenario configures that never fired makes a schedule less interesting, not the harness
broken. The report's `sim` section says how the run was simulated.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import time
from datetime import datetime, timezone
from typing import Any

from chaos import history as hist
from chaos.reports.fired import faults_applied
from chaos.reports.report import build_report, write_report
from chaos.run.runner import render_reports
from chaos.run.runfiles import scenario_record
from chaos.spec.limits import shown
from chaos.spec.scenario import engine_set_args
from chaos.sim.spec import SimResult
from chaos.sim.shrink import save_schedule
from chaos.sim.story import headline, tell


def run_dir_for(out: str, result: SimResult, label: str = "") -> str:
    """A new folder `<out>/<scenario>/sim-<stamp>-seed<N>[-label]`."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    name = f"sim-{stamp}-seed{result.spec.seed}" + (f"-{label}" if label else "")
    path = os.path.join(out, result.spec.scenario.name, name)
    os.makedirs(path, exist_ok=False)
    return path


def sim_command(result: SimResult) -> str:
    """The command that explores this run's seed again."""
    s = result.spec
    parts = ["ninelives", "sim", shown(s.scenario.path), "--seed", str(s.seed),
             "--profile", s.scenario.profile]
    if s.engine_spec and s.engine_spec != "reference":
        parts += ["--engine", s.engine_spec]
    parts += engine_set_args(s.scenario.engine_set)
    parts += ["--swarm"] if s.swarm is not None else []
    return " ".join(shlex.quote(p) for p in parts)


def write_run(result: SimResult, run_dir: str, *, db: str | None = None,
              target: tuple[str, str] | None = None, **schedule_extra: Any) -> dict:
    """Write every file of the run into `run_dir`, the rendered reports too (a rendering
    failure is a warning: report.json stays); returns the report. `db`: the finished
    database file to move in as engine.db; `target`: the failure the run is about
    (invariant, error type), when not its first."""
    spec = result.spec
    _json(run_dir, "scenario.json", scenario_record(spec.scenario, spec.engine))
    _json(run_dir, "plan.json", result.plan.to_json())
    hist.write_history(os.path.join(run_dir, "history.jsonl"), result.history)
    _json(run_dir, "snapshot.json", result.snapshot)
    _lines(run_dir, "events.jsonl", result.events)
    for name, entries in result.ledgers.items():
        _lines(run_dir, f"{name}.jsonl", entries)
    if db and os.path.exists(db):
        shutil.move(db, os.path.join(run_dir, "engine.db"))
    schedule = save_schedule(os.path.join(run_dir, "schedule.json"), result, target,
                             **schedule_extra)
    if result.failed:
        name = target[0] if target else None
        with open(os.path.join(run_dir, "story.txt"), "w", encoding="utf-8") as fh:
            fh.write(headline(result.verdicts, name) + "\n\n")
            fh.write("\n".join(tell(result.history, result.verdicts, name)) + "\n")
    report = report_for(result, run_dir, schedule)
    write_report(run_dir, report)
    render_reports(run_dir)
    return report


def report_for(result: SimResult, run_dir: str, schedule: str) -> dict:
    """report.json for a simulated run (see the module docstring for its exit code)."""
    spec = result.spec
    applied = faults_applied(result.plan, result.history, result.applied)
    report = build_report(spec.scenario, result.plan, spec.engine, spec.engine_spec, run_dir,
                          result.verdicts, applied, result.history, result.snapshot,
                          time.time() - result.wall_seconds)
    report.update({
        "exit_code": result.exit_code,
        "result": {0: "pass", 1: "fail", 2: "error"}[result.exit_code],
        "run_command": sim_command(result),
        "replay_command": f"ninelives sim --replay {shlex.quote(schedule)}",
        "sim": {"turns": result.turns, "virtual_seconds": result.virtual_seconds,
                "wall_seconds": round(result.wall_seconds, 3),
                "choices": len(result.choices), "schedule": schedule,
                "thread_errors": result.errors, "swarm": spec.swarm,
                "note": "simulated: one process, threads scheduled at crash points on a "
                        "virtual clock; unfired faults do not make the exit code 2"},
    })
    return report


def _json(run_dir: str, name: str, data: Any) -> None:
    with open(os.path.join(run_dir, name), "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=2, sort_keys=True)


def _lines(run_dir: str, name: str, entries: list[dict]) -> None:
    with open(os.path.join(run_dir, name), "w", encoding="utf-8") as fh:
        for entry in entries:
            fh.write(json.dumps(entry, sort_keys=True) + "\n")
