"""The console's tune screen without an engine: its form makes the CLI's request and settings,
bad input starts nothing, what the daemon sends back reads as the tuner's own values, a given sequence of the tuner's events shows trial i of the budget, the best so
far and the trial table (and as a fixed picture), and the winner is applied only after a
question, only when the CLI's --apply would apply it. The real path, on a real engine, is in
test_tui_runs_engine.py."""

from __future__ import annotations

import argparse
import asyncio

import pytest
from textual.widgets import DataTable, Input, Static

from llmconsole.console.commands.tune import build, register
from llmconsole.console.commands.tune import tune_request as cli_tune_request
from llmconsole.console.tui.screens.confirm import ConfirmScreen
from llmconsole.console.tui.screens.run_base import RunFinished, RunProgressed
from llmconsole.console.tui.screens.tune import PriorTrials, TunePrepared, TuneScreen
from llmconsole.console.tui.views.tune import (
    TUNE_DEFAULTS,
    TuneView,
    best_text,
    can_apply,
    current_text,
    fold_tune,
    headline,
    outcome_lines,
    snapshot_facts,
    trial_rows,
    tune_request,
    tune_settings,
)
from llmconsole.engine.sweep.runner import EngineTarget
from llmconsole.engine.tune import ranges
from llmconsole.engine.tune.select import Remeasured
from llmconsole.engine.tune.space import Budget, TrialOutcome
from llmconsole.engine.tune.tuner import TuneProgress, TuneResult
from tests.support.recorded import make_recorded_app, replay, run_record, stage_recorded, stream_frames
from tests.support.waiting import pilot_wait

SPEC = stream_frames()[-1]["status"]["engines"][0]["spec"]  # t1 as the daemon reports it
FACTS = snapshot_facts(SPEC)
FORM = dict(TUNE_DEFAULTS, knobs="max_num_seqs=2,4,8", budget="4")


def test_the_form_makes_the_settings_the_cli_makes(monkeypatch):
    # Both read the host's free memory for the KV sizes' ceiling: the same reading for both.
    monkeypatch.setattr(ranges, "_free_memory_bytes", lambda: 8 << 30)
    s, space = tune_settings("t1", FACTS, FORM)
    parser = argparse.ArgumentParser(prog="llmconsole")
    register(parser.add_subparsers())
    ns = parser.parse_args(
        [
            "tune",
            "--engine",
            "t1",
            "--workload",
            "concurrency=2",
            "--slo",
            "p99_e2e_ms=10000",
            "--budget",
            "4",
            "--knob",
            "max_num_seqs=2,4,8",
            "--input-len",
            "64",
            "--output-len",
            "32",
            "--num-requests",
            "24",
            "--top-k",
            "2",
            "--repeats",
            "2",
        ]
    )
    assert tune_request("t1", FORM) == cli_tune_request(ns)  # what travels to the daemon
    assert (s, space) == build(ns, FACTS)
    assert s.budget == Budget(trials=4) and [k.name for k in s.knobs] == ["max_num_seqs"]
    assert space.describe()[0].startswith("max_num_seqs=2,4,8")
    # No knobs given: the CLI's default space around the running config.
    default, _ = tune_settings("t1", FACTS, TUNE_DEFAULTS)
    assert {k.name for k in default.knobs} >= {"max_num_seqs", "max_num_batched_tokens"}


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("slo", "", "give an SLO"),
        ("budget", "soon", "not a number of trials"),
        ("knobs", "model=x", "cannot be tuned"),
        ("workload", "concurrency=1,2", "one load level"),
        ("top_k", "-1", "at least 1"),
        ("output_len", "uniform:9-3", "output length"),
    ],
)
def test_bad_form_values_say_what_is_wrong(field, value, message):
    with pytest.raises(ValueError, match=message):
        tune_settings("t1", FACTS, dict(FORM, **{field: value}))


def _outcome(n: int, seqs: int, state: str, good: float | None, req: int = 24, why: str | None = None):
    return TrialOutcome(n, {"max_num_seqs": seqs}, state, good, req, why)


PRIOR = PriorTrials((_outcome(0, 4, "complete", 2.5), _outcome(1, 2, "interrupted", None, 0)))
EVENTS = [
    PriorTrials(PRIOR),
    TuneProgress("resumed", None, {}, "resuming study t1-abc: 2 trials so far, 1 interrupted", 2.5, 0.2),
    TuneProgress("trial_started", 2, {"max_num_seqs": 8}, "restarting the engine on this config", 2.5, 0.5),
    TuneProgress("trial_finished", 2, {"max_num_seqs": 8}, "complete", 3.1, 40.0, _outcome(2, 8, "complete", 3.1)),
    TuneProgress("trial_started", 3, {"max_num_seqs": 2}, "restarting the engine on this config", 3.1, 40.2),
    TuneProgress(
        "trial_finished",
        3,
        {"max_num_seqs": 2},
        "pruned: stopped early",
        3.1,
        60.0,
        _outcome(3, 2, "pruned", 1.1, 8, "stopped early after 8 requests: 1.10 req/s, below the top 1/3"),
    ),
    TuneProgress("trial_started", 4, {"max_num_seqs": 16}, "restarting the engine on this config", 3.1, 61.0),
]


