"""summary.md: a short Markdown verdict for a CI job summary or a pull-request comment."""
from __future__ import annotations

import os
from typing import Any

from chaos.spec.aim import summary_lines as aim_summary_lines
from chaos.reports.report_text import crash_point_lines, skew_text
from chaos.reports.render.evidence import ordered

ICON = {"pass": "✅", "fail": "❌", "unknown": "❓", "error": "⚠️", "partial": "⚠️"}
MAX_REASON = 160


def render_markdown(report: dict[str, Any]) -> str:
    """The result line, the verdict table (failures first), faults applied and the
    commands that rerun and replay the run."""
    m, result = report.get("metrics", {}), report["result"]
    lines = [f"## {ICON.get(result, '')} ninelives `{report['scenario']['name']}`: "
             f"**{result.upper()}**", "",
             f"profile `{report['profile']}` · seed `{report['seed']}` · engine "
             f"`{report['engine']}` · {m.get('jobs', '?')} jobs · {m.get('kills', '?')} kills"
             f" · {m.get('run_seconds', '?')} s", "",
             *_incomplete(report),
             "| invariant | verdict | checked | errors | reason |",
             "|---|---|--:|--:|---|"]
    for v in ordered(report["verdicts"]):
        shown = "pass, not exercised" if v["verdict"] == "pass" and \
            v.get("exercised") is False else v["verdict"]
        lines.append(f"| `{v['name']}` | {ICON[v['verdict']]} {shown} | {v['checked']} "
                     f"| {v['error_count']} | {_cell(v.get('reason') or '')} |")
    applied = ", ".join(f"{k} {n}" for k, n in report.get("faults_applied", {}).items())
    lines += ["", *_situations(report), f"**Faults applied:** {applied or 'none'}"]
    if skew_text(report):
        lines.append(f"**Skewed workers:** {skew_text(report)}")
    if report.get("faults_unfired"):
        lines.append(f"**Configured but never fired:** {', '.join(report['faults_unfired'])}")
    for line in crash_point_lines(report):  # what each crash-point name armed, or why not
        head, _, rest = line.partition(": ")
        lines.append(f"**{head.capitalize()}:** {rest}")
    lines += [f"**Aimed:** {line}" for line in aim_summary_lines(report)]
    if report.get("faults_prevented"):
        lines.append("**Not fired, their targets taken away first:** " + "; ".join(
            f"{k} ({v})" for k, v in report["faults_prevented"].items()))
    lines += ["", f"Rerun: `{report['run_command']}`  ",
              f"Replay: `{report['replay_command']}`  ",
              f"Report: `{os.path.join(report['run_dir'], 'report.html')}`", ""]
    return "\n".join(lines)


def _situations(report: dict[str, Any]) -> list[str]:
    """The situations reached, with counts and one example each; those not reached."""
    found = report.get("situations") or {}
    if not found:
        return []
    lines = ["**Situations reached:**", ""]
    for name, r in found.items():
        if r["count"]:
            x = (r.get("examples") or [{}])[0]
            lines.append(f"- `{name}` ×{r['count']}: e.g. history line {x.get('line')}: "
                         f"{_cell(x.get('note') or '')}")
    missed = [n for n, r in found.items() if r.get("observable", True) and not r["count"]]
    blind = [n for n, r in found.items() if not r.get("observable", True)]
    lines.append(f"- not reached: {', '.join(missed) or 'none'}")
    if blind:
        lines.append(f"- unobservable here: {', '.join(blind)}")
    if report.get("not_exercised"):
        lines.append(f"- **passed, not exercised:** {', '.join(report['not_exercised'])}")
    return lines + [""]


def _incomplete(report: dict[str, Any]) -> list[str]:
    """The warning lines of a partial run or a torn history (none for a whole one)."""
    lines = []
    if report.get("partial"):
        lines += ["> **Partial run:** it ended before its checks; verdicts come from the "
                  "evidence its folder holds, and no pass stands on part of a run.", ""]
    if report.get("torn"):
        lines += [f"> **Torn history:** {report['torn']}", ""]
    return lines


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell: one line, pipes escaped, cut short."""
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= MAX_REASON else text[:MAX_REASON - 1] + "…"
