"""The report's charts: job states over time (the article's status query, replayed from the
engine's job operations), cost by step with waste by cause, and outbox attempts per effect
kind. Each is data from the run plus an inline SVG drawing of it."""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any

from chaos.checkers.ops import is_job
from chaos.history import Event
from chaos.reports.render.svg import ERROR, STEP_COLOURS, el, nice_step, title

MAX_SAMPLES = 400
PARKED_COLOURS = ("#c62828", "#e57373", "#ad1457", "#8e24aa", "#6d4c41")
OUTCOME_COLOURS = {"applied": "#59a14f", "replayed": "#8cd17d", "conflict": "#b07aa1",
                   "error": ERROR, "dropped": "#ff9da7", "applied_late": "#f28e2b"}


# -- job states over time ---------------------------------------------------------------------

@dataclass
class StateSeries:
    times: list[float]              # seconds since the run started
    states: list[str]               # bottom of the stack first
    counts: dict[str, list[int]]
    colours: dict[str, str]
    note: str


def state_order(pipeline: dict[str, Any], seen: set[str]) -> tuple[list[str], dict[str, str]]:
    """States bottom to top (terminal, parked, then the pipeline backwards) and colours."""
    steps = pipeline.get("steps", [])
    flow: list[str] = []
    colours: dict[str, str] = {}
    for i, step in enumerate(steps):
        colour = STEP_COLOURS[i % len(STEP_COLOURS)]
        for state, shade in ((step["ready"], _tint(colour, 0.55)), (step["working"], colour)):
            if state not in flow:
                flow.append(state)
                colours[state] = shade
    terminal = [s for s in pipeline.get("terminal", []) if s in seen]
    parked = [s for s in pipeline.get("parked", []) if s in seen]
    for state in terminal:
        colours[state] = "#2e7d32" if state != "cancelled" else "#9e9e9e"
    colours.update({s: PARKED_COLOURS[i % len(PARKED_COLOURS)] for i, s in enumerate(parked)})
    rest = sorted(seen - set(flow) - set(terminal) - set(parked))
    colours.update({s: "#bdbdbd" for s in rest})
    return terminal + parked + rest + [s for s in reversed(flow) if s in seen], colours


def state_counts(history: list[Event], pipeline: dict[str, Any], t0: float, t1: float,
                 samples: int = MAX_SAMPLES) -> StateSeries:
    """Jobs per state sampled at up to `samples` evenly spaced times, replaying the engine's
    job operations."""
    changes = [e for e in history if is_job(e)]
    seen = {s for s in map(_state_after, changes) if s}
    states, colours = state_order(pipeline, seen)
    n = max(2, min(samples, len(changes) + 2))
    times = [t0 + (t1 - t0) * i / (n - 1) for i in range(n)]
    counts = {s: [0] * n for s in states}
    current: dict[str, str] = {}
    tally: Counter[str] = Counter()
    i = 0
    for k, t in enumerate(times):
        while i < len(changes) and changes[i]["t"] <= t:
            _apply(changes[i], current, tally)
            i += 1
        for state in states:
            counts[state][k] = tally[state]
    note = (f"sampled at {n} evenly spaced times from {len(changes)} job changes"
            if len(changes) + 2 > samples else f"every one of {len(changes)} job changes")
    return StateSeries([t - t0 for t in times], states, counts, colours, note)


def _state_after(change: Event) -> str | None:
    """The job's state after a job operation (None once it is removed)."""
    if change["type"] == "removed":
        return None
    if change["type"] == "submitted":
        return change.get("state") or change.get("to")
    return change.get("to")


def _apply(change: Event, current: dict[str, str], tally: Counter) -> None:
    job = change["job"]
    if job in current:
        tally[current.pop(job)] -= 1
    state = _state_after(change)
    if state:
        current[job] = state
        tally[state] += 1


def stacked_area(series: StateSeries, width: int = 1180, height: int = 190) -> str:
    """The state counts as a stacked area chart with a time axis."""
    left, bottom, top = 44, 22, 8
    plot_w, plot_h = width - left - 10, height - bottom - top
    total = max((sum(series.counts[s][k] for s in series.states)
                 for k in range(len(series.times))), default=1) or 1
    span = series.times[-1] or 1.0
    xs = [left + t / span * plot_w for t in series.times]
    base = [0] * len(xs)
    parts = []
    for state in series.states:
        upper = [b + c for b, c in zip(base, series.counts[state])]
        heights = [top + plot_h - v / total * plot_h for v in upper + base]
        top_edge, bottom_edge = heights[:len(xs)], heights[len(xs):]
        points = [f"{x:.1f},{y:.1f}" for x, y in zip(xs, top_edge)] + \
                 [f"{x:.1f},{y:.1f}" for x, y in reversed(list(zip(xs, bottom_edge)))]
        peak = max(series.counts[state])
        parts.append(el("polygon", title(f"{state}: up to {peak} jobs"), points=" ".join(points),
                        fill=series.colours[state], class_="area"))
        base = upper
    parts += _axes(left, top, plot_w, plot_h, span, total)
    return el("svg", "".join(parts), viewBox=f"0 0 {width} {height}", class_="chart",
              role="img", aria_label="jobs per state over time")