def _view(events=EVENTS) -> TuneView:
    from llmconsole.console.tui.views.tune import with_prior

    v = TuneView(budget=Budget(trials=4))
    for ev in events:
        v = with_prior(v, ev) if isinstance(ev, PriorTrials) else fold_tune(v, ev)
    return v


def test_events_fold_into_trial_i_of_the_budget_the_best_and_the_table():
    v = _view()
    # Trials 0, 2, 3 count; 1 was interrupted (retried); 4 is under way.
    assert headline(v) == "trial 4 of 4 · 1 min 01 s elapsed · ~20 s left of the search"  # 3 done in 61 s
    assert headline(v, since_s=10) == "trial 4 of 4 · 1 min 11 s elapsed · ~24 s left of the search"
    assert best_text(v) == "best so far: trial 2 · max_num_seqs=8 · 3.10 req/s goodput"
    assert current_text(v) == "trial 4 (max_num_seqs=16): restarting the engine on this config"
    rows = trial_rows(v)
    assert [r[:3] for r in rows] == [
        ["0", "complete", "2.50"],
        ["1", "interrupted", "-"],
        ["2*", "complete", "3.10"],
        ["3", "pruned", "1.10"],
        ["4", "running", "-"],
    ]
    assert rows[3][5].startswith("stopped early after 8 requests")
    v = fold_tune(v, TuneProgress("remeasuring", 2, {"max_num_seqs": 8}, "re-measuring x2", 3.1, 90.0))
    assert headline(v) == "re-measuring candidate trial 2 · 1 min 30 s elapsed"
    minutes = TuneView(budget=Budget(minutes=10))
    assert headline(fold_tune(minutes, EVENTS[2])) == "trial 1 · 0 s of 10 min 00 s"
    assert best_text(TuneView(budget=Budget(trials=3))) == "best so far: no feasible trial yet"


def _result(status: str = "done", restored: bool = True, winner: bool = True) -> TuneResult:
    trials = tuple(_view().trials[:4]) + (_outcome(4, 16, "infeasible", None, 0, "did not start: no room"),)
    rm = (Remeasured(2, {"max_num_seqs": 8}, (3.0, 3.2)), Remeasured(0, {"max_num_seqs": 4}, (2.4, 2.6)))
    return TuneResult(
        "t1-abc",
        trials,
        rm if winner else (),
        rm[0] if winner else None,
        EngineTarget("u", "tiny", "m", "89f45120175e", {}),
        restored,
        None if restored else "RuntimeError: no",
        status,
        3,
    )


def test_what_the_daemon_sends_reads_as_the_tuners_own_values():
    for r in (_result(), _result("cancelled", restored=False, winner=False)):
        back = TuneResult.from_json(r.to_json())
        assert outcome_lines(back) == outcome_lines(r) and can_apply(back) == can_apply(r)
        assert back.trials == r.trials and back.winner == r.winner
    for ev in EVENTS:
        if isinstance(ev, TuneProgress):
            assert TuneProgress.from_json(ev.to_json()) == ev


def test_the_end_and_when_the_winner_may_be_applied():
    lines = outcome_lines(_result())
    assert lines[0] == "study t1-abc: done (5 trials, 3 this run)"
    assert "re-measured trial 2: mean 3.10 req/s ±3% over 2 runs · max_num_seqs=8" in lines
    assert "recommended: max_num_seqs=8 (3.10 req/s goodput)" in lines
    assert can_apply(_result())
    assert not can_apply(_result("cancelled")) and not can_apply(_result(restored=False))
    assert not can_apply(_result(winner=False)) and not can_apply(None)
    assert "cancelled; the same settings resume it" in outcome_lines(_result("cancelled"))[0]
    assert "NOT restored" in outcome_lines(_result(restored=False))[-1]


async def _open(pilot) -> TuneScreen:
    await replay(pilot)
    await pilot.press("T")
    await pilot_wait(pilot, lambda: isinstance(pilot.app.screen, TuneScreen), "the tune screen")
    await pilot.pause(0.05)
    return pilot.app.screen


async def stage(pilot, events, finished=None) -> TuneScreen:
    screen = await _open(pilot)
    screen.clock = lambda: 1000.0
    settings, space = tune_settings("t1", FACTS, FORM)
    screen.show_run(TunePrepared(tune_request("t1", FORM), settings, tuple(space.describe())))
    screen.running = finished is None
    for ev in events:
        screen.post_message(RunProgressed(ev))
    if finished is not None:
        screen.post_message(RunFinished(finished, None))
    await pilot.pause(0.1)
    return screen


