"""A data-parallel engine's ranks under the engine's merged figures: one row each (running,
waiting, KV use), and the rank that lags its peers marked with why (engine/metrics/ranks.py says
when one does). Hidden for an engine of one rank, so the panel of every other engine is as it was.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import Static

from llmconsole.console.tui.views.status import EngineView, fmt_count, fmt_pct
from llmconsole.wire.status import RankMetrics

LAG_STYLE = "bold dark_orange"
MAX_ROWS = 8  # past this many ranks the rows that lag come first, the rest are counted


def engine_ranks(engine: EngineView | None) -> tuple[RankMetrics, ...]:
    """A data-parallel engine's ranks (two or more), in rank order; none for one rank."""
    ranks = engine.metrics.ranks if engine is not None and engine.metrics is not None else []
    return tuple(ranks) if len(ranks) > 1 else ()


def _row(r: RankMetrics) -> Text:
    style = LAG_STYLE if r.lagging else ""
    line = Text(f"rank {r.rank}".ljust(10), style=f"bold {style}".strip())
    line.append(f"{fmt_count(r.running):>5}{fmt_count(r.waiting):>6}{fmt_pct(r.kv_cache_usage):>6}", style=style)
    if r.lagging:
        line.append(f"  lags: {r.note or 'far from its peers'}", style=style)
    return line


def rank_text(engine: EngineView | None, short: bool = False) -> Text | None:
    """The rows, or None when the engine has no ranks to show. `short`: one line, the lagging
    ranks named (the panel keeps three rows on a short terminal)."""
    ranks = engine_ranks(engine)
    if not ranks:
        return None
    lagging = [r for r in ranks if r.lagging]
    if short:
        out = Text(f"{len(ranks)} data-parallel ranks", style="bold", no_wrap=True, overflow="ellipsis")
        for r in lagging:
            out.append(f"  ·  rank {r.rank} lags: {r.note or 'far from its peers'}", style=LAG_STYLE)
        return out
    shown = sorted(ranks, key=lambda r: not r.lagging)[:MAX_ROWS] if len(ranks) > MAX_ROWS else list(ranks)
    out = Text("ranks".ljust(10) + "  run  wait    KV", style="bold", no_wrap=True, overflow="ellipsis")
    for r in shown:
        out.append("\n")
        out.append_text(_row(r))
    if len(ranks) > len(shown):
        out.append(f"\n… {len(ranks) - len(shown)} more ranks, none lagging", style="dim")
    return out


class RankRows(Static):
    DEFAULT_CSS = """
    RankRows { height: auto; padding: 0 1; display: none; }
    """

    def __init__(self, **kw: Any) -> None:
        super().__init__("", **kw)
        self._shown: Text | None = None

    def show(self, engine: EngineView | None, short: bool = False) -> None:
        text = rank_text(engine, short)
        if text == self._shown:
            return
        self._shown = text
        self.display = text is not None
        if text is not None:
            self.update(text)
