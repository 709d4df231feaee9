"""report.html: one self-contained page per run (inline CSS, JS and SVG; no network request)
with the verdicts and their witnesses, the timeline, the charts, coverage and how to rerun."""
from __future__ import annotations

import json
import os
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup

from chaos.history import Event
from chaos.reports.render import charts
from chaos.reports.render.evidence import at, describe, event_key, ordered, witnesses, writer_names
from chaos.reports.render.svg import KIND_COLOURS, STEP_COLOURS, TimelineDrawing, palette
from chaos.reports.render.timeline import build_timeline

TEMPLATES = os.path.join(os.path.dirname(__file__), "templates")
WASTE_COLOURS = {"timeout": "#edc948", "crash-before-commit": "#e15759", "lost-lease": "#b07aa1",
                 "retry": "#f28e2b", "operator-discarded": "#9c755f", "duplicate": "#ff9da7"}
MAX_METRIC_CHARS = 4000
SHOWN_ERRORS = 3    # errors of a verdict shown at once; the rest sit behind one more click


#: kills the page lists one by one (report.json keeps more)
SHOWN_KILLS = 200


def render_html(report: dict[str, Any], history: list[Event] | None,
                snapshot: dict[str, Any] | None) -> str:
    """The page for a run; a missing history or snapshot leaves its sections explained."""
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=select_autoescape(),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["money"] = charts.money
    return env.get_template("report.html.j2").render(**context(report, history, snapshot))


def context(report: dict[str, Any], history: list[Event] | None,
            snapshot: dict[str, Any] | None) -> dict[str, Any]:
    """Everything the template shows, computed here so that the template only lays out."""
    history, snapshot = history or [], snapshot or {}
    pipeline = snapshot.get("pipeline", {})
    t0 = min((e["t"] for e in history), default=report.get("started", 0.0))
    names = writer_names(history)
    verdicts = [verdict_view(v, t0, names) for v in ordered(report["verdicts"])]
    # a partial run has no metrics (they need its phases' ends): what it gathered stands in
    ctx = {"r": report, "m": report.get("metrics") or report.get("gathered") or {},
           "verdicts": verdicts,
           "shown_errors": SHOWN_ERRORS,
           "counts": _counts(report), "t0": t0, "has_history": bool(history),
           "has_snapshot": bool(snapshot), "settings": snapshot.get("settings")
           or report["scenario"].get("engine", {})}
    if history:
        ctx.update(timeline_view(history, pipeline, report))
        ctx.update(charts_view(history, snapshot, pipeline, report))
    ctx["situations"] = [
        {**r, "examples": [{**x, "when": at(x["t"], t0) if x.get("t") is not None else "?"}
                           for x in r.get("examples") or []]}
        for r in (report.get("situations") or {}).values()]
    ctx["coverage"] = sorted(report.get("crashpoint_coverage", {}).items())
    ctx["kills"] = (report.get("kills") or [])[:SHOWN_KILLS] \
        if (report.get("metrics") or {}).get("kill_cuts") else []
    return ctx


def _counts(report: dict[str, Any]) -> dict[str, int]:
    counts = {"pass": 0, "fail": 0, "unknown": 0}
    for v in report["verdicts"]:
        counts[v["verdict"]] = counts.get(v["verdict"], 0) + 1
    return counts


def verdict_view(verdict: dict[str, Any], t0: float,
                 names: dict[str, str] | None = None) -> dict[str, Any]:
    """A verdict with its errors' events described and keyed for the timeline (`names`: the
    workers' names, from `writer_names`)."""
    errors = [{"type": e["type"], "message": e["message"],
               "events": [{"key": event_key(ev), "text": describe(ev, t0, names),
                           "json": json.dumps(ev, sort_keys=True)} for ev in e.get("events", [])]}
              for e in verdict.get("errors") or []]
    metrics = json.dumps(verdict.get("metrics", {}), indent=1, sort_keys=True)
    if len(metrics) > MAX_METRIC_CHARS:
        metrics = metrics[:MAX_METRIC_CHARS] + "\n… (cut; the whole is in report.json)"
    return {**verdict, "errors": errors, "metrics_text": metrics,
            "more": max(verdict.get("error_count", 0) - len(errors), 0)}


def timeline_view(history: list[Event], pipeline: dict[str, Any],
                  report: dict[str, Any]) -> dict[str, Any]:
    steps = palette([s["name"] for s in pipeline.get("steps", [])], STEP_COLOURS)
    kinds = palette(sorted({str(e.get("kind")) for e in history if e["src"] == "receiver"}),
                    KIND_COLOURS)
    timeline = build_timeline(history, pipeline, witnesses(report))
    drawing = TimelineDrawing(timeline, steps, kinds)
    return {"timeline_labels": Markup(drawing.labels()), "timeline_plot": Markup(drawing.plot()),
            "timeline_notes": timeline.notes, "step_colours": steps, "kind_colours": kinds,
            "witness_count": sum(1 for m in timeline.marks if m.kind == "witness")}


def charts_view(history: list[Event], snapshot: dict[str, Any], pipeline: dict[str, Any],
                report: dict[str, Any]) -> dict[str, Any]:
    t0 = history[0]["t"]
    t1 = max(max(e["t"], e.get("t_end") or 0.0) for e in history)
    series = charts.state_counts(history, pipeline, t0, t1)
    metrics = {v["name"]: v.get("metrics", {}) for v in report["verdicts"]}
    cost = metrics.get("cost-accounted", {})
    return {"states_chart": Markup(charts.stacked_area(series)), "states_note": series.note,
            "state_colours": [(s, series.colours[s]) for s in reversed(series.states)],
            "cost_chart": Markup(cost_chart(history, snapshot)),
            "waste_chart": Markup(waste_chart(cost)), "waste_colours": WASTE_COLOURS,
            "cost": cost, "outbox": outbox_view(history, metrics.get("outbox-bounded", {}))}


def cost_chart(history: list[Event], snapshot: dict[str, Any]) -> str:
    steps = palette([s["name"] for s in snapshot.get("pipeline", {}).get("steps", [])],
                    STEP_COLOURS)
    rows = [(step, [("committed", committed, steps.get(step, "#888")),
                    ("wasted", wasted, "#e15759")])
            for step, committed, wasted in charts.cost_by_step(history, snapshot)]
    return charts.hbars(rows, charts.money)


def waste_chart(cost: dict[str, Any]) -> str:
    calls = cost.get("calls_by_cause", {})
    rows = [(f"{cause} ({calls.get(cause, 0)} calls)",
             [(cause, value, WASTE_COLOURS.get(cause, "#999"))])
            for cause, value in sorted(cost.get("waste_by_cause", {}).items(),
                                       key=lambda kv: -kv[1])]
    return charts.hbars(rows, charts.money, label_w=220)


def outbox_view(history: list[Event], bounded: dict[str, Any]) -> dict[str, Any]:
    kinds = charts.outbox_by_kind(history)
    rows = [(kind, [(o, float(n), charts.outcome_colour(o)) for o, n in sorted(c.items())])
            for kind, c in kinds.items()]
    outcomes = sorted({o for c in kinds.values() for o in c})
    histogram = bounded.get("duplicates", {})
    attempts = sorted({int(n) for h in histogram.values() for n in h}) if histogram else []
    return {"chart": Markup(charts.hbars(rows, lambda v: f"{v:g} requests", label_w=90)),
            "outcomes": [(o, charts.outcome_colour(o)) for o in outcomes],
            "histogram": histogram, "attempts": attempts,
            "ambiguous": bounded.get("ambiguous", {})}