def test_bad_input_shows_a_message_and_starts_nothing():
    async def go():
        app, source = make_recorded_app()
        async with app.run_test(size=(100, 30)) as pilot:
            screen = await _open(pilot)
            screen.query_one("#run-slo", Input).value = ""
            await pilot.press("ctrl+s")
            await pilot.pause(0.05)
            assert "give an SLO" in str(screen.query_one("#run-error", Static).render())
            assert app.screen is screen and not screen.started and source.commands == []

    asyncio.run(go())


def test_the_screen_shows_progress_and_applies_only_after_asking():
    async def go():
        app, source = make_recorded_app()
        async with app.run_test(size=(120, 40)) as pilot:
            screen = await stage(pilot, EVENTS)
            status = str(screen.query_one("#run-status", Static).render())
            assert "trial 4 of 4" in status and "best so far: trial 2 · max_num_seqs=8 · 3.10" in status
            t = screen.query_one("#run-table", DataTable)
            assert t.row_count == 5 and str(t.get_row_at(2)[0]) == "2*"
            assert screen.check_action("apply_winner", ()) is False  # nothing to apply while it runs
            screen.running = False
            screen.post_message(RunFinished(_result("cancelled"), None))
            await pilot.pause(0.1)
            await pilot.press("a")
            await pilot.pause(0.05)
            assert app.screen is screen  # a cancelled study's best is not applied, as with the CLI
            screen.post_message(RunFinished(_result(), None))
            await pilot.pause(0.1)
            notes = str(screen.query_one("#run-notes", Static).render())
            assert "recommended: max_num_seqs=8" in notes and "a: apply" in notes
            assert t.row_count == 5 and "infeasible" in str(t.get_row_at(4)[1])
            await pilot.press("a")
            await pilot_wait(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question")
            assert "guarded apply" in app.screen.question and "max_num_seqs=8" in app.screen.question
            await pilot.press("n")
            await pilot.pause(0.05)
            assert app.screen is screen and not screen.applying and screen.applied is None
            assert source.commands == []

    asyncio.run(go())


SIZES = [pytest.param((80, 24), id="80x24"), pytest.param((200, 60), id="200x60")]


@pytest.mark.parametrize("size", SIZES)
def test_snapshot_tune_under_way(snap_compare, size):
    """A tune a real engine ran (tests/fixtures/tui/tune_run.json), half-way: the trials so far,
    charted against their number and against a knob, with the best so far."""
    app, _ = make_recorded_app()
    half = len(run_record("tune")["events"]) // 2

    async def run_before(pilot) -> None:
        await stage_recorded(pilot, "tune", upto=half)

    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", [*SIZES, pytest.param((160, 50), id="160x50")])
def test_snapshot_tune_done(snap_compare, size):
    """At 160 columns the table sits beside the chart in half the screen: it keeps its main
    columns (shorter headers, the least needed left out) rather than losing its right-hand ones."""
    app, _ = make_recorded_app()

    async def run_before(pilot) -> None:
        await stage_recorded(pilot, "tune")

    assert snap_compare(app, terminal_size=size, run_before=run_before)


def test_the_recorded_tune_reads_back_and_charts_every_trial():
    async def go():
        app, _ = make_recorded_app()
        async with app.run_test(size=(200, 60)) as pilot:
            screen = await stage_recorded(pilot, "tune")
            trials = screen.result.trials
            assert trials and screen.result.status == "done"
            spec = screen.query_one("#trials-chart").plot.spec
            marked = sum(len(s.x) for s in spec.series if s.label != "best so far")
            assert marked == sum(1 for t in trials if t.state not in ("running", "interrupted"))
            knob = screen.query_one("#knob-chart").plot.spec.title
            await pilot.press("o")
            await pilot.pause(0.1)
            assert screen.query_one("#knob-chart").plot.spec.title != knob  # the next knob

    asyncio.run(go())


def test_a_study_with_no_feasible_trial_says_each_reason_on_screen_and_in_the_cli():
    """Every trial refused at start used to end on "no config met the constraints", the reasons
    only in the study's journal."""
    import dataclasses

    from llmconsole.console.commands.tune import render
    from llmconsole.console.tui.views.tune import with_prior

    why = "did not start: KV cache too small for one request of max_model_len 2048"
    bad = tuple(_outcome(n, 2**n, "infeasible", None, 0, why) for n in range(3))
    r = dataclasses.replace(_result(winner=False), trials=bad)
    lines = outcome_lines(r)
    assert "no config met the constraints" in lines and f"  trials 0, 1, 2: {why}" in lines
    assert any(line.startswith("what to change: give knobs values the engine can start with") for line in lines)
    out = render(r)
    assert f"trials 0, 1, 2: {why}" in out and "what to change:" in out
    # While it runs, the status line says why the last trial was out.
    v = with_prior(TuneView(budget=Budget(trials=6)), bad)
    assert best_text(v) == f"best so far: no feasible trial yet · trial 2 infeasible: {why}"
