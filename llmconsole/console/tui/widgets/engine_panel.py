"""The selected engine on the dashboard: gauges, figures, latency percentiles and trends.

Where the host has no GPU (host.gpus is empty) the GPU gauges give their place to host memory
and host CPU with the engine's own share beside them, and the title says so.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Sparkline, Static

from llmconsole.console.tui.history import MetricHistory
from llmconsole.console.tui.view import (
    NA,
    EngineView,
    HostView,
    fmt_bytes,
    fmt_count,
    fmt_ms,
    fmt_pct,
    fmt_rate,
    na,
)
from llmconsole.console.tui.widgets.gauges import Figures, Gauge, LatencyTable


class Trend(Horizontal):
    """A label with the latest value, and a sparkline of the last minutes."""

    DEFAULT_CSS = """
    Trend { height: 1; width: 1fr; }
    Trend > .trend-label { width: 18; }
    Trend > Sparkline { width: 1fr; height: 1fr; margin-right: 1; }
    """

    def __init__(self, title: str, key: str, fmt: Callable[[float | None], str], **kw: Any) -> None:
        super().__init__(**kw)
        self.title, self.key, self.fmt = title, key, fmt
        self._label = Static(title, classes="trend-label")
        self._spark = Sparkline([])
        self._data: list[float] = []

    def compose(self) -> ComposeResult:
        yield self._label
        yield self._spark

    def show(self, data: list[float]) -> None:
        if data == self._data:
            return
        self._data = data
        latest = self.fmt(data[-1]) if data else NA
        self._label.update(Text.assemble((self.title, "bold"), " ", latest))
        self._spark.data = data


class EnginePanel(Vertical):
    DEFAULT_CSS = """
    EnginePanel { height: auto; }
    EnginePanel > #engine-title { height: 1; background: $boost; padding: 0 1; }
    EnginePanel #engine-numbers { height: 6; }
    EnginePanel #engine-left { width: 1fr; padding: 0 1; }
    EnginePanel #engine-latency { width: 34; padding: 0 1; }
    EnginePanel #engine-trends { height: auto; padding: 0 1; }
    """

    def compose(self) -> ComposeResult:
        yield Static("no engine selected", id="engine-title")
        with Horizontal(id="engine-numbers"):
            with Vertical(id="engine-left"):
                yield Gauge("KV cache", id="gauge-kv")
                yield Gauge("memory", id="gauge-mem")
                yield Gauge("util", id="gauge-util")
                yield Figures(id="engine-counts")
            yield LatencyTable(id="engine-latency")
        with Horizontal(id="engine-trends"):
            yield Trend("tok/s", "generation_tok_s", fmt_rate, id="trend-tok")
            yield Trend("p99 TTFT", "p99_ttft_s", fmt_ms, id="trend-ttft")
            yield Trend("KV", "kv_cache_usage", fmt_pct, id="trend-kv")

    def show(self, engine: EngineView | None, host: HostView, history: MetricHistory) -> None:
        title = self.query_one("#engine-title", Static)
        gpu = bool(host.gpus)
        where = f"{len(host.gpus)} GPU(s)" if gpu else "no GPU: host memory and CPU shown"
        if engine is None:
            title.update(Text.assemble(("no engine selected", "bold"), f"  ·  {where}"))
        else:
            stale = "  ·  metrics stale" if engine.metrics_stale else ""
            if engine.last_error and engine.state in ("failed", "crashed", "unhealthy"):
                title.update(Text.assemble((engine.name, "bold"), f"  ·  {engine.state_text}  ·  ",
                                           (engine.last_error, "red"), no_wrap=True, overflow="ellipsis"))
            else:
                title.update(Text.assemble((engine.name, "bold"), f"  ·  {engine.state_text}  ·  {where}{stale}"))
        m = engine.metric if engine is not None else (lambda _key: None)

        kv = m("kv_cache_usage")
        kv_text = fmt_pct(kv)
        if engine is not None and engine.kv_cache_tokens is not None and kv is not None:
            kv_text += f" of {engine.kv_cache_tokens:,} tok"
        self.query_one("#gauge-kv", Gauge).set("KV cache", kv, kv_text)
        mem, util = self.query_one("#gauge-mem", Gauge), self.query_one("#gauge-util", Gauge)
        if gpu:
            used, total = host.gpu_memory
            mem.set("GPU memory", used / total if used is not None and total else None,
                    f"{fmt_bytes(used)} / {fmt_bytes(total)}")
            pct = host.gpu_utilization_pct
            util.set("GPU util", None if pct is None else pct / 100.0, na(pct, "{:.0f}%"))
        else:
            mem.set("host memory", host.memory_fraction,
                    f"{fmt_bytes(host.memory_used_bytes)} / {fmt_bytes(host.memory_total_bytes)}")
            util.set("host CPU", None if host.cpu_pct is None else host.cpu_pct / 100.0,
                     na(host.cpu_pct, "{:.0f}%"))
        rss = engine.rss_bytes if engine is not None else None
        cpu = engine.cpu_pct if engine is not None else None
        self.query_one("#engine-counts", Figures).set_rows([
            [("engine RSS", fmt_bytes(rss)), ("engine CPU", na(cpu, "{:.0f}%"))],
            [("running", fmt_count(m("running"))), ("waiting", fmt_count(m("waiting")))],
            [("prompt tok/s", fmt_rate(m("prompt_tok_s"))), ("gen tok/s", fmt_rate(m("generation_tok_s")))],
        ])
        self.query_one("#engine-latency", LatencyTable).set_rows([
            ("TTFT", fmt_ms(m("p50_ttft_s")), fmt_ms(m("p99_ttft_s"))),
            ("inter-token", fmt_ms(m("p50_itl_s")), fmt_ms(m("p99_itl_s"))),
            ("end-to-end", fmt_ms(m("p50_e2e_s")), fmt_ms(m("p99_e2e_s"))),
            ("per token", fmt_ms(m("p50_tpot_s")), fmt_ms(m("p99_tpot_s"))),
            ("queue", fmt_ms(m("p50_queue_s")), fmt_ms(m("p99_queue_s"))),
        ])
        for trend in self.query(Trend):
            trend.show(history.series(engine.name, trend.key) if engine is not None else [])