def _axes(left: int, top: int, plot_w: int, plot_h: int, span: float, total: int) -> list[str]:
    parts = [el("line", x1=left, x2=left + plot_w, y1=top + plot_h, y2=top + plot_h,
                class_="axis")]
    step = nice_step(span, plot_w, 80)
    t = 0.0
    while t <= span + 1e-9:
        x = left + t / span * plot_w
        parts.append(el("text", f"{t:g} s", x=x, y=top + plot_h + 15, class_="tick-label",
                        text_anchor="middle"))
        t += step
    for v in sorted({0, total // 2, total}):
        y = top + plot_h - v / total * plot_h
        parts.append(el("line", x1=left, x2=left + plot_w, y1=y, y2=y, class_="grid"))
        parts.append(el("text", str(v), x=left - 6, y=y + 4, class_="tick-label",
                        text_anchor="end"))
    return parts


def _tint(colour: str, amount: float) -> str:
    rgb = [int(colour[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{int(c + (255 - c) * amount):02x}" for c in rgb)


# -- horizontal stacked bars ------------------------------------------------------------------

Segment = tuple[str, float, str]            # (label, value, colour)


def hbars(rows: list[tuple[str, list[Segment]]], fmt, width: int = 560,
          label_w: int = 150) -> str:
    """One horizontal stacked bar per row, its total printed after it."""
    if not rows:
        return ""
    row_h, plot_w = 26, width - label_w - 110
    peak = max(sum(v for _, v, _ in segs) for _, segs in rows) or 1.0
    parts = []
    for i, (label, segs) in enumerate(rows):
        y, x = 6 + i * row_h, float(label_w)
        parts.append(el("text", label, x=label_w - 8, y=y + 14, class_="bar-label",
                        text_anchor="end"))
        for name, value, colour in segs:
            w = value / peak * plot_w
            if w > 0:
                parts.append(el("rect", title(f"{label}: {name} {fmt(value)}"), x=x, y=y,
                                width=max(w, 1.0), height=18, fill=colour))
            x += w
        parts.append(el("text", fmt(sum(v for _, v, _ in segs)), x=x + 6, y=y + 14,
                        class_="bar-value"))
    height = 12 + len(rows) * row_h
    return el("svg", "".join(parts), viewBox=f"0 0 {width} {height}", class_="chart hbars",
              role="img")


# -- money and the outbox ---------------------------------------------------------------------

def money(value: float) -> str:
    return f"${value:,.2f}" if abs(value) >= 1 else f"${value:.6f}".rstrip("0").rstrip(".")


def cost_by_step(history: list[Event], snapshot: dict[str, Any]) -> list[tuple[str, float, float]]:
    """(step, committed, wasted) in pipeline order: billed from the provider ledger,
    committed from the final memos."""
    billed: Counter[str] = Counter()
    for e in history:
        if e["src"] == "provider" and e["type"] == "call":
            billed[e.get("step", "?")] += e.get("billed") or 0.0
    committed: Counter[str] = Counter()
    for memo in snapshot.get("memos", []):
        committed[memo["step"]] += memo.get("cost") or 0.0
    order = [s["name"] for s in snapshot.get("pipeline", {}).get("steps", [])]
    steps = order + sorted((set(billed) | set(committed)) - set(order))
    return [(s, committed[s], max(billed[s] - committed[s], 0.0)) for s in steps
            if billed[s] or committed[s]]


def outbox_by_kind(history: list[Event]) -> dict[str, Counter]:
    """Receiver requests per effect kind, counted by outcome."""
    kinds: dict[str, Counter] = defaultdict(Counter)
    for e in history:
        if e["src"] == "receiver" and e["type"] == "request":
            kinds[str(e.get("kind"))][str(e.get("outcome"))] += 1
    return dict(sorted(kinds.items()))


def outcome_colour(outcome: str) -> str:
    return OUTCOME_COLOURS.get(outcome, "#9e9e9e")
