"""The sweep's throughput-against-p99 chart as plain SVG, on the export's chart conventions.

It borrows the tick and number formatting of llmconsole.db.svgplot so every chart llmconsole
writes reads the same; a scatter with the Pareto front drawn through it is the one shape that
module's time-series charts do not cover.
"""

from __future__ import annotations

from html import escape
from typing import Sequence

from llmconsole.db.svgplot import _COLOURS, _fmt, _nice_ticks
from llmconsole.engine.sweep.plan import PointResult

_W, _H = 760, 360
_LEFT, _RIGHT, _TOP, _BOTTOM = 70, 200, 34, 44


def tradeoff_chart(points: Sequence[PointResult], front: Sequence[int], best: int | None,
                   knee: int | None) -> str:
    pts = [(i, p.p99_e2e_ms, p.throughput_req_s) for i, p in enumerate(points) if p.measured]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" '
           f'viewBox="0 0 {_W} {_H}" font-family="sans-serif" font-size="11">',
           f'<rect width="{_W}" height="{_H}" fill="white"/>',
           f'<text x="{_LEFT}" y="20" font-size="14" font-weight="bold">'
           f'Throughput against p99 end-to-end latency</text>']
    if not pts:
        out.append(f'<text x="{_W / 2}" y="{_H / 2}" text-anchor="middle" fill="#777">no measured points</text></svg>')
        return "\n".join(out)
    xt = _nice_ticks(0.0, max(x for _, x, _ in pts))
    yt = _nice_ticks(0.0, max(y for _, _, y in pts))
    pw, ph = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def sx(v: float) -> float:
        return _LEFT + (v - xt[0]) / (xt[-1] - xt[0]) * pw

    def sy(v: float) -> float:
        return _TOP + ph - (v - yt[0]) / (yt[-1] - yt[0]) * ph

    for v in yt:
        out.append(f'<line x1="{_LEFT}" x2="{_LEFT + pw}" y1="{sy(v):.1f}" y2="{sy(v):.1f}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{_LEFT - 6}" y="{sy(v) + 4:.1f}" text-anchor="end">{_fmt(v)}</text>')
    for v in xt:
        out.append(f'<text x="{sx(v):.1f}" y="{_TOP + ph + 16}" text-anchor="middle">{_fmt(v)}</text>')
    out.append(f'<text x="{_LEFT + pw / 2}" y="{_H - 8}" text-anchor="middle" fill="#555">p99 end-to-end latency (ms)</text>')
    out.append(f'<text transform="translate(14 {_TOP + ph / 2}) rotate(-90)" text-anchor="middle" '
               f'fill="#555">throughput (req/s)</text>')
    out.append(f'<rect x="{_LEFT}" y="{_TOP}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')

    line = " ".join(f"{sx(points[i].p99_e2e_ms):.1f},{sy(points[i].throughput_req_s):.1f}" for i in front)
    if len(front) > 1:
        out.append(f'<polyline fill="none" stroke="{_COLOURS[0]}" stroke-width="1.5" '
                   f'stroke-dasharray="4 3" points="{line}"/>')
    for i, x, y in pts:
        colour = _COLOURS[0] if i in front else "#999"
        out.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="4" fill="{colour}">'
                   f'<title>{escape(points[i].label)}</title></circle>')
        out.append(f'<text x="{sx(x) + 6:.1f}" y="{sy(y) - 6:.1f}" fill="#333">#{points[i].index}</text>')
    for pos, name, colour in ((best, "best under SLO", _COLOURS[2]), (knee, "knee", _COLOURS[1])):
        if pos is not None and points[pos].measured:
            p = points[pos]
            out.append(f'<circle cx="{sx(p.p99_e2e_ms):.1f}" cy="{sy(p.throughput_req_s):.1f}" r="8" '
                       f'fill="none" stroke="{colour}" stroke-width="2"/>')
    legend = [("Pareto front", _COLOURS[0]), ("other points", "#999"), ("best under SLO", _COLOURS[2]),
              ("knee", _COLOURS[1])]
    for k, (name, colour) in enumerate(legend):
        ly = _TOP + 14 + 16 * k
        out.append(f'<circle cx="{_W - _RIGHT + 18}" cy="{ly - 4}" r="4" fill="{colour}"/>')
        out.append(f'<text x="{_W - _RIGHT + 28}" y="{ly}">{escape(name)}</text>')
    for k, (i, _, _) in enumerate(pts[:12]):
        ly = _TOP + 90 + 14 * k
        out.append(f'<text x="{_W - _RIGHT + 10}" y="{ly}" font-size="10">#{points[i].index} '
                   f'{escape(points[i].label[:30])}</text>')
    out.append("</svg>")
    return "\n".join(out)
