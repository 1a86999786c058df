"""The console's default tune, as a new user meets it: `T` on the demo engine, the prefilled form
submitted as it is, the question answered, the result awaited.

The engine runs with the demo's flags (`make run`: max_num_seqs 16, max_model_len 2,048, a
256 MiB KV cache, eager) on the tiny model rather than the demo's `small` one, to keep the
restarts short: the ranges come from the same code path (engine/tune/ranges.py: the planner's
KV arithmetic on the model's config.json and the running spec), and for both models the default
knobs, their ranges' shape and trial 0 are the same (tests/unit/test_tune_defaults.py checks
the `small` model's derivation without an engine). Every trial restarts the engine, so this test
takes minutes: it runs the form's own budget of 6 trials.
"""

from __future__ import annotations

import asyncio

import pytest
from textual.widgets import DataTable

from llmconsole.console.tui import DaemonSource, make_app
from llmconsole.console.tui.screens.tune import TuneScreen
from llmconsole.console.tui.views.run import params_text
from llmconsole.paths import resolve
from tests.support.daemon import daemon_home
from tests.support.engine_flags import tiny_engine_flags
from tests.tui.test_tui_runs_engine import _confirm, _text, _wait

pytestmark = pytest.mark.engine

DEMO_FLAGS = tiny_engine_flags(max_num_seqs=16, max_model_len=2048, kv_cache_bytes=268_435_456, single_process=True)


# The form's budget is 6 trials and 2 x 2 re-measurements, each a restart: past the suite's 900 s
# on a loaded two-core host (the tiny model took 752 s; the `small` one over 900 s).
@pytest.mark.timeout(2400)
def test_the_prefilled_tune_finds_a_feasible_config_and_trial_0_is_what_the_question_said(tiny_model):
    with daemon_home("llmc-dt-") as c:
        c("engine", "start", "demo", "--model", str(tiny_model), *DEMO_FLAGS)

        async def go():
            source = DaemonSource(resolve({"LLMCONSOLE_HOME": str(c.home)}))
            app = make_app(source, refresh_s=0.5, cursor_blink=False)
            try:
                async with app.run_test(size=(160, 50)) as pilot:
                    await _wait(
                        pilot,
                        lambda: (
                            app.snapshot is not None
                            and app.snapshot.engine("demo") is not None
                            and app.snapshot.engine("demo").state == "ready"
                        ),
                        "the engine in the console",
                    )
                    await pilot.press("T")
                    await _wait(pilot, lambda: isinstance(app.screen, TuneScreen), "the tune screen")
                    screen = app.screen
                    await pilot.press("ctrl+s")  # the prefilled form, as it is
                    await _confirm(pilot, "the question")
                    question = app.screen.question
                    await pilot.press("y")
                    await _wait(pilot, lambda: screen.started, "the tune")
                    await _wait(pilot, lambda: not screen.running, "the tune's end", 2400)
                    table = screen.query_one(DataTable)
                    rows = [[str(cell) for cell in table.get_row_at(i)] for i in range(table.row_count)]
                    return screen.result, question, rows, _text(screen, "#run-notes")
            finally:
                source.close()

        result, question, rows, notes = asyncio.run(go())
    assert result is not None and result.status == "done" and result.restored, notes
    # What the question said trial 0 would run is what it ran.
    first = result.trials[0]
    assert f"Trial 0 runs {params_text(first.params)}." in question
    assert "max_num_seqs" in question and "max_num_batched_tokens" in question
    assert "kv_cache_memory_bytes" not in question  # the default moves only the knobs the form names
    # A feasible best, shown.
    assert result.winner is not None, notes
    won = next(t for t in result.trials if t.number == result.winner.number)
    assert won.state == "complete" and won.goodput_req_s
    assert f"recommended: {params_text(result.winner.params)}" in notes
    assert any(r[1] == "complete" for r in rows) and len(rows) == len(result.trials)
