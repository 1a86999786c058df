"""The dashboard's latency panel shows each histogram percentile as the bucket it falls in.

Fed a status built from recorded /metrics pages of a real engine under load (every request
queued under 300 ms: vLLM's first queue-time bucket), the panel reads `<300ms` for queue p50 and
p99, where the interpolation inside that bucket would read 150 ms and 297 ms.
"""

from __future__ import annotations

import asyncio
import json

from textual.app import App, ComposeResult

from llmconsole.console.tui.views.host import HostView
from llmconsole.console.tui.views.status import EngineView
from llmconsole.console.tui.widgets.engine_panel import EnginePanel
from llmconsole.console.tui.widgets.gauges import LatencyTable
from llmconsole.engine.metrics.page import parse_metrics
from llmconsole.engine.metrics.window import MetricsWindow
from llmconsole.engine.status import EngineStatus
from tests.support.paths import FIXTURES


def _status() -> dict:
    fix = FIXTURES / "metrics"
    times = json.loads((fix / "load_seq_times.json").read_text())["taken_at_s"]
    w = MetricsWindow(rate_window_s=10, percentile_window_s=60)
    for i, t in enumerate(times):
        m = w.add(parse_metrics((fix / f"load_seq_{i}.txt").read_text(), t))
    return EngineStatus(
        name="demo", state="ready", config_id="c", model="m", served_model_name="m", device="cpu", metrics=m
    ).to_json()


class _Panel(App[None]):
    def compose(self) -> ComposeResult:
        yield EnginePanel()


def test_the_latency_panel_shows_buckets_not_figures_inside_them():
    async def go() -> str:
        app = _Panel()
        async with app.run_test(size=(120, 12)) as pilot:
            app.query_one(EnginePanel).show(EngineView.parse(json.loads(json.dumps(_status()))), HostView())
            await pilot.pause()
            return str(app.query_one(LatencyTable).render())

    text = asyncio.run(go())
    rows = {line.split()[0]: line.split()[1:] for line in text.splitlines()[1:]}
    assert rows["queue"] == ["<300ms", "<300ms"]
    assert rows["TTFT"] == ["10-20ms", "20-40ms"] and rows["end-to-end"] == ["2-2.5s", "2.5-5s"]
    assert "150" not in text and "297" not in text
