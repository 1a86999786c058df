"""Driving the console with keys and checking exactly what it asked the daemon to do."""

from __future__ import annotations

import asyncio
import io
from typing import Any

import pytest
from rich.console import Console

from llmconsole.console.client import DaemonError
from llmconsole.console.tui import Command, RecordedSource, make_app
from llmconsole.console.tui.keys import KEYS
from llmconsole.console.tui.screens.confirm import ConfirmScreen
from llmconsole.console.tui.screens.dashboard import DashboardScreen
from llmconsole.console.tui.screens.engine import DetailScreen, LogsScreen
from llmconsole.console.tui.screens.form import EngineFormScreen
from llmconsole.console.tui.screens.help import HelpScreen
from tests.support.recorded import history_frame, lost_frame, replay, status_frame, stream_frames
from tests.support.waiting import pilot_wait


def run(coro):
    return asyncio.run(coro)


def _help_text(app) -> str:
    console = Console(width=120, record=True, file=io.StringIO())
    console.print(app.screen._tables())
    return console.export_text()


def test_stop_asks_first_and_sends_only_after_yes(recorded_app):
    async def go():
        app, source = recorded_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await replay(pilot)
            await pilot.press("k")
            await pilot.pause()
            assert isinstance(app.screen, ConfirmScreen)
            assert source.commands == []  # asking is not doing
            await pilot.press("y")
            await pilot_wait(pilot, lambda: source.commands, "the stop command")
            assert source.commands == [Command("stop", "t1")]
            assert isinstance(app.screen, DashboardScreen)

    run(go())


@pytest.mark.parametrize("answer", ["n", "escape"])
def test_cancelling_a_stop_sends_nothing(answer, recorded_app):
    async def go():
        app, source = recorded_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await replay(pilot)
            await pilot.press("k")
            await pilot.pause()
            assert isinstance(app.screen, ConfirmScreen)
            await pilot.press(answer)
            await pilot.pause(0.1)
            assert isinstance(app.screen, DashboardScreen)
            assert source.commands == []

    run(go())


def test_enter_on_the_question_is_no(recorded_app):
    async def go():
        app, source = recorded_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await replay(pilot)
            await pilot.press("k", "enter")
            await pilot.pause(0.1)
            assert source.commands == []

    run(go())


def test_restart_and_stop_all_ask_first(recorded_app):
    async def go():
        app, source = recorded_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await replay(pilot)
            await pilot.press("r")
            await pilot.pause()
            assert isinstance(app.screen, ConfirmScreen) and source.commands == []
            await pilot.press("y")
            await pilot_wait(pilot, lambda: len(source.commands) == 1, "restart")
            await pilot.press("K")
            await pilot.pause()
            assert isinstance(app.screen, ConfirmScreen)
            assert "t1" in app.screen.question and "bad" not in app.screen.question
            await pilot.press("y")
            await pilot_wait(pilot, lambda: len(source.commands) == 2, "stop all")
            assert source.commands == [Command("restart", "t1"), Command("stop_all")]

    run(go())


def test_start_is_only_for_a_stopped_or_failed_engine(recorded_app):
    async def go():
        app, source = recorded_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await replay(pilot)
            assert app.check_action("start_engine", ()) is None  # t1 is ready: greyed out
            assert app.check_action("stop_engine", ()) is True
            await pilot.press("s")
            await pilot.pause(0.1)
            assert source.commands == []
            await pilot.press("down")  # "bad", which failed to start
            await pilot.pause()
            assert app.check_action("start_engine", ()) is True
            assert app.check_action("stop_engine", ()) is None
            await pilot.press("s")
            await pilot_wait(pilot, lambda: source.commands, "start")
            assert source.commands == [Command("start", "bad")]

    run(go())


