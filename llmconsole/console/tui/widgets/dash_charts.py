"""The dashboard's two charts side by side: the PID trace, and KV cache, queue and tok/s.

They are redrawn when what they show changed, at most once per point of the plot (a point stands
for a few seconds over 5 minutes, half a minute over an hour: redrawing sooner moves nothing),
which keeps the console's CPU low with the charts on.
"""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal

from llmconsole.console.tui.charts.live import pid_chart, usage_chart
from llmconsole.console.tui.charts.series import SeriesHistory
from llmconsole.console.tui.views.status import EngineView
from llmconsole.console.tui.widgets.chart import ChartBox


class DashCharts(Horizontal):
    DEFAULT_CSS = """
    DashCharts { height: 3fr; min-height: 8; }
    """

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self._key: tuple[object, ...] = ()
        self._drawn_at = float("-inf")

    def compose(self) -> ComposeResult:
        yield ChartBox(id="pid-chart")
        yield ChartBox(id="usage-chart")

    def show(
        self,
        history: SeriesHistory,
        engine: EngineView | None,
        range_s: float,
        only: str | None = None,
    ) -> None:
        """Both charts, or `only` one of them ("pid", "usage") where the terminal is short."""
        pid, usage = self.query_one("#pid-chart", ChartBox), self.query_one("#usage-chart", ChartBox)
        pid.display = only in (None, "pid")
        usage.display = only in (None, "usage")
        usage.styles.margin = (0, 0, 0, 2 if only is None else 0)
        now = history.now_s or 0.0
        key = (
            engine.name if engine else None,
            engine.controller is None if engine else True,
            range_s,
            pid.size.width,
            usage.size.width,
            engine.state if engine else None,
            only,
        )
        # A point of the plot stands for `range_s / bins` seconds: redrawing sooner moves nothing.
        bin_s = range_s / max(20, min(2 * max(pid.size.width, usage.size.width), int(range_s / 2.0)))
        if key == self._key and now - self._drawn_at < max(1.0, bin_s):
            return
        self._key, self._drawn_at = key, now
        if pid.display:
            pid.show(pid_chart(history, engine, range_s, max(10, pid.size.width - 12)))
        if usage.display:
            usage.show(usage_chart(history, engine, range_s, max(10, usage.size.width - 12)))
