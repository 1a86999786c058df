"""The sweep's throughput-against-p99 chart as plain SVG, on the export's chart conventions.

It draws with llmconsole.svgplot's palette, ticks and number format, as the export's
time-series charts do, so every chart llmconsole writes reads the same; a scatter with the Pareto
front drawn through it is the one shape of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from llmconsole.engine.sweep.plan import PointResult
from llmconsole.svgplot import COLOURS, fmt_number, nice_ticks, no_data, open_svg

_W, _H = 760, 360
_LEFT, _RIGHT, _TOP, _BOTTOM = 70, 200, 34, 44


def tradeoff_chart(points: Sequence[PointResult], front: Sequence[int], best: int | None, knee: int | None) -> str:
    # A measured point has a throughput; one without a p99 has nowhere to go on this chart.
    xy = {
        i: (x, y)
        for i, p in enumerate(points)
        if p.measured and (x := p.p99_e2e_ms) is not None and (y := p.throughput_req_s) is not None
    }
    pts = [(i, x, y) for i, (x, y) in xy.items()]
    out = open_svg(_W, _H, _LEFT, "Throughput against p99 end-to-end latency")
    if not pts:
        out.append(no_data(_W, _H, "no measured points"))
        return "\n".join(out)
    xt = nice_ticks(0.0, max(x for _, x, _ in pts))
    yt = nice_ticks(0.0, max(y for _, _, y in pts))
    pw, ph = _W - _LEFT - _RIGHT, _H - _TOP - _BOTTOM

    def sx(v: float) -> float:
        return _LEFT + (v - xt[0]) / (xt[-1] - xt[0]) * pw

    def sy(v: float) -> float:
        return _TOP + ph - (v - yt[0]) / (yt[-1] - yt[0]) * ph

    for v in yt:
        out.append(f'<line x1="{_LEFT}" x2="{_LEFT + pw}" y1="{sy(v):.1f}" y2="{sy(v):.1f}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{_LEFT - 6}" y="{sy(v) + 4:.1f}" text-anchor="end">{fmt_number(v)}</text>')
    for v in xt:
        out.append(f'<text x="{sx(v):.1f}" y="{_TOP + ph + 16}" text-anchor="middle">{fmt_number(v)}</text>')
    out.append(
        f'<text x="{_LEFT + pw / 2}" y="{_H - 8}" text-anchor="middle" fill="#555">p99 end-to-end latency (ms)</text>'
    )
    out.append(
        f'<text transform="translate(14 {_TOP + ph / 2}) rotate(-90)" text-anchor="middle" '
        f'fill="#555">throughput (req/s)</text>'
    )
    out.append(f'<rect x="{_LEFT}" y="{_TOP}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')

    line = " ".join(f"{sx(xy[i][0]):.1f},{sy(xy[i][1]):.1f}" for i in front if i in xy)
    if len(front) > 1:
        out.append(
            f'<polyline fill="none" stroke="{COLOURS[0]}" stroke-width="1.5" stroke-dasharray="4 3" points="{line}"/>'
        )
    for i, x, y in pts:
        colour = COLOURS[0] if i in front else "#999"
        out.append(
            f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="4" fill="{colour}">'
            f"<title>{escape(points[i].label)}</title></circle>"
        )
        out.append(f'<text x="{sx(x) + 6:.1f}" y="{sy(y) - 6:.1f}" fill="#333">#{points[i].index}</text>')
    for pos, colour in ((best, COLOURS[2]), (knee, COLOURS[1])):
        if pos is not None and pos in xy:
            x, y = xy[pos]
            out.append(
                f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="8" fill="none" stroke="{colour}" stroke-width="2"/>'
            )
    legend = [
        ("Pareto front", COLOURS[0]),
        ("other points", "#999"),
        ("best under SLO", COLOURS[2]),
        ("knee", COLOURS[1]),
    ]
    for k, (name, colour) in enumerate(legend):
        ly = _TOP + 14 + 16 * k
        out.append(f'<circle cx="{_W - _RIGHT + 18}" cy="{ly - 4}" r="4" fill="{colour}"/>')
        out.append(f'<text x="{_W - _RIGHT + 28}" y="{ly}">{escape(name)}</text>')
    for k, (i, _, _) in enumerate(pts[:12]):
        ly = _TOP + 90 + 14 * k
        out.append(
            f'<text x="{_W - _RIGHT + 10}" y="{ly}" font-size="10">#{points[i].index} '
            f"{escape(points[i].label[:30])}</text>"
        )
    out.append("</svg>")
    return "\n".join(out)
