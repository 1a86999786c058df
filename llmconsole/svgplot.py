"""The primitives every chart llmconsole writes shares: palette, axis ticks, numbers, the frame.

Charts are plain SVG written by hand rather than with matplotlib: they are made on the inference
host, often with no display and a minimal Python, and a chart of a few series needs no font
cache or backend. This module sits at the package root and imports nothing of llmconsole, so
the export's time-series charts (db/) and the sweep's trade-off chart (engine/) can both build
on it without either reaching into the other.
"""

from __future__ import annotations

import math
from html import escape

# matplotlib's tab10 colours less its grey and olive, blue, red and green first: a series takes
# them in turn, and the sweep chart marks its front, knee and best point with the first three.
COLOURS: tuple[str, ...] = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About `n` evenly spaced round values (steps of 1, 2, 2.5 or 5 x 10^k) covering [lo, hi]."""
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step) * step
    return [first + k * step for k in range(int(math.ceil((hi - first) / step)) + 1)]


def fmt_number(v: float) -> str:
    """A tick label: three significant digits, large values with a k / M / G suffix."""
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 1e9:
        return f"{v / 1e9:g}G"
    if a >= 1e6:
        return f"{v / 1e6:g}M"
    if a >= 1e4:
        return f"{v / 1e3:g}k"
    return f"{v:.3g}"


def open_svg(width: int, height: int, title_x: int, title: str) -> list[str]:
    """The first lines of a chart: the document, a white background and the bold title."""
    return [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{title_x}" y="20" font-size="14" font-weight="bold">{escape(title)}</text>',
    ]


def no_data(width: int, height: int, message: str) -> str:
    """The centred note, and the document's end, of a chart with nothing to draw."""
    return f'<text x="{width / 2}" y="{height / 2}" text-anchor="middle" fill="#777">{escape(message)}</text></svg>'