def test_a_remapped_key_works_and_the_old_one_does_not(recorded_app):
    async def go():
        app, source = recorded_app(keymap={"stop": "x"})
        async with app.run_test(size=(80, 24)) as pilot:
            await replay(pilot)
            await pilot.press("k")
            await pilot.pause()
            assert isinstance(app.screen, DashboardScreen)
            await pilot.press("x")
            await pilot.pause()
            assert isinstance(app.screen, ConfirmScreen)
            await pilot.press("y")
            await pilot_wait(pilot, lambda: source.commands, "stop")
            assert source.commands == [Command("stop", "t1")]
            footer_keys = {b.binding.id: key for key, b in app.screen.active_bindings.items() if b.binding.id}
            assert footer_keys["stop"] == "x"
            await pilot.press("question_mark")
            await pilot.pause()
            stop_row = next(line for line in _help_text(app).splitlines() if " stop " in f" {line} ")
            assert stop_row.split()[0] == "x"

    run(go())


def test_quit_sends_no_stop_and_says_the_engines_keep_serving(recorded_app):
    async def go():
        app, source = recorded_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await replay(pilot)
            await pilot.press("q")
            await pilot.pause()
        assert source.commands == []
        # Clients belong on the gateway (its window, its hold over restarts); the direct URL is beside it.
        assert app.return_value == (
            "engines keep serving: t1 (ready, clients use http://127.0.0.1:33971/g/t1/v1; direct http://127.0.0.1:48325)"
        )
        assert "bad" not in app.return_value

    run(go())


def test_keys_open_their_screens_and_escape_comes_back(recorded_app):
    async def go():
        app, _ = recorded_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await replay(pilot)
            for key, screen in (("d", DetailScreen), ("l", LogsScreen), ("question_mark", HelpScreen)):
                await pilot.press(key)
                await pilot.pause()
                assert isinstance(app.screen, screen), key
                await pilot.press("escape")
                await pilot.pause()
                assert isinstance(app.screen, DashboardScreen), key
            await pilot.press("enter")  # Enter on a row opens its detail
            await pilot.pause()
            assert isinstance(app.screen, DetailScreen) and app.screen.engine_name == "t1"

    run(go())


def test_new_engine_form_sends_the_validated_spec_and_refuses_a_bad_one(recorded_app):
    async def go():
        app, source = recorded_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await replay(pilot)
            await pilot.press("n")
            await pilot.pause()
            form = app.screen
            assert isinstance(form, EngineFormScreen)
            await pilot.press(*"t2", "tab", *"Qwen/Qwen3-0.6B", "tab", "tab", "0")
            await pilot.pause()
            assert "greater than or equal to 1" in str(form.query_one("#e-max_num_seqs").render())
            await pilot.press("ctrl+s")
            await pilot.pause()
            assert source.commands == [] and app.screen is form
            await pilot.press("backspace", "8", "tab", *"512")
            await pilot.press("ctrl+s")
            await pilot_wait(pilot, lambda: source.commands, "start")
        assert source.commands == [
            Command("start", "t2", {"model": "Qwen/Qwen3-0.6B", "max_num_seqs": 8, "max_model_len": 512})
        ]

    run(go())


def test_the_daemon_going_away_shows_a_banner_and_coming_back_clears_it(frames, recorded_app):
    async def go():
        back = frames[-1]
        app, source = recorded_app([lost_frame(), lost_frame(), back], retry_s=0.01)
        seen: list[str] = []
        async with app.run_test(size=(80, 24), message_hook=lambda m: seen.append(type(m).__name__)) as pilot:
            await pilot_wait(pilot, lambda: app.lost_reason is not None, "the banner")
            banner = app.screen.query_one("#banner")
            assert banner.has_class("-lost")
            assert app.check_action("stop_engine", ()) is None  # nothing to send it to
            await pilot_wait(pilot, lambda: app.lost_reason is None and source.exhausted, "the reconnect")
            await pilot.pause(0.05)
            assert not banner.has_class("-lost")
        assert "DaemonLost" in seen and "StatusPolled" in seen
        assert seen.index("DaemonLost") > seen.index("StatusPolled")

    run(go())


