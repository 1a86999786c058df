"""What a new user met in their first hour with the console, driven as they drove it."""

from __future__ import annotations

import asyncio

from textual import events
from textual.widgets import Input, Static

from llmconsole.console.tui.screens.form import EngineFormScreen
from llmconsole.console.tui.views.status import LogChunk
from llmconsole.console.tui.widgets.footer import ConsoleFooter
from llmconsole.console.tui.widgets.log_view import FollowLog, LogTail
from tests.support.recorded import replay
from tests.support.waiting import pilot_wait


def run(coro):
    return asyncio.run(coro)


def _burst(app, keys: list[str]) -> None:
    """Keys as a fast typist sends them: all queued at once, none waiting for the one before."""
    for key in keys:
        char = key if len(key) == 1 else None
        app._driver.send_message(events.Key(key, char))


def test_fields_typed_fast_with_tabs_land_each_in_its_own_field(recorded_app):
    async def go():
        app, _ = recorded_app()
        async with app.run_test(size=(120, 40)) as pilot:
            await replay(pilot)
            await pilot.press("n")
            await pilot_wait(pilot, lambda: isinstance(app.screen, EngineFormScreen), "the form")
            form = app.screen
            typed = [*"small", "tab", *".models/small", "tab", "tab", *"4", "tab", *"1024", "tab", "tab", *"128MiB"]
            _burst(app, typed)
            fields = ("name", "model", "served_model_name", "max_num_seqs", "max_model_len", "kv_cache_memory_bytes")

            def values() -> dict[str, str]:
                return {f: form.query_one(f"#f-{f}", Input).value for f in fields}

            chars = sum(len(k) == 1 for k in typed)
            await pilot_wait(pilot, lambda: sum(map(len, values().values())) == chars, "every key typed")
            assert values() == {
                "name": "small",
                "model": ".models/small",
                "served_model_name": "",
                "max_num_seqs": "4",
                "max_model_len": "1024",
                "kv_cache_memory_bytes": "128MiB",
            }

    run(go())


async def _open_log(pilot):
    app = pilot.app
    await replay(pilot)
    await pilot.press("l")
    await pilot_wait(pilot, lambda: getattr(app.screen, "log_offset", None) is not None, "the log screen's first chunk")
    await pilot.pause(0.2)  # the widths of long lines are measured in a worker: a scrollbar may appear
    return app.screen, app.screen.query_one(FollowLog)


def _more_lines(screen, lines: list[str]) -> None:
    """The next poll's chunk, as the daemon answers it: what was appended since the last offset."""
    data = "".join(line + "\n" for line in lines).encode()
    offset = screen.log_offset
    screen.take_logs(LogChunk(screen.engine_name, data.decode(), offset + len(data), offset + len(data), offset))


def _at_end(log: FollowLog) -> bool:
    return log.max_scroll_y > 0 and log.scroll_y == log.max_scroll_y


def test_the_log_screen_opens_at_the_tail_and_follows_until_the_user_scrolls_up(recorded_app):
    async def go():
        app, _ = recorded_app()
        async with app.run_test(size=(80, 24)) as pilot:
            screen, log = await _open_log(pilot)
            assert _at_end(log), (log.scroll_y, log.max_scroll_y)
            await pilot.press("v")  # every line: the view is rebuilt, and still follows
            await pilot.pause(0.2)
            assert _at_end(log), (log.scroll_y, log.max_scroll_y)
            _more_lines(screen, [f"INFO new line {i}" for i in range(5)])
            await pilot.pause(0.2)
            assert _at_end(log) and log.lines[-1] == "INFO new line 4"
            log.focus()
            await pilot.press("pageup")  # the user reads further up: the view stays where they put it
            await pilot.pause(0.1)
            held = log.scroll_y
            assert held < log.max_scroll_y
            _more_lines(screen, ["INFO while reading"])
            await pilot.pause(0.2)
            assert log.scroll_y == held
            await pilot.press("end")  # back at the end: following again
            await pilot.pause(0.1)
            _more_lines(screen, ["INFO after end"])
            await pilot.pause(0.2)
            assert _at_end(log) and log.lines[-1] == "INFO after end"

    run(go())


def test_a_search_belongs_to_its_pane_and_esc_clears_it_before_leaving(recorded_app):
    async def go():
        app, _ = recorded_app()
        async with app.run_test(size=(120, 40)) as pilot:
            await replay(pilot)
            dash = app.screen
            await pilot.press("slash", *"throughput", "enter")
            await pilot.pause(0.1)
            assert dash.log_search == "throughput"
            assert "search 'throughput'" in str(dash.query_one(LogTail).border_title)
            screen, _ = await _open_log(pilot)
            assert screen.log_search == "" and "search" not in str(screen.query_one("#logs-title", Static).render())
            await pilot.press("slash", *"Avg", "enter")
            await pilot.pause(0.1)
            assert "search 'Avg' (esc clears)" in str(screen.query_one("#logs-title", Static).render())
            await pilot.press("escape")  # clears the search, as the title promised
            await pilot.pause(0.1)
            assert app.screen is screen and screen.log_search == ""
            await pilot.press("escape")  # and now leaves
            await pilot.pause(0.1)
            assert app.screen is dash and dash.log_search == "throughput"  # the pane's own, untouched
            await pilot.press("escape")  # on the dashboard Esc clears its search
            await pilot.pause(0.1)
            assert dash.log_search == "" and "search" not in str(dash.query_one(LogTail).border_title)

    run(go())


def test_keys_an_input_takes_are_not_offered_while_it_has_the_focus(recorded_app):
    async def go():
        app, _ = recorded_app()
        async with app.run_test(size=(120, 40)) as pilot:
            await replay(pilot)
            footer = app.screen.query_one(ConsoleFooter)
            assert "Window" in footer.render().plain
            await pilot.press("slash")
            await pilot.pause(0.2)
            shown = str(footer.render())
            assert "Window" not in shown and "Stop" not in shown, shown

    run(go())


def test_g_is_offered_only_where_one_chart_shows_at_a_time(recorded_app):
    async def go():
        app, _ = recorded_app()
        async with app.run_test(size=(120, 48)) as pilot:  # room for both charts
            await replay(pilot)
            assert app.check_action("switch_chart", ()) is False
            assert "Chart" not in app.screen.query_one(ConsoleFooter).render().plain
        app, _ = recorded_app()
        async with app.run_test(size=(80, 24)) as pilot:  # one chart at a time: g switches
            await replay(pilot)
            assert app.check_action("switch_chart", ()) is True

    run(go())


def test_help_says_it_scrolls_where_it_is_taller_than_the_screen(recorded_app):
    async def go():
        app, _ = recorded_app()
        async with app.run_test(size=(80, 24)) as pilot:
            await replay(pilot)
            await pilot.press("question_mark")
            await pilot.pause(0.2)
            box = app.screen.query_one("#help-box")
            assert box.max_scroll_y > 0 and "scroll" in str(box.border_subtitle)

    run(go())
