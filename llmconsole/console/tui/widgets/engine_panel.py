"""The selected engine on the dashboard: a title line (with a progress bar while it starts or
switches mode), gauges, figures and latency percentiles over a stated window, and a
data-parallel engine's ranks below them.

Where the host has no GPU (host.gpus is empty) the GPU gauges give their place to host memory
and host CPU with the engine's own share beside them, and the title says so. On a short
terminal (`-short` on the screen) the figures and the latency table keep their first rows.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widgets import Static

from llmconsole.console.tui import progress
from llmconsole.console.tui.views.status import (
    NA,
    EngineView,
    HostView,
    fmt_bytes,
    fmt_count,
    fmt_pct,
    fmt_rate,
    na,
)
from llmconsole.console.tui.widgets.gauges import Figures, Gauge, LatencyTable
from llmconsole.console.tui.widgets.rank_rows import RankRows


@dataclass(frozen=True)
class Switch:
    """A mode switch this console asked for and is waiting on (the daemon answers at its end)."""

    mode: str
    elapsed_s: float
    expected_s: float | None  # the engine's last start, plus a drain and a smoke request
    restarted: bool  # the engine has left `ready` since the switch began


def title_text(engine: EngineView | None, host: HostView, switch: Switch | None, width: int = 120) -> Text:
    gpu = f"{len(host.gpus)} GPU(s)" if host.gpus else "no GPU: host memory and CPU shown"
    if engine is None:
        return Text.assemble(("no engine selected", "bold"), f"  ·  {gpu}")
    head = Text.assemble((engine.name, "bold"), f"  ·  {engine.state_text}  ·  ", no_wrap=True, overflow="ellipsis")
    if switch is not None:
        if engine.state == "starting" and engine.startup is not None:
            where = f"restarting: {engine.startup.phase}"
        elif engine.state in ("stopping", "crashed", "stopped", "starting"):
            where = "restarting"
        else:
            where = "checking it serves" if switch.restarted else "draining its requests"
        head.append(f"mode → {switch.mode} ")
        head.append_text(progress.timed(where, switch.elapsed_s, switch.expected_s, 10, width - head.cell_len))
        return head
    if engine.state == "starting" and engine.startup is not None:
        s = engine.startup
        head.append_text(
            progress.timed(f"{s.phase} {s.step + 1}/{s.steps}", s.elapsed_s, s.expected_s, 10, width - head.cell_len)
        )
        return head
    if engine.last_error and engine.state in ("failed", "crashed", "unhealthy"):
        head.append(engine.last_error, style="red")
        return head
    head.append(gpu + ("  ·  metrics stale" if engine.metrics_stale else ""))
    return head


def latency_caption(engine: EngineView | None) -> tuple[str, bool]:
    """The latency table's window: `60 s · 22 req` (the percentiles are over the last 60 s, and
    22 requests finished in them), and whether any did: an idle engine shows no percentile, not
    the last busy minute's."""
    if engine is None or engine.metrics is None:
        return "latency", False
    window = engine.metric("percentile_window_s")
    over = f"{window:.0f} s" if window is not None else "latency"
    n = engine.metric("requests_in_window")
    if not n:
        return f"{over} · no req", False
    return f"{over} · {n:.0f} req" if n < 1000 else f"{over} · {n / 1000:.1f}k req", True


