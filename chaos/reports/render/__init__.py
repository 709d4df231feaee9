"""Reports that people and CI read, rendered from a saved run folder: report.html (a
self-contained page), junit.xml (one test case per invariant) and summary.md (for a CI job
summary or a pull-request comment). report.json stays the canonical record."""
from __future__ import annotations

import json
import os
from typing import Any, Callable, Iterable

FILES = {"html": "report.html", "junit": "junit.xml", "md": "summary.md"}
FORMATS = tuple(FILES)


def parse_formats(text: str) -> tuple[str, ...]:
    """`html,junit,md` (any subset, any order) as a tuple; raises ValueError naming an
    unknown format."""
    formats = tuple(f.strip() for f in text.split(",") if f.strip())
    unknown = [f for f in formats if f not in FILES]
    if unknown or not formats:
        raise ValueError(f"--format: unknown format {', '.join(unknown) or '(none)'}; "
                         f"choose from {','.join(FORMATS)}")
    return formats


def render_run(run_dir: str, formats: Iterable[str] = FORMATS) -> list[str]:
    """Render the run folder's reports in `formats`; returns the paths written.

    Needs report.json; the HTML also reads history.jsonl and snapshot.json when present.
    Raises ValueError for a folder without a readable report.json or an unknown format.
    """
    formats = tuple(formats)
    parse_formats(",".join(formats))
    report = readable_report(load_json(run_dir, "report.json", required=True),
                             os.path.join(run_dir, "report.json"))
    renderers: dict[str, Callable[[], str]] = {
        "html": lambda: _html(run_dir, report),
        "junit": lambda: _junit(report, history_origin(run_dir, report)),
        "md": lambda: _markdown(report),
    }
    paths = []
    for fmt in formats:
        path = os.path.join(run_dir, FILES[fmt])
        text = renderers[fmt]()
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        paths.append(path)
    return paths


def render_check(run_dir: str) -> list[str]:
    """check.html from the run folder's check.json (`ninelives check`'s verdicts, beside the
    run's own report); returns the path written in a list. Raises ValueError for a folder
    without a readable check.json."""
    path = os.path.join(run_dir, "check.json")
    report = readable_report(load_json(run_dir, "check.json", required=True), path)
    html = os.path.join(run_dir, "check.html")
    with open(html, "w", encoding="utf-8") as fh:
        fh.write(_html(run_dir, report))
    return [html]


#: What every report.json holds from the run's start (chaos.reports.report.start_record).
REQUIRED = ("scenario", "seed", "profile", "engine", "run_dir")
#: What a whole report adds, and what a partial one is rendered with in its place.
LATER: dict[str, Callable[[], Any]] = {
    "verdicts": list, "metrics": dict, "faults_applied": dict, "faults_unfired": list,
    "faults_prevented": dict, "faults_not_applicable": list, "crashpoint_coverage": dict,
    "versions": dict, "run_command": str, "replay_command": str, "run_id": str}


def readable_report(report: Any, path: str) -> dict:
    """`report` (report.json's content) ready to render: a report without verdicts (a run
    killed before its checks, or a file cut short) is marked partial, with empty sections
    where the rest would be. Raises ValueError naming the file and what it lacks."""
    if not isinstance(report, dict):
        raise ValueError(f"{path} is not a report: a JSON object was expected")
    missing = [k for k in REQUIRED if k not in report]
    if not isinstance(report.get("scenario", {}), dict) or "name" not in report.get("scenario", {}):
        missing.append("scenario.name")
    if missing:
        raise ValueError(f"{path} is not a run's report: it lacks {', '.join(missing)}")
    report = dict(report)
    if not isinstance(report.get("verdicts"), list):
        report["partial"] = True
    if report.get("partial") and report.get("result") in (None, "pass"):
        report["result"] = "partial"  # no pass stands on part of a run
    report.setdefault("result", "partial")
    for key, empty in LATER.items():
        report.setdefault(key, empty())
    return report


def load_json(run_dir: str, name: str, required: bool = False) -> Any:
    """A JSON file of the run folder, or None when absent and not required."""
    path = os.path.join(run_dir, name)
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except FileNotFoundError:
        if required:
            raise ValueError(f"{path} does not exist: is {run_dir!r} a run folder?") from None
        return None
    except ValueError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from None


def history_origin(run_dir: str, report: dict) -> float:
    """The time of the history's first event: the origin of every "+12.345 s" the checkers
    print (report.json's start time when the history is missing)."""
    try:
        with open(os.path.join(run_dir, "history.jsonl"), encoding="utf-8") as fh:
            return float(json.loads(fh.readline())["t"])
    except (OSError, ValueError, KeyError, TypeError):
        return float(report.get("started") or 0.0)


def _html(run_dir: str, report: dict) -> str:
    from chaos.history import read_history
    from chaos.reports.render.html import render_html
    path = os.path.join(run_dir, "history.jsonl")
    history = read_history(path) if os.path.exists(path) else None
    return render_html(report, history, load_json(run_dir, "snapshot.json"))


def _junit(report: dict, t0: float) -> str:
    from chaos.reports.render.junit import render_junit
    return render_junit(report, t0)


def _markdown(report: dict) -> str:
    from chaos.reports.render.markdown import render_markdown
    return render_markdown(report)


__all__ = ["FILES", "FORMATS", "parse_formats", "readable_report", "render_check",
           "render_run"]
