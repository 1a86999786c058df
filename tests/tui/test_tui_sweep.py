"""The console's sweep screen without an engine: its form makes the CLI's request and plan, bad
input starts nothing, a given sequence of the runner's events shows as it should (and as a fixed
picture), and a sweep the daemon cannot start says why. The run itself is the daemon's: the real
path, on a real engine, with the console quit half-way, is in test_tui_runs_engine.py and
test_tui_tmux.py."""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

import pytest
from textual.widgets import DataTable, Input, Static

from llmconsole.console.commands.sweep import build_plan
from llmconsole.console.commands.sweep import sweep_request as cli_sweep_request
from llmconsole.console.tui.screens.confirm import ConfirmScreen
from llmconsole.console.tui.screens.dashboard import DashboardScreen
from llmconsole.console.tui.screens.run_base import NO_DAEMON, RunFinished, RunProgressed
from llmconsole.console.tui.screens.sweep import SweepScreen
from llmconsole.console.tui.views.run import fmt_duration, split_items, ticked, whole_number
from llmconsole.console.tui.views.sweep import (
    SWEEP_DEFAULTS,
    SweepView,
    confirm_question,
    current_text,
    fold_sweep,
    headline,
    restarts_engine,
    sweep_plan,
    sweep_request,
    table,
)
from llmconsole.engine.sweep.plan import SweepProgress
from llmconsole.engine.sweep.runner import EngineTarget, SweepResult
from tests.support.recorded import make_recorded_app, replay, run_record, stage_recorded
from tests.support.sweep_points import FORM, P1, P2, P3, P4
from tests.support.waiting import pilot_wait

SPEC = {"max_num_seqs": 4, "max_model_len": 512}


# --- plain functions ---------------------------------------------------------------------------


def test_durations_and_ticking():
    assert [fmt_duration(s) for s in (None, 0, 44.6, 65, 3599, 3720)] == [
        "N/A",
        "0 s",
        "45 s",
        "1 min 05 s",
        "59 min 59 s",
        "1 h 02 min",
    ]
    assert ticked(10.0, 30.0, 4.0) == (14.0, 26.0)
    assert ticked(10.0, 3.0, 4.0) == (14.0, 0.0)  # a point that overruns its estimate: 0 left, not -1
    assert ticked(10.0, None, 4.0) == (14.0, None)
    assert split_items(" max_num_seqs=4,8;max_model_len=512 ") == ["max_num_seqs=4,8", "max_model_len=512"]
    with pytest.raises(ValueError, match="repeats must be at least 1"):
        whole_number("0", "repeats")
    with pytest.raises(ValueError, match="must be a whole number"):
        whole_number("two", "repeats")


def test_the_form_makes_the_request_and_plan_the_cli_makes():
    from llmconsole.console.commands.sweep import register

    parser = argparse.ArgumentParser(prog="llmconsole")
    register(parser.add_subparsers())
    ns = parser.parse_args(
        [
            "sweep",
            "--engine",
            "t1",
            "--grid",
            "max_num_seqs=4,8",
            "--load",
            "concurrency=1,2",
            "--slo",
            "p99_e2e_ms=5000",
            "--repeats",
            "2",
            "--num-requests",
            "16",
            "--input-len",
            "64",
            "--output-len",
            "32",
            "--out",
            ".",
        ]
    )
    plan = sweep_plan("t1", FORM)
    assert sweep_request("t1", FORM) == cli_sweep_request(ns)  # what travels to the daemon
    assert plan == build_plan(ns)
    assert plan.total_points == 4 and plan.grid == {"max_num_seqs": (4, 8)}
    # The defaults alone are a load-only sweep: nothing restarts.
    light = sweep_plan("t1", SWEEP_DEFAULTS)
    assert light.grid == {} and not restarts_engine(light, SPEC) and "No restart" in confirm_question("t1", light, SPEC)
    assert restarts_engine(plan, SPEC) and "RESTARTS" in confirm_question("t1", plan, SPEC)


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("grid", "max_num_sheep=1,2", "not an engine spec field"),
        ("load", "concurrency=0", "positive whole number"),
        ("load", "", "at least one load level"),
        ("slo", "p99_bogus_ms=3", "SLO target"),
        ("repeats", "0", "at least 1"),
        ("input_len", "lots", "input"),
    ],
)
def test_bad_form_values_say_what_is_wrong(field, value, message):
    with pytest.raises(ValueError, match=message):
        sweep_plan("t1", dict(SWEEP_DEFAULTS, **{field: value}))


