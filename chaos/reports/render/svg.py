"""Inline SVG for the HTML report: element helpers, colours, a time axis, and the timeline
drawn from `chaos.reports.render.timeline`. No script, no external reference: plain markup."""
from __future__ import annotations

import math
from html import escape
from typing import Iterable

from chaos.reports.render.timeline import HARNESS, Bar, Band, Lane, Mark, Timeline

STEP_COLOURS = ("#4e79a7", "#f28e2b", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
                "#9c755f")
KIND_COLOURS = ("#8cd17d", "#499894", "#d4a6c8", "#f1ce63", "#a0cbe8", "#ffbe7d")
ERROR = "#d62728"

AXIS_H, LABEL_W = 34, 128
LANE_H = {HARNESS: 24, "worker": 32, "sender": 24}
ROW_H = 24          # each further job-slot row of a lane (a process with several job slots)
PX_PER_S, MIN_W, MAX_W = 80.0, 1180, 7000
MAX_GUIDES = 40     # witnesses get a full-height guide line while there are this few


def el(tag: str, body: str = "", **attrs: object) -> str:
    """One SVG element; `class_` gives class, `data_x` gives data-x; floats are rounded."""
    parts = [tag]
    for name, value in attrs.items():
        if value is None:
            continue
        if isinstance(value, float):
            value = f"{value:.1f}".rstrip("0").rstrip(".")
        parts.append(f'{name.rstrip("_").replace("_", "-")}="{escape(str(value))}"')
    head = " ".join(parts)
    return f"<{head}>{body}</{tag}>" if body else f"<{head}/>"


def title(text: str) -> str:
    return f"<title>{escape(text)}</title>"


def palette(names: Iterable[str], colours: tuple[str, ...]) -> dict[str, str]:
    """A colour per name, in order, cycling through `colours`."""
    return {name: colours[i % len(colours)] for i, name in enumerate(names)}


def nice_step(span: float, pixels: float, min_gap: float = 70.0) -> float:
    """A 1-2-5 tick step so that ticks are at least `min_gap` pixels apart."""
    raw = span * min_gap / max(pixels, 1.0)
    power = 10 ** math.floor(math.log10(max(raw, 1e-9)))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


# -- the timeline -----------------------------------------------------------------------------

