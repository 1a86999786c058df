"""The console's batch-window strip and keys, driven by a recorded status stream with a gateway
window in it, checking exactly what the console asks the daemon to do."""

from __future__ import annotations

import asyncio
import copy

from llmconsole.console.tui import Command
from llmconsole.console.tui.views.status import ControllerView, EngineView
from llmconsole.console.tui.widgets.panels import WindowStrip
from tests.support.recorded import make_recorded_app, replay, status_frame, stream_frames
from tests.support.waiting import pilot_wait


def _controller(window=12, frozen=False, max_window=32):
    trace = [
        {"at_s": 1000.0 + i, "window": w, "measured_ms": m, "target_ms": 400.0, "action": "step"}
        for i, (w, m) in enumerate(((8, 150.0), (10, 220.0), (12, 300.0), (window, 380.0)))
    ]
    return {
        "window": window,
        "frozen": frozen,
        "signal": "ttft",
        "target_ms": 400.0,
        "min_window": 4,
        "max_window": max_window,
        "in_flight": 3,
        "queued": 1,
        "trace": trace,
    }


def _app_with(controller):
    status = copy.deepcopy(stream_frames()[-1]["status"])
    for e in status["engines"]:
        e["gateway_url"] = f"http://127.0.0.1:8780/g/{e['name']}"
        e["window"] = controller["window"]
        e["controller"] = controller
    return make_recorded_app([status_frame(status)])


def _panel_text(app) -> str:
    return str(app.screen.query_one(WindowStrip).render())


def test_panel_shows_window_history_measured_and_target():
    async def go():
        app, _ = _app_with(_controller())
        async with app.run_test(size=(120, 40)) as pilot:
            await replay(pilot)
            text = _panel_text(app)
            assert "batch window  12 in 4-32" in text
            assert "p99 TTFT 380 ms / target 400 ms" in text and "in flight 3, queued 1" in text
            assert "controlled (step)" in text  # its history is the PID trace chart's (test_tui_charts.py)

    asyncio.run(go())


def test_freeze_key_and_window_keys_send_window_commands():
    async def go():
        app, source = _app_with(_controller())
        async with app.run_test(size=(120, 40)) as pilot:
            await replay(pilot)
            name = app.screen.selected_name
            await pilot.press("f")
            await pilot.press("plus")
            await pilot.press("minus")
            await pilot_wait(pilot, lambda: len(source.commands) == 3, "three window commands")
            assert source.commands == [
                Command("window", name, {"freeze": True}),
                Command("window", name, {"set": 13}),
                Command("window", name, {"set": 11}),
            ]

    asyncio.run(go())


def test_window_keys_stop_at_the_bounds_and_wait_for_a_gateway():
    async def go():
        app, source = _app_with(_controller(window=32, frozen=True))
        async with app.run_test(size=(120, 40)) as pilot:
            await replay(pilot)
            assert "frozen (f resumes it)" in _panel_text(app)
            assert app.check_action("nudge_window", (1,)) is None  # already at the max
            assert app.check_action("nudge_window", (-1,)) is True
            await pilot.press("f")
            await pilot_wait(pilot, lambda: source.commands, "the unfreeze command")
            assert source.commands == [Command("window", app.screen.selected_name, {"freeze": False})]
        status = copy.deepcopy(stream_frames()[-1]["status"])
        for e in status["engines"]:
            e["gateway_url"], e["window"], e["controller"] = None, None, None
        app, source = make_recorded_app([status_frame(status)])  # a daemon with no gateway
        async with app.run_test(size=(120, 40)) as pilot:
            await replay(pilot)
            assert "none: the engine is not behind the gateway" in _panel_text(app)
            assert app.check_action("toggle_window_freeze", ()) is None

    asyncio.run(go())


def test_odd_controller_values_become_none_not_errors():
    assert ControllerView.parse("nonsense") is None
    c = ControllerView.parse(
        {"window": "x", "trace": [None, {"at_s": 1.0, "window": 5, "measured_ms": "?"}, {"window": 6}]}
    )
    assert c.window is None and c.windows == (5,) and c.measured_now_ms is None  # a step without a time: left out
    assert EngineView.parse({"name": "e", "controller": 3}).controller is None
