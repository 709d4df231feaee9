"""The report on the terminal: the verdict table, the lines that say what a run did (its
progress, the kills' cuts, the situations reached, the crash points), what it could not
judge, and its result."""
from __future__ import annotations

import os

from rich.console import Console

from chaos.engines import crashpoints
from chaos.spec.aim import summary_lines as aim_summary_lines
from chaos.reports.console import AUTO, Column, table
from chaos.reports.report import gathered_text, skew_of


def situations_lines(report: dict) -> list[str]:
    """One compact block: the situations reached with counts, those not reached."""
    from chaos.situations import Reached, summary_line
    found = report.get("situations")
    if not found:
        return []
    return [summary_line({n: Reached.from_json(r) for n, r in found.items()})]


def crash_point_lines(report: dict) -> list[str]:
    """The summary's lines on the scenario's crash-point names (none when it names none)."""
    resolution = crashpoints.Resolution(
        named={k: tuple(v) for k, v in report.get("crash_points_armed", {}).items()},
        absent=report.get("crash_points_not_applicable", {}))
    armed, absent = crashpoints.summary(resolution)
    return ([f"crash points armed: {', '.join(armed)}"] if armed else []) + (
        [f"crash points not applicable to this engine (optional): {'; '.join(absent)}"]
        if absent else [])


def skew_text(report: dict) -> str | None:
    """What the report says of skewed workers (None without them)."""
    skew = report.get("skew") or skew_of(report.get("verdicts") or [])
    return f"leases on the {skew['lease_clock']}'s clock; {skew['note']}" if skew else None


VERDICT_COLUMNS = (Column("invariant"), Column("verdict"), Column("checked", "right"),
                   Column("errors", "right"), Column("reason", wraps=True))


def verdict_table(report: dict, console: Console | str | None = AUTO) -> str:
    """The verdicts as a table, failures first: on a terminal (see chaos.reports.console.table for
    `console`) drawn by rich with the reason wrapped; plain lines otherwise, the reason
    shortened at a word."""
    rows = sorted(report["verdicts"], key=lambda v: (v["verdict"] == "pass", v["name"]))
    if not rows:
        return "(no verdicts)"
    marks = {"pass": "pass", "fail": "FAIL", "unknown": "UNKNOWN"}
    return table(VERDICT_COLUMNS, ([v["name"], "pass, not exercised"
                                    if v["verdict"] == "pass" and v.get("exercised") is False
                                    else marks[v["verdict"]], v["checked"],
                                    v["error_count"], v["reason"] or ""] for v in rows),
                 console=console)


def _progress_line(progress: dict | None) -> list[str]:
    """The time lost to leases nobody used (see chaos.reports.progress), by whether the holder lived."""
    progress = progress or {}
    lines = []
    for key, what in (("after_holder_alive", "a live holder kept"),
                      ("after_holder_died", "a dead holder left")):
        held = progress.get(key) or {}
        if held.get("count"):
            lines.append(f"claims that waited out a lease {what}: {held['count']} (median "
                         f"{held['median']} s, max {held['max']} s, {held['total']} s in all)")
    return lines


def _cuts_line(cuts: dict | None) -> list[str]:
    """What the worker kills cut: in-flight steps in all, and the most one kill cut; and the
    jobs they lost (never settled, last held by a killed process), with the kill that lost
    the most."""
    if not cuts or not cuts.get("kills"):
        return []
    lines = [f"worker kills {cuts['kills']} cut {cuts['steps_cut']} in-flight steps (at most "
             f"{cuts['most_in_one_kill']} in one kill; kills by steps cut: "
             + ", ".join(f"{n}: {k}" for n, k in cuts["kills_by_steps_cut"].items()) + ")"]
    if cuts.get("jobs_lost"):
        worst = cuts["most_lost_in_one_kill"]
        jobs = ", ".join(worst["jobs"][:5]) + (", ..." if len(worst["jobs"]) > 5 else "")
        lines.append(f"jobs lost to kills: {cuts['jobs_lost']} never settled, last held by a "
                     f"killed process (kills by jobs lost: "
                     + ", ".join(f"{n}: {k}" for n, k in cuts["kills_by_jobs_lost"].items())
                     + f"; the most, {len(worst['jobs'])}, by the kill of "
                     f"{worst['name'] or 'pid ' + str(worst['pid'])} at +{worst['at']:.3f} "
                     f"s: {jobs})")
    return lines


