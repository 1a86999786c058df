"""Line charts over time as plain SVG, for the export's report.

Built on llmconsole.svgplot, as every chart llmconsole writes is. A None value is a gap in the
line, not a zero.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from html import escape

from llmconsole.svgplot import COLOURS, fmt_number, nice_ticks, no_data, open_svg

Series = tuple[str, Sequence[tuple[float, float | None]]]  # (label, [(epoch s, value)])

_W, _H = 760, 300
_LEFT, _RIGHT, _TOP, _BOTTOM = 70, 150, 34, 40


def _clock(t: float, span_s: float) -> str:
    fmt = "%H:%M:%S" if span_s < 600 else ("%H:%M" if span_s < 2 * 86_400 else "%m-%d %H:%M")
    return time.strftime(fmt, time.gmtime(t))


def line_chart(title: str, series: Sequence[Series], y_label: str) -> str:
    """An SVG document charting `series` against UTC time."""
    points = [(t, v) for _, pts in series for t, v in pts if v is not None and math.isfinite(v)]
    out = open_svg(_W, _H, _LEFT, title)
    if not points:
        out.append(no_data(_W, _H, "no data"))
        return "\n".join(out)
    t0, t1 = min(p[0] for p in points), max(p[0] for p in points)
    if t1 <= t0:
        t0, t1 = t0 - 30, t1 + 30
    ticks = nice_ticks(min(0.0, min(p[1] for p in points)), max(p[1] for p in points))
    y0, y1 = ticks[0], ticks[-1]
    pw, ph = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def x(t: float) -> float:
        return _LEFT + (t - t0) / (t1 - t0) * pw

    def y(v: float) -> float:
        return _TOP + ph - (v - y0) / (y1 - y0) * ph

    for v in ticks:
        out.append(f'<line x1="{_LEFT}" x2="{_LEFT + pw}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{_LEFT - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{fmt_number(v)}</text>')
    for k in range(6):
        t = t0 + (t1 - t0) * k / 5
        out.append(f'<text x="{x(t):.1f}" y="{_TOP + ph + 16}" text-anchor="middle">{_clock(t, t1 - t0)}</text>')
    out.append(f'<text x="{_LEFT + pw / 2}" y="{_H - 6}" text-anchor="middle" fill="#555">time (UTC)</text>')
    out.append(
        f'<text transform="translate(14 {_TOP + ph / 2}) rotate(-90)" text-anchor="middle" '
        f'fill="#555">{escape(y_label)}</text>'
    )
    out.append(f'<rect x="{_LEFT}" y="{_TOP}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')

    for k, (label, pts) in enumerate(series):
        colour = COLOURS[k % len(COLOURS)]
        runs: list[list[str]] = []
        current: list[str] = []
        for t, value in sorted(pts, key=lambda p: p[0]):
            if value is None or not math.isfinite(value):
                if current:
                    runs.append(current)
                current = []
            else:
                current.append(f"{x(t):.1f},{y(value):.1f}")
        if current:
            runs.append(current)
        for run in runs:
            if len(run) == 1:
                cx, cy = run[0].split(",")
                out.append(f'<circle cx="{cx}" cy="{cy}" r="2" fill="{colour}"/>')
            else:
                out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{" ".join(run)}"/>')
        ly = _TOP + 14 + 16 * k
        out.append(
            f'<line x1="{_W - _RIGHT + 10}" x2="{_W - _RIGHT + 28}" y1="{ly - 4}" y2="{ly - 4}" '
            f'stroke="{colour}" stroke-width="2"/>'
        )
        out.append(f'<text x="{_W - _RIGHT + 32}" y="{ly}">{escape(label)}</text>')
    out.append("</svg>")
    return "\n".join(out)