class TimelineDrawing:
    """Lays lanes out top to bottom and time left to right; `labels()` and `plot()` are two
    SVGs of the same height (the plot scrolls sideways, the labels stay)."""

    def __init__(self, timeline: Timeline, steps: dict[str, str], kinds: dict[str, str]) -> None:
        self.tl, self.steps, self.kinds = timeline, steps, kinds
        span = timeline.t1 - timeline.t0
        self.width = int(min(MAX_W, max(MIN_W, span * PX_PER_S)))
        self.scale = (self.width - 20) / max(span, 1e-9)
        self.y: dict[str, float] = {}
        self.h = {lane.key: LANE_H.get(lane.role, 28) + ROW_H * (lane.rows - 1)
                  for lane in timeline.lanes}
        y = float(AXIS_H)
        for lane in timeline.lanes:
            self.y[lane.key] = y
            y += self.h[lane.key]
        self.height = int(y + 4)
        self.guides = sum(m.kind == "witness" for m in timeline.marks) <= MAX_GUIDES

    def x(self, t: float) -> float:
        return 10 + (t - self.tl.t0) * self.scale

    def labels(self) -> str:
        rows = [el("text", "time (s)", x=8, y=22, class_="axis-label")]
        for lane in self.tl.lanes:
            y, h = self.y[lane.key], self.h[lane.key]
            label = "faults" if lane.key == HARNESS else lane.key
            sub = f"{len(lane.segments)} process{'es' if len(lane.segments) != 1 else ''}" \
                if lane.segments else ""
            rows.append(el("text", escape(label) + title(_lane_title(lane)), x=8,
                           y=y + h / 2 + (0 if sub else 4),
                           class_="lane-label"))
            if sub:
                rows.append(el("text", sub, x=8, y=y + h / 2 + 11,
                               class_="lane-sub"))
            if lane.rows > 1:  # how many steps its processes held at once
                rows.append(el("text", f"{lane.rows} steps at once", x=8, y=y + h / 2 + 22,
                               class_="lane-sub"))
        return el("svg", "".join(rows), width=LABEL_W, height=self.height,
                  viewBox=f"0 0 {LABEL_W} {self.height}", class_="tl-labels", role="img")

    def plot(self) -> str:
        parts = [self._defs(), self._lanes(), self._phases(), self._axis()]
        parts += [self._band(b) for b in self.tl.bands]
        parts += [self._bar(b) for b in sorted(self.tl.bars, key=lambda b: b.witness is not None)]
        parts += [self._mark(m) for m in sorted(self.tl.marks, key=lambda m: m.kind == "witness")]
        return el("svg", "".join(parts), width=self.width, height=self.height,
                  viewBox=f"0 0 {self.width} {self.height}", class_="tl-plot", role="img",
                  aria_label="timeline of workers and senders")

    def _defs(self) -> str:
        hatch = el("pattern", el("rect", width=6, height=6, fill="#fff3c4")
                   + el("path", d="M0,6 L6,0", stroke="#c9a227", stroke_width=1.2),
                   id="hatch", width=6, height=6, patternUnits="userSpaceOnUse")
        return el("defs", hatch)

    def _lanes(self) -> str:
        parts = []
        for i, lane in enumerate(self.tl.lanes):
            y, h = self.y[lane.key], self.h[lane.key]
            parts.append(el("rect", x=0, y=y, width=self.width, height=h,
                            class_="lane-bg" + (" alt" if i % 2 else "")))
            for j, seg in enumerate(lane.segments):
                parts.append(el("rect", title(f"{seg.name} (pid {seg.pid}): "
                                              f"{self._at(seg.start)} to {self._at(seg.end)}, "
                                              f"{seg.ended}"),
                                x=self.x(seg.start), y=y + 1,
                                width=max(self.x(seg.end) - self.x(seg.start), 1.0),
                                height=h - 2, class_=f"proc p{j % 2}"))
            for row in range(1, lane.rows):  # a rule between job-slot rows
                parts.append(el("line", x1=0, x2=self.width, y1=y + 2 + row * ROW_H,
                                y2=y + 2 + row * ROW_H, class_="slot-rule"))
        return "".join(parts)

    def _phases(self) -> str:
        parts = []
        for name, start, end in self.tl.phases:
            x0, x1 = self.x(start), self.x(end)
            parts.append(el("rect", title(f"{name} phase: {self._at(start)} to {self._at(end)}"),
                            x=x0, y=0, width=max(x1 - x0, 1.0), height=12,
                            class_=f"phase ph-{name}"))
            if x1 - x0 > 7 * len(name) + 8:  # a label only where it fits
                parts.append(el("text", escape(name), x=x0 + 4, y=10, class_="phase-label"))
            parts.append(el("line", x1=x0, x2=x0, y1=0, y2=self.height, class_="phase-line"))
        return "".join(parts)

    def _axis(self) -> str:
        span = self.tl.t1 - self.tl.t0
        step = nice_step(span, self.width - 20)
        parts, t = [], 0.0
        while t <= span + 1e-9:
            x = self.x(self.tl.t0 + t)
            parts.append(el("line", x1=x, x2=x, y1=AXIS_H - 6, y2=self.height, class_="tick"))
            parts.append(el("text", f"{t:g}", x=x + 2, y=AXIS_H - 9, class_="tick-label"))
            t += step
        return "".join(parts)

    def _band(self, band: Band) -> str:
        y, h = self.y.get(band.lane, AXIS_H), self.h.get(band.lane, 28)
        return el("rect", title(band.title), x=self.x(band.start), y=y + 1,
                  width=max(self.x(band.end) - self.x(band.start), 2.0), height=h - 2,
                  class_=f"band b-{band.kind}")

    def _bar(self, bar: Bar) -> str:
        y = self.y.get(bar.lane, AXIS_H) + bar.row * ROW_H
        if bar.kind == "call":
            y, h, fill = y + 20, 8, self.steps.get(bar.label, "#888")
        elif bar.kind == "send":
            y, h, fill = y + 6, 12, self.kinds.get(bar.label, "#888")
        else:
            y, h, fill = y + 5, 13, self.steps.get(bar.label, "#888")
        if bar.outcome == "error":
            fill = ERROR
        classes = f"bar {bar.kind} o-{bar.outcome.replace(' ', '-')}" + \
            (" witness" if bar.witness else "")
        x0, x1 = self.x(bar.start), self.x(bar.end)
        return el("rect", title(bar.title), x=x0, y=y, width=max(x1 - x0, 1.5), height=h,
                  fill=fill, class_=classes, data_witness=bar.witness,
                  data_verdicts=" ".join(bar.verdicts) or None)

    def _mark(self, mark: Mark) -> str:
        x = self.x(mark.t)
        if mark.lane is None:  # a forced lease expiry: every lease at once
            return el("line", title(mark.title), x1=x, x2=x, y1=AXIS_H - 4, y2=self.height,
                      class_="mark expire")
        y, h = self.y.get(mark.lane, AXIS_H), self.h.get(mark.lane, 28)
        body = title(mark.title) + _SHAPES[mark.kind](x, y, h)
        if mark.kind == "witness" and self.guides:
            body = el("line", x1=x, x2=x, y1=AXIS_H - 4, y2=self.height, class_="guide") + body
        return el("g", body, class_=f"mark {mark.kind}", data_witness=mark.witness,
                  data_verdicts=" ".join(mark.verdicts) or None)

    def _at(self, t: float) -> str:
        return f"+{t - self.tl.t0:.3f} s"