class EnginePanel(Vertical):
    DEFAULT_CSS = """
    EnginePanel { height: auto; }
    EnginePanel > #engine-title { height: 1; background: $boost; padding: 0 1; text-wrap: nowrap; text-overflow: ellipsis; }
    EnginePanel #engine-numbers { height: 6; }
    EnginePanel #engine-left { width: 1fr; padding: 0 1; }
    EnginePanel #engine-latency { width: 36; height: 1fr; padding: 0 1; }  /* 15 + 9 + 10 */
    EnginePanel #engine-counts { height: 1fr; }  /* fixed boxes: their text changes without a new layout */
    """

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.short = False

    def compose(self) -> ComposeResult:
        yield Static("no engine selected", id="engine-title")
        with Horizontal(id="engine-numbers"):
            with Vertical(id="engine-left"):
                yield Gauge("KV cache", id="gauge-kv")
                yield Gauge("memory", id="gauge-mem")
                yield Gauge("util", id="gauge-util")
                yield Figures(id="engine-counts")
            yield LatencyTable(id="engine-latency")
        yield RankRows(id="engine-ranks")

    def set_short(self, short: bool) -> None:
        """A short terminal keeps three rows: KV and memory, the counts, and TTFT and end-to-end
        latency (host CPU is on the status line)."""
        self.short = short
        self.query_one("#engine-numbers").styles.height = 3 if short else 6
        self.query_one("#gauge-util").display = not short

    def show(self, engine: EngineView | None, host: HostView, switch: Switch | None = None) -> None:
        title = self.query_one("#engine-title", Static)
        title.update(title_text(engine, host, switch, max(40, title.content_size.width or 120)), layout=False)
        m = engine.metric if engine is not None else (lambda _key: None)
        kv = m("kv_cache_usage")
        kv_text = fmt_pct(kv)
        if engine is not None and engine.kv_cache_tokens is not None and kv is not None:
            kv_text += f" of {engine.kv_cache_tokens:,} tok"
        self.query_one("#gauge-kv", Gauge).set("KV cache", kv, kv_text)
        mem, util = self.query_one("#gauge-mem", Gauge), self.query_one("#gauge-util", Gauge)
        if host.gpus:
            used, total = host.gpu_memory
            mem.set(
                "GPU memory",
                used / total if used is not None and total else None,
                f"{fmt_bytes(used)} / {fmt_bytes(total)}",
            )
            pct = host.gpu_utilization_pct
            util.set("GPU util", None if pct is None else pct / 100.0, na(pct, "{:.0f}%"))
        else:
            mem.set(
                "host memory",
                host.memory_fraction,
                f"{fmt_bytes(host.memory_used_bytes)} / {fmt_bytes(host.memory_total_bytes)}",
            )
            util.set("host CPU", None if host.cpu_pct is None else host.cpu_pct / 100.0, na(host.cpu_pct, "{:.0f}%"))
        rss = engine.rss_bytes if engine is not None else None
        cpu = engine.cpu_pct if engine is not None else None
        rows = [
            [
                ("running", fmt_count(m("running"))),
                ("waiting", fmt_count(m("waiting"))),
                ("gen tok/s", fmt_rate(m("generation_tok_s"))),
            ],
            [
                ("engine RSS", fmt_bytes(rss)),
                ("engine CPU", na(cpu, "{:.0f}%")),
                ("prompt tok/s", fmt_rate(m("prompt_tok_s"))),
            ],
        ]
        self.query_one("#engine-counts", Figures).set_rows(rows[:1] if self.short else rows)
        caption, any_requests = latency_caption(engine)

        def pair(key: str) -> tuple[str, str]:
            if engine is not None and engine.metrics is not None and not any_requests:
                return "-", "-"  # figures, but no request in the window: no percentile, not an old one
            # The bucket each percentile falls in: a figure inside it would be finer than the data.
            if engine is None:
                return NA, NA
            return (
                engine.percentile_text(f"p50_{key}_s", NA, compact=True),
                engine.percentile_text(f"p99_{key}_s", NA, compact=True),
            )

        table = [
            ("TTFT", *pair("ttft")),
            ("end-to-end", *pair("e2e")),
            ("per token", *pair("tpot")),
            ("inter-token", *pair("itl")),
            ("queue", *pair("queue")),
        ]
        self.query_one("#engine-latency", LatencyTable).set_rows(caption, table[:2] if self.short else table)
        self.query_one("#engine-ranks", RankRows).show(engine, self.short)
