"""What a chart shows, as immutable values: its series, axes, units and legend.

The chart builders (charts/live.py, charts/runs.py) turn what the console knows into a ChartSpec;
the Chart widget (widgets/chart.py) draws a spec with plotext and redraws only when the spec or
its size changes. Specs compare by value, so "nothing changed" costs a comparison, and the
builders are tested without a screen.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

Kind = str  # line | points | step | errorbars

# One palette for plotext's lines and the legend's swatches (Rich), as RGB so both draw the same
# colour whatever the terminal's ANSI palette or the app's theme; readable on dark and light.
COLOURS = {
    "window": "#29b6f6",
    "measured": "#ec407a",
    "target": "#ffca28",
    "kv": "#29b6f6",
    "queue": "#ab47bc",
    "tok": "#66bb6a",
    "front": "#29b6f6",
    "points": "#bdbdbd",
    "knee": "#ec407a",
    "slo": "#ef5350",
    "best": "#66bb6a",
    "pruned": "#ffca28",
    "failed": "#ef5350",
    "complete": "#29b6f6",
    "running": "#bdbdbd",
}


def rgb(colour: str) -> tuple[int, int, int]:
    """`#29b6f6` as plotext takes it."""
    return int(colour[1:3], 16), int(colour[3:5], 16), int(colour[5:7], 16)


@dataclass(frozen=True)
class Series:
    label: str  # the legend: what, and its unit
    x: tuple[float, ...]
    y: tuple[float | None, ...]  # None: a gap
    colour: str
    kind: Kind = "line"
    right: bool = False  # on the right-hand y axis
    err: tuple[float, ...] = ()  # errorbars: half-heights, one per point
    glyph: str = "─"  # the legend's swatch
    marker: str = "braille"  # plotext's marker for points ("x", "o", "•", ...)


@dataclass(frozen=True)
class ChartSpec:
    title: str
    series: tuple[Series, ...]
    y_label: str  # the left axis' unit
    x_label: str = ""
    y2_label: str = ""  # the right axis' unit, if a series is on it
    x_lim: tuple[float, float] | None = None
    y_lim: tuple[float, float] | None = None
    y2_lim: tuple[float, float] | None = None
    x_ticks: tuple[tuple[float, str], ...] = ()
    empty: str = ""  # said in place of the plot when there is nothing to draw

    @property
    def has_data(self) -> bool:
        return any(v is not None for s in self.series for v in s.y) and not self.empty


def segments(x: Sequence[float], y: Sequence[float | None]) -> list[tuple[list[float], list[float]]]:
    """A line's runs without gaps: plotext draws no None, and a gap must stay a gap."""
    out: list[tuple[list[float], list[float]]] = []
    xs: list[float] = []
    ys: list[float] = []
    for a, b in zip(x, y, strict=True):
        if b is None or not math.isfinite(b):
            if xs:
                out.append((xs, ys))
            xs, ys = [], []
        else:
            xs.append(a)
            ys.append(b)
    if xs:
        out.append((xs, ys))
    return out


GAP_BINS = 3  # fewer empty bins in a row than this are a late sample, not a gap


def downsample(
    x: Sequence[float], y: Sequence[float | None], lo: float, hi: float, bins: int, hold: bool = False
) -> tuple[tuple[float, ...], tuple[float | None, ...]]:
    """One point per bin of [lo, hi] from the first bin with a figure to the last: the bin's mean,
    so a 60-minute line costs what a 5-minute one does. A bin without a figure is a gap (None),
    so a line does not bridge an engine's restart; with `hold` it keeps the value before it
    instead (a setting, such as the batch window, stays what it was until it changes)."""
    if hi <= lo or not x:
        return tuple(x), tuple(y)
    width = (hi - lo) / bins
    sums = [0.0] * bins
    counts = [0] * bins
    for a, b in zip(x, y, strict=True):
        i = min(bins - 1, max(0, int((a - lo) / width)))
        if b is not None:
            sums[i] += b
            counts[i] += 1
    filled = [i for i in range(bins) if counts[i]]
    if not filled:
        return (), ()
    xs: list[float] = []
    ys: list[float | None] = []
    last: float | None = None
    empty = 0
    for i in range(filled[0], filled[-1] + 1):
        if counts[i]:
            if empty and not hold and empty < GAP_BINS:  # a sample that came late is no gap
                ys[-empty:] = [last] * empty
            empty, last = 0, sums[i] / counts[i]
            value: float | None = last
        else:
            empty += 1
            value = last if hold else None
        xs.append(lo + (i + 0.5) * width)
        ys.append(value)
    return tuple(xs), tuple(ys)


def minutes_ticks(range_s: float, width: int) -> tuple[tuple[float, str], ...]:
    """Ticks of a time axis in minutes before now (-15 .. 0), labelled -15m ... now."""
    minutes = range_s / 60.0
    room = max(2, width // 9)
    fits = [s for s in (1, 2, 3, 5, 10, 15, 20, 30) if minutes % s == 0 and minutes / s <= room]
    step = fits[0] if fits else max(1, int(minutes))
    ticks = [-float(m) for m in range(int(minutes) // step * step, 0, -step)]
    return tuple((t, f"{t:g}m") for t in ticks) + ((0.0, "now"),)


def nice_max(value: float) -> float:
    """The axis top for `value`: a round step (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8) times a power of ten."""
    if value <= 0 or not math.isfinite(value):
        return 1.0
    p = 10.0 ** math.floor(math.log10(value))
    return next(m * p for m in (1.0, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0) if m * p >= value)