def _lane_title(lane: Lane) -> str:
    if lane.key == HARNESS:
        return "faults that hit no single process: outages, contention, operator actions"
    rows = (f" ({lane.rows} rows: the most steps its processes held at once, one row per "
            "job slot)") if lane.rows > 1 else ""
    return f"{lane.key}{rows}: " + "; ".join(f"{s.name} pid {s.pid} ({s.ended})"
                                             for s in lane.segments)


def _kill(x: float, y: float, h: float) -> str:
    c, r = y + h / 2, 5
    return el("path", d=f"M{x - r:.1f},{c - r:.1f}L{x + r:.1f},{c + r:.1f}"
                        f"M{x - r:.1f},{c + r:.1f}L{x + r:.1f},{c - r:.1f}")


def _crashpoint(x: float, y: float, h: float) -> str:
    return el("path", d=f"M{x - 3.5:.1f},{y + 1:.1f}L{x + 3.5:.1f},{y + 1:.1f}L{x:.1f},{y + 7:.1f}Z"
                        f"M{x:.1f},{y + 7:.1f}L{x:.1f},{y + h - 1:.1f}")


def _dot(x: float, y: float, h: float) -> str:
    return el("circle", cx=x, cy=y + h / 2, r=3.5)


def _witness(x: float, y: float, h: float) -> str:
    return (el("line", x1=x, x2=x, y1=y, y2=y + h) +
            el("path", d=f"M{x:.1f},{y - 2:.1f}L{x + 7:.1f},{y + 6:.1f}L{x:.1f},{y + 14:.1f}"
                         f"L{x - 7:.1f},{y + 6:.1f}Z"))


_SHAPES = {"kill": _kill, "crashpoint": _crashpoint, "operator": _dot, "submit": _dot,
           "witness": _witness}
