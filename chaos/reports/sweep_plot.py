"""A small line chart as inline SVG (no plotting library, no network: it embeds anywhere)."""
from __future__ import annotations

from html import escape

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")
W, H, PAD = 400, 300, 48
LEFT = 70  # room for the y-axis labels


def line_chart(series: dict[str, list[tuple[float, float]]], title: str, x_label: str,
               x0: float = 0) -> str:
    """An SVG <g> at horizontal offset x0: one polyline per series, axes, ticks, legend."""
    points = [p for values in series.values() for p in values]
    if not points:
        return (f'<g transform="translate({x0},0)"><text x="{LEFT}" y="20">{escape(title)}'
                f'</text><text x="{LEFT}" y="60">no data</text></g>')
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    xmin, xmax = min(xs), max(xs)
    ymax = max(ys) or 1.0
    xmax = xmax if xmax > xmin else xmin + 1

    def sx(x: float) -> float:
        return LEFT + (x - xmin) / (xmax - xmin) * (W - LEFT - PAD)

    def sy(y: float) -> float:
        return H - PAD - y / ymax * (H - 2 * PAD)

    parts = [f'<g transform="translate({x0},0)">',
             f'<text x="{LEFT}" y="20" font-weight="bold">{escape(title)}</text>',
             f'<line x1="{LEFT}" y1="{H - PAD}" x2="{W - PAD}" y2="{H - PAD}" stroke="#333"/>',
             f'<line x1="{LEFT}" y1="{PAD}" x2="{LEFT}" y2="{H - PAD}" stroke="#333"/>',
             f'<text x="{W / 2}" y="{H - 10}" text-anchor="middle">{escape(x_label)}</text>',
             f'<text x="{LEFT - 6}" y="{sy(ymax) + 4}" text-anchor="end">{ymax:.3g}</text>',
             f'<text x="{LEFT - 6}" y="{H - PAD + 4}" text-anchor="end">0</text>']
    for x in sorted(set(xs)):
        parts.append(f'<text x="{sx(x)}" y="{H - PAD + 16}" text-anchor="middle">{x:g}</text>')
    for i, (name, values) in enumerate(sorted(series.items())):
        colour = COLOURS[i % len(COLOURS)]
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in sorted(values))
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" '
                     f'points="{coords}"/>')
        for x, y in values:
            parts.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{colour}"/>')
        parts.append(f'<text x="{W - PAD}" y="{20 + 13 * i}" text-anchor="end" '
                     f'fill="{colour}">{escape(name)}</text>')
    parts.append("</g>")
    return "".join(parts)
