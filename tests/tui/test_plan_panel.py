"""The planner panel in the start-engine form: it re-plans as the fields change."""

from __future__ import annotations

import asyncio

import pytest
from textual.widgets import Input

from llmconsole.console.tui.screens.form import EngineFormScreen
from llmconsole.console.tui.widgets.planner_panel import PlannerPanel, planner_lines
from llmconsole.engine.plan.validate import HostMemory
from llmconsole.engine.spec import EngineSpec
from tests.support.recorded import make_recorded_app, replay


def _text(panel: PlannerPanel) -> str:
    return str(panel.render())


@pytest.mark.needs_cpu_vllm  # the panel plans for this host's runtime; the figures are a CPU engine's
def test_panel_follows_the_form_from_no_model_to_misfit_to_fit(tiny_model):
    async def go():
        app, source = make_recorded_app()
        async with app.run_test(size=(120, 40)) as pilot:
            await replay(pilot)
            await pilot.press("n")
            await pilot.pause()
            form = app.screen
            assert isinstance(form, EngineFormScreen)
            panel = form.query_one(PlannerPanel)
            assert "fill in a valid config" in _text(panel)
            for field, value in (
                ("name", "p1"),
                ("model", str(tiny_model)),
                ("max_model_len", "2048"),
                ("kv_cache_memory_bytes", "100000"),
            ):
                form.query_one(f"#f-{field}", Input).value = value
                await pilot.pause()
            text = _text(panel)
            assert "DOES NOT FIT" in text and "needs 1,114,112 B, has 100,000 B" in text
            assert "nearest that fits: kv_cache_memory_bytes=1,114,112" in text
            form.query_one("#f-kv_cache_memory_bytes", Input).value = "100000000"
            await pilot.pause()
            text = _text(panel)
            assert "fits: needs" in text and "(exact)" in text
            # 1,525 blocks of 128 tokens; a 2,048-token request takes 16 of them.
            assert "1,525 blocks = 195,200 tokens, 95.31 requests of 2,048" in text
            assert source.commands == []  # planning sends nothing to the daemon

    asyncio.run(go())


def test_panel_lines_for_a_hub_model_say_it_cannot_check():
    lines = planner_lines(EngineSpec(model="Qwen/Qwen3-0.6B"), HostMemory("cpu", 24 << 30))
    assert any("no local config.json" in text for _, text in lines)


def test_the_planners_text_is_never_clipped_even_at_80x24(tiny_model):
    async def go():
        app, _ = make_recorded_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await replay(pilot)
            await pilot.press("n")
            await pilot.pause()
            form = app.screen
            for field, value in (
                ("name", "p1"),
                ("model", str(tiny_model)),
                ("max_model_len", "2048"),
                ("kv_cache_memory_bytes", "100000"),
            ):
                form.query_one(f"#f-{field}", Input).value = value
                await pilot.pause()
            panel = form.query_one(PlannerPanel)
            width = panel.content_size.width
            needed = panel.get_content_height(panel.container_size, app.size, width)
            assert needed >= 6 and panel.content_size.height >= needed  # every wrapped line shows
            assert "suggest max_num_seqs" in _text(panel)

    asyncio.run(go())