EVENTS = [
    SweepProgress(
        "point_started", 1, 4, {"max_num_seqs": 4, "concurrency": 1.0}, 0.4, None, "measuring concurrency=1 x2"
    ),
    SweepProgress("point_finished", 1, 4, P1.params, 9.8, 29.4, "ok", P1),
    SweepProgress(
        "point_started", 2, 4, {"max_num_seqs": 4, "concurrency": 2.0}, 9.9, 29.4, "measuring concurrency=2 x2"
    ),
    SweepProgress("point_finished", 2, 4, P2.params, 20.0, 20.0, "ok", P2),
    SweepProgress(
        "engine_restarting", 3, 4, {"max_num_seqs": 8}, 20.1, 20.0, "restarting the engine on max_num_seqs=8"
    ),
    SweepProgress(
        "point_started", 3, 4, {"max_num_seqs": 8, "concurrency": 1.0}, 61.0, 20.0, "measuring concurrency=1 x2"
    ),
]
TAIL = [
    SweepProgress("point_finished", 3, 4, P3.params, 70.0, 23.3, "ok", P3),
    SweepProgress(
        "point_started", 4, 4, {"max_num_seqs": 8, "concurrency": 2.0}, 70.1, 23.3, "measuring concurrency=2 x2"
    ),
    SweepProgress("point_finished", 4, 4, P4.params, 80.0, 0.0, "ok", P4),
    SweepProgress("engine_restarting", 4, 4, {}, 80.1, 0.0, "restoring the original config"),
    SweepProgress("restored", 4, 4, {}, 120.0, 0.0, "restored config cfg4"),
]


def test_events_fold_into_the_view():
    v = SweepView(total=4)
    assert headline(v) == "4 point(s) · 0 done · 0 s elapsed · time left after the first point"
    for ev in EVENTS:
        v = fold_sweep(v, ev)
    assert (v.index, v.done, v.params) == (3, 2, {"max_num_seqs": 8, "concurrency": 1.0})
    assert headline(v) == "point 3 of 4 · 2 done · 1 min 01 s elapsed · ~20 s left"
    assert headline(v, since_s=5) == "point 3 of 4 · 2 done · 1 min 06 s elapsed · ~15 s left"
    assert current_text(v) == "max_num_seqs=8, concurrency=1: measuring concurrency=1 x2"
    v = fold_sweep(v, TAIL[0])
    v = fold_sweep(fold_sweep(fold_sweep(v, TAIL[1]), TAIL[2]), TAIL[3])
    assert v.restoring and "restoring the original config" in headline(v)
    v = fold_sweep(v, TAIL[4])
    assert not v.restoring and v.done == 4 and [p.index for p in v.points] == [1, 2, 3, 4]


def test_the_table_is_the_clis_table():
    from llmconsole.engine.sweep.report import render_table

    plan = sweep_plan("t1", FORM)
    headers, rows, notes = table(plan, (P1, P2))
    assert headers[:3] == ("params", "throughput (req/s)", "P99 latency (ms)")
    assert rows[0][:3] == ["max_num_seqs=4, concurrency=1", "2.00", "500"]
    assert rows[1][:3] == ["max_num_seqs=4, concurrency=2", "3.00 (+50%)", "650 (+30%)"]
    assert (
        headers[3] == "memory (GiB)" and rows[1][3] == "0.84"
    )  # 900 MB is 0.84 GiB and rows[1][4] == "N/A [1]" and "NVML" in notes[0]
    whole = SweepResult(plan, (P1, P2), EngineTarget("", "", "", "", {}), "done", 0, 1, True)
    printed = render_table(whole).splitlines()[2:4]
    assert [[c.strip() for c in line.split(" | ")] for line in printed] == rows


# --- the screen --------------------------------------------------------------------------------


async def _open(pilot) -> SweepScreen:
    await replay(pilot)
    await pilot.press("S")
    await pilot_wait(pilot, lambda: isinstance(pilot.app.screen, SweepScreen), "the sweep screen")
    await pilot.pause(0.05)
    return pilot.app.screen


def _set(screen: SweepScreen, **values: str) -> None:
    for name, value in values.items():
        screen.query_one(f"#run-{name}", Input).value = value


