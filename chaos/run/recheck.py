"""`ninelives check RUN`: the checkers rerun on a saved run's history and snapshot, their
verdicts kept beside the run's own record, never over it.

A check writes check.json (report.json's shape, with a `check` section saying when and over
which record) and check.html; report.json, report.html, junit.xml and summary.md stay as the
run wrote them, so a history torn or damaged after the run cannot erase what the run found.
The one exception is a run killed before its checks: its report.json is a start record
without verdicts, and the first check fills it in (and renders its pages) once.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any

from chaos.run.saved import SavedRun

#: The files a check writes, beside the run's own.
CHECK_JSON, CHECK_HTML = "check.json", "check.html"


def recheck(saved: SavedRun, require: bool, now: float) -> dict[str, Any]:
    """The report of a fresh check of `saved` (its own report.json untouched): verdicts,
    situations, tear, what a partial run gathered, exit code and result; `require`:
    --require-exercised; `now`: when the check ran."""
    from chaos.checkers import run_checkers
    from chaos.checkers.verdict import judge_incomplete
    from chaos.reports.report import RESULTS, exit_code_for, gathered, require_exercised
    from chaos.reports.report import situations_record
    report = dict(saved.report)
    verdicts = run_checkers(saved.history, saved.snapshot)
    why = saved.incomplete()
    if why:  # the missing end may hold a violation, or what excuses an error found
        verdicts = judge_incomplete(verdicts, why)
    report["verdicts"] = [v.to_json() for v in verdicts]
    report.update(situations_record(saved.history, saved.snapshot, report["verdicts"]))
    report["torn"] = saved.tear.describe() if saved.tear else None
    if saved.partial:  # a killed run's report has no metrics: say what there is
        report["gathered"] = gathered(saved.history, saved.snapshot)
    # A simulation's exit code follows its verdicts alone (chaos.sim.output).
    unfired = [] if "sim" in report else report.get("faults_unfired", [])
    report["exit_code"] = exit_code_for(report["verdicts"], unfired)
    report["result"] = RESULTS[report["exit_code"]]
    report.pop("require_exercised", None)
    if require:
        require_exercised(report)
    report["check"] = {"at": now, "of": "report.json",
                       "recorded_result": saved.report.get("result")}
    return report


def keep_check(saved: SavedRun, report: dict[str, Any]) -> list[str]:
    """Write check.json and check.html into the run folder; for a killed run whose
    report.json never got verdicts, fill that in too, once, with report.html, junit.xml and
    summary.md. Returns the paths written."""
    from chaos.reports.render import load_json, render_check
    from chaos.reports.report import write_report
    from chaos.run.runfiles import write_json
    from chaos.run.runner import render_reports
    from chaos.run.saved import keep_rebuilt
    folder = saved.folder
    if saved.partial:  # what a killed run never wrote, rebuilt: the pages draw from them
        keep_rebuilt(saved)
    paths = [write_json(os.path.join(folder, CHECK_JSON), report)]
    try:
        paths += render_check(folder)
    except Exception as exc:  # any rendering bug: check.json is written and stands
        print(f"warning: could not render {CHECK_HTML} of {folder}: {type(exc).__name__}: "
              f"{exc}; {CHECK_JSON} is complete", file=sys.stderr)
    recorded = load_json(folder, "report.json", required=True)
    if saved.partial and not isinstance(recorded.get("verdicts"), list):
        record = {k: v for k, v in report.items() if k != "check"}
        paths.append(write_report(folder, record))
        paths += render_reports(folder)
    return paths


def check_folder_lines(report: dict[str, Any], paths: list[str]) -> list[str]:
    """What the terminal says of where the check's verdicts went."""
    recorded = report["check"]["recorded_result"]
    filled = any(os.path.basename(p) == "report.json" for p in paths)
    mine = [p for p in paths if os.path.basename(p) in (CHECK_JSON, CHECK_HTML)]
    return [f"check written to {', '.join(mine)}"
            + ("; report.json, a killed run's start record, filled in with these verdicts"
               if filled else f"; the run's own record, report.json ({recorded}), is unchanged")]


def now() -> float:
    """The wall clock, read once by the command (the logic above takes it as an argument)."""
    return time.time()
