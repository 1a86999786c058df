"""The dashboard as an operator meets it, from the recorded stream of a real daemon and engine:
every key in the footer, the batch window's state in full, what f, + and - each say, the quiet
log and its search, the charts' range, the latency window, and progress while an engine starts
or switches mode."""

from __future__ import annotations

import asyncio
import re

import pytest

from llmconsole.console.tui.keys import KEYS
from llmconsole.console.tui.sources.daemon import Command
from llmconsole.console.tui.widgets.chart import ChartBox, Plot
from llmconsole.console.tui.widgets.footer import ConsoleFooter
from llmconsole.console.tui.widgets.log_view import LogTail
from llmconsole.console.tui.widgets.panels import WindowStrip
from tests.support.recorded import make_recorded_app, replay, start_frames, stream_frames
from tests.support.waiting import pilot_wait


def run(coro):
    return asyncio.run(coro)


def text(widget) -> str:
    return str(widget.render())


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (200, 60)])
def test_the_footer_shows_every_key_that_works_now(size):
    async def go():
        app, _ = make_recorded_app()
        async with app.run_test(size=size) as pilot:
            await replay(pilot)
            footer = text(app.screen.query_one(ConsoleFooter))
            for spec in KEYS:
                if "app" not in spec.contexts or not spec.show:
                    continue
                live = app.check_action(spec.action.split("(")[0], ())
                display = spec.key_display or spec.key
                if live is True or (live is None and size[0] >= 100):
                    assert re.search(rf"(^|\s|/){re.escape(display)}(/\S+)? {re.escape(spec.description)}", footer), (
                        spec.id,
                        footer,
                    )
            assert len(footer.splitlines()) <= 3

    run(go())


def test_the_window_strip_says_frozen_or_controlled_in_full_at_any_width():
    async def go():
        frozen = stream_frames()[-1]
        status = frozen["status"]
        t1 = next(e for e in status["engines"] if e["name"] == "t1")
        extra = {
            "status": dict(status, engines=[dict(t1, controller=dict(t1["controller"], frozen=True))]),
            "logs": frozen["logs"],
        }
        for size in ((80, 24), (160, 40)):
            app, _ = make_recorded_app([extra])
            async with app.run_test(size=size) as pilot:
                await replay(pilot)
                strip = text(app.screen.query_one(WindowStrip))
                assert "frozen (f resumes it)" in strip, strip
                assert re.search(r"batch window  \d+ in 4-32", strip) and "target 800 ms" in strip
                assert all(len(line) <= size[0] for line in strip.splitlines())

    run(go())


def test_f_plus_and_minus_each_say_what_they_did():
    async def go():
        last = stream_frames()[-1]
        status = last["status"]
        mid = [
            dict(e, controller=dict(e["controller"], window=6)) if e["name"] == "t1" else e for e in status["engines"]
        ]  # a window with room both ways (the recording ends at its floor)
        app, source = make_recorded_app([{"status": dict(status, engines=mid), "logs": last["logs"]}])
        said: list[str] = []
        async with app.run_test(size=(120, 40)) as pilot:
            await replay(pilot)
            app.notify = lambda message, **kw: said.append(message)  # what the toasts say
            c = app.snapshot.engine("t1").controller
            for key in ("f", "plus", "minus"):
                expected = len(said) + 2  # "sent", then what came of it
                await pilot.press(key)
                await pilot_wait(pilot, lambda n=expected: len(said) >= n, f"{key}'s answer")
        assert source.commands == [
            Command("window", "t1", {"freeze": True}),
            Command("window", "t1", {"set": c.window + 1}),
            Command("window", "t1", {"set": max(c.min_window, c.window - 1)}),
        ]
        assert said[:2] == [
            "window t1: freeze the controller: sent",
            "window t1: controller frozen (+/- set it by hand, f resumes)",
        ]
        assert said[2:4] == [
            f"window t1: set to {c.window + 1} by hand: sent",
            f"window t1: set to {c.window + 1} by hand; the controller is frozen (f resumes it)",
        ]
        assert len(set(said)) == len(said)  # no two alike; the recording answers {"accepted": true} alike

    run(go())


def test_the_log_is_quiet_by_default_v_shows_all_and_slash_searches():
    async def go():
        app, _ = make_recorded_app()
        async with app.run_test(size=(120, 40)) as pilot:
            await replay(pilot)
            tail = app.screen.query_one(LogTail)
            quiet = text(tail)
            assert "GET /metrics" not in quiet and "GET /health" not in quiet and "POST /v1/completions" not in quiet
            assert re.search(r"quiet: \d+ request/poll line\(s\) hidden \(v shows them\)", tail.border_title)
            await pilot.press("v")
            await pilot.pause(0.1)
            assert "POST /v1/completions" in text(tail) and "full log" in tail.border_title
            await pilot.press("slash")
            await pilot.pause(0.05)
            for ch in "completions":
                await pilot.press(ch)
            await pilot.pause(0.1)
            lines = text(tail).splitlines()
            assert lines and all("completions" in line for line in lines)
            assert app.snapshot.engine("t1") and app.check_action("stop_engine", ()) is True  # typing was not keys
            await pilot.press("escape")
            await pilot.pause(0.1)
            assert app.screen.log_search == "" and "GET /health" in text(tail)

    run(go())