def test_bad_input_shows_a_message_and_starts_nothing():
    async def go():
        app, source = make_recorded_app()
        async with app.run_test(size=(100, 30)) as pilot:
            screen = await _open(pilot)
            assert screen.engine_name == "t1" and screen.read_form() == SWEEP_DEFAULTS
            _set(screen, grid="max_num_sheep=1,2")
            await pilot.press("ctrl+s")
            await pilot.pause(0.05)
            error = str(screen.query_one("#run-error", Static).render())
            assert "not an engine spec field" in error
            assert app.screen is screen and not screen.started and source.commands == []
            # Fixed, but this console replays a recording: it says so and starts nothing either.
            _set(screen, grid="")
            await pilot.press("ctrl+s")
            await pilot.pause(0.05)
            assert str(screen.query_one("#run-error", Static).render()) == NO_DAEMON
            assert app.screen is screen and not screen.started and screen.running is False
            await pilot.press("escape")
            await pilot.pause(0.05)
            assert isinstance(app.screen, DashboardScreen)

    asyncio.run(go())


def test_a_sweep_asks_first_and_one_the_daemon_cannot_start_says_why(tmp_path):
    from llmconsole.console.client import DaemonClient
    from llmconsole.paths import Paths

    async def go():
        app, source = make_recorded_app()
        async with app.run_test(size=(100, 30)) as pilot:
            screen = await _open(pilot)
            # No daemon answers there: the start must fail cleanly.
            screen.dial = lambda timeout_s: DaemonClient(Paths(tmp_path, tmp_path), timeout_s=timeout_s)
            _set(screen, grid="max_num_seqs=4,8")
            await pilot.press("ctrl+s")
            await pilot_wait(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
            assert "RESTARTS the engine" in app.screen.question
            await pilot.press("n")
            await pilot.pause(0.05)
            assert app.screen is screen and not screen.started
            await pilot.press("ctrl+s")
            await pilot_wait(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
            await pilot.press("y")
            await pilot_wait(pilot, lambda: screen.started, "the run")
            await pilot_wait(pilot, lambda: not screen.running, "the run's end")
            notes = str(screen.query_one("#run-notes", Static).render())
            assert "the sweep did not start" in notes and "control.sock" in notes  # no daemon: said, not raised
            assert screen.run_id is None and source.commands == []

    asyncio.run(go())


def test_a_sweep_under_way_is_the_daemons_leaving_or_quitting_stops_nothing():
    async def go():
        app, source = make_recorded_app()
        async with app.run_test(size=(100, 30)) as pilot:
            screen = await stage(pilot, EVENTS)
            assert screen.running and app.screen.check_action("cancel_run", ()) is True
            await pilot.press("c")
            await pilot.pause(0.05)
            assert screen.cancel_requested and app.screen.check_action("cancel_run", ()) is None
            assert "cancelling" in str(screen.query_one("#run-status", Static).render())
            await pilot.press("escape")  # the run is the daemon's: the screen goes, the run does not
            await pilot.pause(0.05)
            assert isinstance(app.screen, DashboardScreen) and source.commands == []
            assert screen.farewell_note == "the sweep of t1 runs on in the daemon; S on the engine shows it"

    asyncio.run(go())


async def stage(pilot, events, finished=None) -> SweepScreen:
    """The sweep screen showing a fixed sequence of events (and the end, if given)."""
    screen = await _open(pilot)
    screen.clock = lambda: 1000.0
    screen.show_run(sweep_plan("t1", FORM))
    screen.running = finished is None
    for ev in events:
        screen.post_message(RunProgressed(ev))
    if finished is not None:
        screen.post_message(RunFinished(finished, None))
    await pilot.pause(0.1)
    return screen


def _result(out: Path):
    from llmconsole.engine.sweep.report import write_results

    plan = sweep_plan("t1", FORM)
    result = SweepResult(
        plan,
        (P1, P2, P3, P4),
        EngineTarget("u", "tiny", "m", "89f45120175e", {}),
        "done",
        time.time() - 120,
        time.time(),
        True,
    )
    return result, write_results(result, out)


def test_what_the_daemon_sends_reads_as_the_runners_own_values(tmp_path):
    from llmconsole.engine.sweep.report import analyse, picks_text, result_from_json, table_rows, to_json

    result, _ = _result(tmp_path / "out")
    back = result_from_json(to_json(result), result.plan)
    assert back.points == result.points and table_rows(back) == table_rows(result)
    assert picks_text(back, analyse(back)) == picks_text(result, analyse(result))
    assert (back.status, back.restored, back.original.config_id) == ("done", True, "89f45120175e")
    for ev in EVENTS + TAIL:
        assert SweepProgress.from_json(ev.to_json()) == ev


def test_progress_and_the_end_show_in_the_screen(tmp_path):
    async def go():
        app, _ = make_recorded_app()
        async with app.run_test(size=(120, 40)) as pilot:
            screen = await stage(pilot, EVENTS)
            status = str(screen.query_one("#run-status", Static).render())
            assert "point 3 of 4 · 2 done · 1 min 01 s elapsed · ~20 s left" in status
            assert "max_num_seqs=8, concurrency=1: measuring" in status
            t = screen.query_one("#run-table", DataTable)
            assert t.row_count == 2 and str(t.get_row_at(1)[1]) == "3.00 (+50%)"
            screen.post_message(RunFinished(_result(tmp_path / "out"), None))
            await pilot.pause(0.1)
            assert t.row_count == 4
            notes = str(screen.query_one("#run-notes", Static).render())
            assert "best under the SLO" in notes and "knee" in notes
            assert f"written to {tmp_path / 'out'}: results.json, results.csv, report.md, tradeoff.svg" in notes
            assert "sweep done" in str(screen.query_one("#run-status", Static).render())

    asyncio.run(go())


SIZES = [pytest.param((80, 24), id="80x24"), pytest.param((200, 60), id="200x60")]


@pytest.mark.parametrize("size", SIZES)
def test_snapshot_sweep_under_way(snap_compare, size):
    """A sweep a real engine ran (tests/fixtures/tui/sweep_run.json), half-way: the points so far on
    the chart and in the table, and the progress bar."""
    app, _ = make_recorded_app()
    half = len(run_record("sweep")["events"]) // 2

    async def run_before(pilot) -> None:
        await stage_recorded(pilot, "sweep", upto=half)

    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", [*SIZES, pytest.param((160, 50), id="160x50")])
def test_snapshot_sweep_done(snap_compare, size):
    """At 160 columns the table sits beside the chart in half the screen: it keeps its main
    columns (shorter headers, the least needed left out) rather than losing its right-hand ones."""
    app, _ = make_recorded_app()

    async def run_before(pilot) -> None:
        await stage_recorded(pilot, "sweep")

    assert snap_compare(app, terminal_size=size, run_before=run_before)


def test_the_recorded_sweep_charts_every_measured_point_with_front_knee_and_slo():
    async def go():
        app, _ = make_recorded_app()
        async with app.run_test(size=(200, 60)) as pilot:
            screen = await stage_recorded(pilot, "sweep")
            result = screen.result
            spec = screen.query_one("#sweep-chart").plot.spec
            by = {s.label: s for s in spec.series}
            measured = [p for p in result.points if p.measured]
            assert len(by["points (req/s at p99 ms)"].x) == len(measured) >= 3
            # The SLO (8,000 ms) lies far past the points (155-3,355 ms): drawn at the edge, labelled.
            assert "SLO p99 e2e 8,000 ms →" in by and any(label.startswith("knee: ") for label in by)
            assert spec.x_lim[1] < 8000
            status = str(screen.query_one("#run-status", Static).render())
            assert status.startswith("████████████████ sweep done")

    asyncio.run(go())


def test_snapshot_sweep_form(snap_compare):
    app, _ = make_recorded_app()

    async def run_before(pilot) -> None:
        screen = await _open(pilot)
        _set(screen, repeats="0")
        await pilot.press("ctrl+s")
        # The picture is taken once the error shows, however long a loaded host takes to get there.
        await pilot_wait(
            pilot, lambda: "at least 1" in str(screen.query_one("#run-error", Static).render()), "the form's error"
        )
        await pilot.pause(0.05)

    assert snap_compare(app, terminal_size=(100, 30), run_before=run_before)


def test_sweep_and_tune_are_for_a_ready_engine():
    async def go():
        app, _ = make_recorded_app()
        async with app.run_test(size=(100, 30)) as pilot:
            await replay(pilot)
            assert app.check_action("sweep_engine", ()) is True and app.check_action("tune_engine", ()) is True
            await pilot.press("down")  # the failed engine
            await pilot.pause(0.05)
            assert app.check_action("sweep_engine", ()) is None and app.check_action("tune_engine", ()) is None
            await pilot.press("S", "T")
            await pilot.pause(0.05)
            assert isinstance(app.screen, DashboardScreen)

    asyncio.run(go())
