"""The console's mode menu: `m` opens it on the selected engine, a choice becomes one command."""

from __future__ import annotations

import asyncio

import pytest

from llmconsole.console.tui import Command
from llmconsole.console.tui.keys import check_keymap
from llmconsole.console.tui.screens.dashboard import DashboardScreen
from llmconsole.console.tui.screens.mode import ModeScreen
from tests.support.recorded import replay
from tests.support.waiting import pilot_wait


def test_mode_keys_do_not_clash():
    assert check_keymap({}) == {}


@pytest.mark.parametrize(
    "keys,mode", [(("b",), "balanced"), (("a",), "aggressive"), (("u",), "auto"), (("down", "enter"), "balanced")]
)
def test_a_choice_sends_one_mode_command(keys, mode, recorded_app):
    async def go():
        app, source = recorded_app()
        async with app.run_test(size=(100, 30)) as pilot:
            await replay(pilot)
            await pilot.press("m")
            await pilot.pause()
            assert isinstance(app.screen, ModeScreen) and app.screen.engine == "t1"
            await pilot.press(*keys)
            await pilot_wait(pilot, lambda: source.commands, "the mode command")
            assert source.commands == [Command("mode", "t1", {"mode": mode})]
            assert isinstance(app.screen, DashboardScreen)

    asyncio.run(go())


def test_escape_leaves_the_mode_as_it_was(recorded_app):
    async def go():
        app, source = recorded_app()
        async with app.run_test(size=(100, 30)) as pilot:
            await replay(pilot)
            await pilot.press("m")
            await pilot.pause()
            assert isinstance(app.screen, ModeScreen)
            await pilot.press("escape")
            await pilot.pause(0.1)
            assert isinstance(app.screen, DashboardScreen) and source.commands == []

    asyncio.run(go())


def _alerts_frame() -> dict:
    from tests.support.recorded import stream_frames

    frame = dict(stream_frames()[-1])
    frame["alerts"] = {
        "active": [{"rule": "LlmconsoleKvCacheHigh", "engine": "t1", "state": "firing", "for_s": 12.0}],
        "alerts": [],
        "responses": [
            {
                "id": 7,
                "at": 1.7e9,
                "engine": "t1",
                "kind": "response:window",
                "outcome": "applied",
                "detail": {"trigger": "LlmconsoleKvCacheHigh", "alert_id": 3},
            },
            {
                "id": 8,
                "at": 1.7e9 + 1,
                "engine": "t1",
                "kind": "response:kv_dtype",
                "outcome": "refused",
                "detail": {"trigger": "LlmconsoleKvCacheHigh", "alert_id": 3, "error": "no AVX-512"},
            },
        ],
        "settings": {"responses": {"LlmconsoleKvCacheHigh": ["window", "kv_dtype"]}},
    }
    return frame


def test_alerts_screen_undoes_a_response_after_asking(recorded_app):
    from llmconsole.console.tui.screens.alerts import AlertsScreen
    from llmconsole.console.tui.screens.confirm import ConfirmScreen

    async def go():
        app, source = recorded_app([_alerts_frame()])
        async with app.run_test(size=(120, 40)) as pilot:
            await replay(pilot)
            await pilot.press("A")
            await pilot.pause()
            screen = app.screen
            assert isinstance(screen, AlertsScreen)
            await pilot_wait(pilot, lambda: screen.responses, "the responses")
            assert [r["id"] for r in screen.responses] == [8, 7]  # newest first
            await pilot.press("u")  # the refused one cannot be undone
            await pilot.pause()
            assert app.screen is screen and source.commands == []
            await pilot.press("down", "u")
            await pilot.pause()
            assert isinstance(app.screen, ConfirmScreen) and source.commands == []
            await pilot.press("y")
            await pilot_wait(pilot, lambda: source.commands, "the undo command")
            assert source.commands == [Command("undo", None, {"action_id": 7})]

    asyncio.run(go())
