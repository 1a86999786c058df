"""The dashboard's charts, on one time axis (minutes before the daemon's "now"):

- the PID trace: the group's batch window (left axis, requests) and the controller's measured
  signal against its target (right axis, ms), the picture of what the controller is steering;
- the engine's KV cache usage and queue (left axis: % and requests) and generation tok/s (right).

Each takes the last 5, 15 or 60 minutes; a series is averaged down to what the chart's width
can show, so an hour costs what five minutes do.
"""

from __future__ import annotations

from llmconsole.console.commands.window import no_samples_text
from llmconsole.console.tui.charts.series import SeriesHistory
from llmconsole.console.tui.charts.spec import COLOURS, ChartSpec, Series, downsample, minutes_ticks, nice_max
from llmconsole.console.tui.views.status import EngineView

RANGES_S = (300.0, 900.0, 3600.0)
SIGNALS = {"ttft": "p99 TTFT", "e2e": "p99 end-to-end", "tpot": "p99 TPOT"}


def range_text(range_s: float) -> str:
    return f"last {range_s / 60:g} min"


def _axis(
    history: SeriesHistory, name: str, key: str, range_s: float, width: int, scale: float = 1.0, hold: bool = False
) -> tuple[tuple[float, ...], tuple[float | None, ...]]:
    """A series on the time axis, in minutes before now, one point per half column of the plot."""
    now = history.now_s or 0.0
    t, v = history.series(name, key, now - range_s)
    x = [(a - now) / 60.0 for a in t]
    y = [None if b is None else b * scale for b in v]
    # Two points a column where the samples allow: the daemon's come every second or so.
    bins = max(20, min(2 * width, int(range_s / 2.0)))
    return downsample(x, y, -range_s / 60.0, 0.0, bins, hold=hold)


def _top(*columns: tuple[float | None, ...], floor: float = 0.0) -> float:
    return nice_max(max([floor, *(v for col in columns for v in col if v is not None)]) * 1.1)


def pid_chart(history: SeriesHistory, engine: EngineView | None, range_s: float, width: int) -> ChartSpec:
    title = f"PID trace · {range_text(range_s)}"
    c = engine.controller if engine is not None else None
    if engine is None or c is None:
        return ChartSpec(title, (), "window (req)", empty="no batch window: the engine is not behind the gateway")
    signal = SIGNALS.get(c.signal or "", c.signal or "signal")
    # The store keeps no idle step: the window and the target hold between the steps it kept.
    x, window = _axis(history, engine.name, "window", range_s, width, hold=True)
    mx, measured = _axis(history, engine.name, "measured_ms", range_s, width)
    tx, target = _axis(history, engine.name, "target_ms", range_s, width, hold=True)
    title += " · frozen" if c.frozen else " · controlled"
    if any(v is not None for v in measured):
        measured_label = f"measured {signal} (ms)"
    else:
        measured_label = no_samples_text(c.signal, c.recent_ok, c.recent_streamed)
    # The window's axis spans what it did, not the controller's bounds: a window held at 4 of
    # 4-32 would otherwise lie flat on the floor of a short chart.
    seen = [w for w in window if w is not None] or [float(c.window or 1)]
    lo, hi = 0.0, _top(tuple(seen), floor=4.0)
    return ChartSpec(
        title,
        (
            Series("window (req)", x, window, COLOURS["window"]),
            Series(measured_label, mx, measured, COLOURS["measured"], right=True),
            Series("target (ms)", tx, target, COLOURS["target"], right=True, glyph="┄"),
        ),
        y_label="req",
        y2_label="ms",
        x_lim=(-range_s / 60.0, 0.0),
        y_lim=(lo, hi),
        y2_lim=(0.0, _top(measured, target, floor=c.target_ms or 1.0)),
        x_ticks=minutes_ticks(range_s, width),
        empty="" if x else "no controller steps yet",
    )


def usage_chart(history: SeriesHistory, engine: EngineView | None, range_s: float, width: int) -> ChartSpec:
    title = f"KV cache, queue, tok/s · {range_text(range_s)}"
    if engine is None:
        return ChartSpec(title, (), "%", empty="no engine selected")
    x, kv = _axis(history, engine.name, "kv_cache_usage", range_s, width, scale=100.0)
    qx, queue = _axis(history, engine.name, "waiting", range_s, width)
    gx, tok = _axis(history, engine.name, "generation_tok_s", range_s, width)
    return ChartSpec(
        title,
        (
            Series("KV used (%)", x, kv, COLOURS["kv"]),
            Series("queue (req)", qx, queue, COLOURS["queue"]),
            Series("generated (tok/s)", gx, tok, COLOURS["tok"], right=True),
        ),
        y_label="% · req",
        y2_label="tok/s",
        x_lim=(-range_s / 60.0, 0.0),
        y_lim=(0.0, max(100.0, _top(queue))),
        y2_lim=(0.0, _top(tok, floor=1.0)),
        x_ticks=minutes_ticks(range_s, width),
        empty="" if x else "no samples yet: figures come once the engine serves",
    )