def test_t_changes_the_charts_span_and_the_charts_have_axes_units_and_legends():
    async def go():
        app, _ = make_recorded_app()
        async with app.run_test(size=(120, 40)) as pilot:
            await replay(pilot)
            boxes = list(app.screen.query(ChartBox))
            assert [b.plot.spec.title for b in boxes] == [
                "PID trace · last 5 min · controlled",
                "KV cache, queue, tok/s · last 5 min",
            ]
            drawn = "\n".join(str(b.plot.render()) for b in boxes)
            assert "now" in drawn and "-5m" in drawn and "req" in drawn and "tok/s" in drawn
            legend = "\n".join(text(b.query_one(".chart-legend")) for b in boxes)
            assert "window (req)" in legend and "target (ms)" in legend and "KV used (%)" in legend
            await pilot.press("t")
            await pilot.pause(0.2)
            assert all(b.plot.spec.title.endswith("last 15 min") or "last 15 min" in b.plot.spec.title for b in boxes)
            assert "-15m" in str(boxes[0].plot.render())

    run(go())


def test_charts_are_built_only_when_what_they_show_changes():
    async def go():
        app, _ = make_recorded_app()
        async with app.run_test(size=(120, 40)) as pilot:
            await replay(pilot)
            plots = list(app.screen.query(Plot))
            before = [p.builds for p in plots]
            for _ in range(3):  # the last frame again: nothing new to draw
                app.screen.show_state(app)
                await pilot.pause(0.05)
            assert [p.builds for p in plots] == before

    run(go())


def test_the_latency_table_says_its_window_and_an_idle_engine_shows_no_old_p99():
    async def go():
        last = stream_frames()[-1]
        status = last["status"]
        idle = [
            dict(e, metrics=dict(e["metrics"], requests_in_window=None, p99_ttft_s=2.47)) if e["name"] == "t1" else e
            for e in status["engines"]
        ]
        app, _ = make_recorded_app([{"status": dict(status, engines=idle), "logs": last["logs"]}])
        async with app.run_test(size=(120, 40)) as pilot:
            await replay(pilot)
            table = text(app.screen.query_one("#engine-latency"))
            assert table.startswith("60 s · no req") and "2470" not in table and "2,470" not in table
        app, _ = make_recorded_app()
        async with app.run_test(size=(120, 40)) as pilot:
            await replay(pilot)
            table = text(app.screen.query_one("#engine-latency"))
            assert re.match(r"60 s · \d+ req", table) and re.search(r"TTFT\s+[\d.]+ ms\s+[\d.]+ ms", table)

    run(go())


def test_labels_never_touch_their_values():
    async def go():
        app, _ = make_recorded_app()
        for size in ((80, 24), (200, 60)):
            async with app.run_test(size=size) as pilot:
                await replay(pilot)
                figures = text(app.screen.query_one("#engine-counts"))
                for label in ("running", "waiting", "gen tok/s"):
                    assert re.search(rf"{re.escape(label)}  +\S", figures), figures
                strip = text(app.screen.query_one(WindowStrip))
                assert re.search(r"batch window  +\d", strip)
            app, _ = make_recorded_app()

    run(go())


def test_a_starting_engine_shows_its_phase_elapsed_time_and_eta():
    async def go():
        app, _ = make_recorded_app(start_frames())
        async with app.run_test(size=(120, 40)) as pilot:
            await replay(pilot)
            title = text(app.screen.query_one("#engine-title"))
            last = next(e for e in start_frames()[-1]["status"]["engines"] if e["name"] == "t1")["startup"]
            assert "t1  ·  starting  ·" in title and f"{last['phase']} {last['step'] + 1}/9" in title
            assert re.search(r"\d+ s elapsed · (~.* left|longer than last time)", title)
            assert "█" in title or "░" in title

    run(go())


def test_a_mode_switch_shows_progress_until_the_daemon_answers():
    async def go():
        app, source = make_recorded_app()
        async with app.run_test(size=(120, 40)) as pilot:
            await replay(pilot)
            source.send = lambda command: (_ for _ in ()).throw(TimeoutError("still switching"))  # no answer yet
            app._switching.clear()
            from llmconsole.console.tui.app import _Switching

            app._switching["t1"] = _Switching("balanced", 990.0, 45.0)  # asked 10 s ago (the clock says 1000)
            app.screen.show_state(app)
            await pilot.pause(0.05)
            title = text(app.screen.query_one("#engine-title"))
            assert "mode → balanced" in title and "draining its requests · 10 s elapsed · ~35 s left" in title

    run(go())


@pytest.mark.parametrize("size", [(80, 24), (200, 60)])
def test_every_line_of_the_figures_and_the_latency_table_shows(size):
    async def go():
        app, _ = make_recorded_app()
        async with app.run_test(size=size) as pilot:
            await replay(pilot)
            for sel in ("#engine-latency", "#engine-counts", "#engine-title"):
                w = app.screen.query_one(sel)
                assert w.content_size.height >= len(text(w).splitlines()), (sel, text(w))
            assert re.search(r"TTFT\s+[\d.]+ ms\s+[\d.]+ ms", text(app.screen.query_one("#engine-latency")))

    run(go())