def incomplete_lines(report: dict) -> list[str]:
    """Why the report judges less than a whole run: a killed run, a torn history."""
    lines = []
    failed = report.get("adapter_error")
    if report.get("partial") and failed:
        lines.append(f"PARTIAL: the run ended before its checks: the adapter's "
                     f"{failed.get('method')} raised {failed.get('type')} (traceback: "
                     f"{failed.get('traceback')}); verdicts come from the evidence its folder "
                     "holds, and no pass stands on part of a run")
    elif report.get("partial"):
        lines.append("PARTIAL: the run ended before its checks (killed?); verdicts come from "
                     "the evidence its folder holds, and no pass stands on part of a run")
    if report.get("torn"):
        lines.append(f"TORN: {report['torn']}")
    return lines


def result_line(report: dict) -> str:
    """The last word on a run: PASS, FAIL or ERROR, and why; for a partial run (killed
    before its checks) also what it gathered."""
    line, found = _result_words(report), report.get("gathered")
    if report.get("partial") and found:
        line += f" (partial run: gathered {gathered_text(found)})"
    elif report.get("partial") and report["result"] != "partial":
        line += " (partial run: killed before its checks)"
    return line


def _result_words(report: dict) -> str:
    verdicts = report.get("verdicts") or []
    if report["result"] == "error" and all(v["verdict"] == "unknown" for v in verdicts):
        if report.get("partial") or report.get("torn"):
            return ("ERROR: no invariant failed in the part of the run there is, and no pass "
                    "stands on part of one")
        return "ERROR: no invariant had evidence either way: nothing was checked"
    if report["result"] == "error" and report.get("require_exercised") and \
            report.get("not_exercised") and not report.get("faults_unfired"):
        return ("ERROR: passed, but not exercised (--require-exercised): "
                + ", ".join(report["not_exercised"]) + " reached none of their situations")
    return {"pass": "PASS: every invariant with evidence holds",
            "fail": "FAIL: an invariant was violated",
            "error": "ERROR: the run did not exercise what the scenario asked",
            "partial": "PARTIAL: the run has not been checked (ninelives check RUN)"
            }[report["result"]]


def summary(report: dict, console: Console | str | None = AUTO) -> str:
    """What the terminal shows at the end of a run (`console`: see verdict_table)."""
    m = report["metrics"]
    applied = ", ".join(f"{k} {v}" for k, v in report["faults_applied"].items()) or "none"
    lines = [
        f"scenario {report['scenario']['name']} (profile {report['profile']}, "
        f"seed {report['seed']}, engine {report['engine']})",
        f"jobs {m['jobs']}: " + ", ".join(f"{s} {n}" for s, n in m["states"].items()),
        f"faults applied: {applied}",
        f"kills {m['kills']} ({m['kills_per_minute']}/min), provider calls "
        f"{m['provider_calls']}, billed {m['billed']}, wasted {m['wasted']}",
        *_cuts_line(m.get("kill_cuts")),
        *_progress_line(m.get("progress_latency")),
        *([f"skewed workers: {skew_text(report)}"] if skew_text(report) else []),
        "", verdict_table(report, console), *situations_lines(report), "",
    ]
    if report["faults_unfired"]:
        lines.append(("ERROR" if report["result"] == "error" else "also")
                     + ": these configured faults never fired: "
                     + ", ".join(report["faults_unfired"]))
    if report.get("faults_prevented"):
        lines.append("faults that did not fire because the run took their targets away first: "
                     + "; ".join(f"{k}: {v}" for k, v in report["faults_prevented"].items()))
    lines += crash_point_lines(report) + aim_summary_lines(report)
    if report.get("faults_not_applicable"):
        lines.append("not applicable to this engine (a capability it lacks, or points it does "
                     "not declare): "
                     + ", ".join(report["faults_not_applicable"]))
    unknown = [v["name"] for v in report["verdicts"] if v["verdict"] == "unknown"]
    if unknown:
        lines.append(f"unknown (no evidence either way): {', '.join(unknown)}")
    lines += [*incomplete_lines(report), result_line(report),
              f"report: {os.path.join(report['run_dir'], 'report.json')}",
              f"rerun this seed: {report['run_command']}",
              f"replay the saved plan: {report['replay_command']}"]
    return "\n".join(lines)
