"""Line charts as standalone SVG, with no plotting library: the routing benchmark and
`sparkgate plan` draw with this (an SVG opens in any browser and renders on GitHub)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape

_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
W, H = 720, 420
LEFT, RIGHT, TOP, BOTTOM = 70, 200, 40, 50


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    step = (hi - lo) / n if hi > lo else 1.0
    return [lo + i * step for i in range(n + 1)]


def line_chart(
    series: Mapping[str, Sequence[tuple[float, float]]],
    *,
    title: str,
    x_label: str,
    y_label: str,
    y_range: tuple[float, float] | None = None,
    hlines: Mapping[str, float] | None = None,
) -> str:
    """An SVG document: one line with markers per series, a legend on the right."""
    points = [p for pts in series.values() for p in pts]
    xs = [x for x, _ in points] or [0.0, 1.0]
    ys = [y for _, y in points] or [0.0, 1.0]
    x0, x1 = min(xs), max(xs)
    y0, y1 = y_range if y_range is not None else (min(0.0, min(ys)), max(ys) * 1.05 or 1.0)
    x1 = x1 if x1 > x0 else x0 + 1
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def sx(x: float) -> float:
        return LEFT + (x - x0) / (x1 - x0) * pw

    def sy(y: float) -> float:
        return TOP + ph - (min(max(y, y0), y1) - y0) / (y1 - y0) * ph

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
        'font-family="sans-serif" font-size="12">',
        f'<rect width="{W}" height="{H}" fill="white"/>',
        f'<text x="{LEFT + pw / 2}" y="22" text-anchor="middle" font-size="15">{escape(title)}</text>',
        f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>',
    ]
    for t in _ticks(y0, y1):
        out.append(f'<line x1="{LEFT}" x2="{LEFT + pw}" y1="{sy(t):.1f}" y2="{sy(t):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{LEFT - 6}" y="{sy(t) + 4:.1f}" text-anchor="end">{t:.3g}</text>')
    for t in _ticks(x0, x1):
        out.append(f'<text x="{sx(t):.1f}" y="{TOP + ph + 18}" text-anchor="middle">{t:.3g}</text>')
    out.append(f'<text x="{LEFT + pw / 2}" y="{H - 10}" text-anchor="middle">{escape(x_label)}</text>')
    out.append(
        f'<text x="18" y="{TOP + ph / 2}" text-anchor="middle" transform="rotate(-90 18 {TOP + ph / 2})">'
        f"{escape(y_label)}</text>"
    )
    for name, y in (hlines or {}).items():
        out.append(
            f'<line x1="{LEFT}" x2="{LEFT + pw}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" '
            'stroke="#999" stroke-dasharray="5,4"/>'
        )
        out.append(f'<text x="{LEFT + 4}" y="{sy(y) - 4:.1f}" fill="#666">{escape(name)}</text>')
    for i, (name, pts) in enumerate(series.items()):
        color = _COLORS[i % len(_COLORS)]
        path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in sorted(pts))
        out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
        for x, y in pts:
            out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{color}"/>')
        ly = TOP + 14 + i * 18
        out.append(
            f'<line x1="{W - RIGHT + 12}" x2="{W - RIGHT + 32}" y1="{ly - 4}" y2="{ly - 4}" stroke="{color}" '
            'stroke-width="2"/>'
        )
        out.append(f'<text x="{W - RIGHT + 38}" y="{ly}">{escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
