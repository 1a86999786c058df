"""The console's mode menu: `m` opens it on the selected engine, a choice becomes one command."""

from __future__ import annotations

import asyncio

import pytest

from llmconsole.console.tui import Command
from llmconsole.console.tui.keys import check_keymap
from llmconsole.console.tui.screens.dashboard import DashboardScreen
from llmconsole.console.tui.screens.mode import ModeScreen
from tests.test_tui_support import recorded_app, replay


async def _wait(pilot, cond, what: str, tries: int = 300) -> None:
    for _ in range(tries):
        if cond():
            return
        await pilot.pause(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def test_mode_keys_do_not_clash():
    assert check_keymap({}) == {}


@pytest.mark.parametrize("keys,mode", [(("b",), "balanced"), (("a",), "aggressive"), (("u",), "auto"),
                                       (("down", "enter"), "balanced")])
def test_a_choice_sends_one_mode_command(keys, mode):
    async def go():
        app, source = recorded_app()
        async with app.run_test(size=(100, 30)) as pilot:
            await replay(pilot)
            await pilot.press("m")
            await pilot.pause()
            assert isinstance(app.screen, ModeScreen) and app.screen.engine == "t1"
            await pilot.press(*keys)
            await _wait(pilot, lambda: source.commands, "the mode command")
            assert source.commands == [Command("mode", "t1", {"mode": mode})]
            assert isinstance(app.screen, DashboardScreen)
    asyncio.run(go())


def test_escape_leaves_the_mode_as_it_was():
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