class _Broken(RecordedSource):
    """A source that fails in every way a daemon can: errors, garbage, refusals."""

    def __init__(self):
        super().__init__(stream_frames()[-1:])
        self.calls = 0

    def poll(self) -> dict[str, Any]:
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("socket said something strange")
        if self.calls == 2:
            return {"engines": "not a list", "host": 7}
        if self.calls == 3:
            return {"engines": [{"name": "odd", "state": 3, "metrics": {"running": "many"}, "spec": None}]}
        return super().poll()

    def send(self, command):
        raise DaemonError(409, "engine t1 is stopping", ["wait for it"])


def test_nothing_the_daemon_does_crashes_the_console():
    async def go():
        source = _Broken()
        app = make_app(source, refresh_s=0.01, retry_s=0.01, cursor_blink=False)
        async with app.run_test(size=(80, 24)) as pilot:
            await pilot_wait(pilot, lambda: source.calls >= 5, "five polls")
            await pilot.pause(0.05)
            messages = [n.message for n in app._notifications]
            assert any("socket said something strange" in m for m in messages)
            assert app.snapshot.engine("t1") is not None
            app.hold_polls = True
            await pilot.press("k", "y")
            await pilot_wait(pilot, lambda: any("is stopping" in n.message for n in app._notifications), "refusal")
            assert app.is_running

    run(go())


def test_missing_values_show_na():
    async def go():
        bare = {"engines": [{"name": "e1", "state": "starting"}]}
        app = make_app(RecordedSource([status_frame(bare)]), refresh_s=0.01, cursor_blink=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await replay(pilot)
            text = str(app.screen.query_one("#engine-latency").render())
            assert text.count("N/A") == 10
            assert "N/A" in str(app.screen.query_one("#engine-counts").render())

    run(go())


def test_every_action_is_in_the_palette_and_the_help(recorded_app):
    async def go():
        app, _ = recorded_app()
        async with app.run_test(size=(120, 40)) as pilot:
            await replay(pilot)
            titles = [c.title for c in app.get_system_commands(app.screen)]
            for spec in KEYS:
                if spec.palette:
                    assert spec.long_name in titles, spec.id
            await pilot.press("question_mark")
            await pilot.pause()
            help_text = _help_text(app)
            for spec in KEYS:
                assert spec.id in help_text, spec.id

    run(go())


def test_a_palette_action_that_is_not_allowed_says_why(recorded_app):
    async def go():
        app, source = recorded_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await replay(pilot)
            await app._from_palette("start_engine", "Start engine")
            await pilot.pause()
            assert any("engine t1 is ready" in n.message for n in app._notifications)
            assert source.commands == []

    run(go())


def test_history_lists_versions_and_rollback_asks_then_sends_the_chosen_version(frames, recorded_app):
    async def go():
        current = frames[-1]["status"]["engines"][0]["config_id"]
        app, source = recorded_app([history_frame(current)])
        async with app.run_test(size=(120, 40)) as pilot:
            await replay(pilot)
            await pilot.press("h")
            await pilot_wait(pilot, lambda: getattr(app.screen, "versions", ()), "the history to load")
            table = app.screen.query_one("#history-table")
            assert table.row_count == 2
            assert "max_num_seqs: 16→8" in str(table.get_row_at(0)[-1])
            # The version in use is selected first: rolling back to it is not offered.
            assert app.check_action("rollback_selected", ()) is None
            await pilot.press("b")
            await pilot.pause()
            assert not isinstance(app.screen, ConfirmScreen) and source.commands == []
            await pilot.press("down")
            await pilot.pause()
            assert app.check_action("rollback_selected", ()) is True
            await pilot.press("b")
            await pilot.pause()
            assert isinstance(app.screen, ConfirmScreen) and source.commands == []
            await pilot.press("y")
            await pilot_wait(pilot, lambda: source.commands, "the rollback command")
            assert source.commands == [Command("rollback", "t1", {"to": "0123456789ab"})]

    run(go())
