"""The console's charts as values (ChartSpec): axes, units and legends, from recorded daemon
streams and from the runner's own events; the series memory they draw from; and the other
pure parts of what the screens show (log views, notifications, time estimates, progress)."""

from __future__ import annotations

import dataclasses

import pytest

from llmconsole.console.tui import progress
from llmconsole.console.tui.charts.live import pid_chart, usage_chart
from llmconsole.console.tui.charts.runs import knob_chart, sweep_chart, tune_chart
from llmconsole.console.tui.charts.series import SeriesHistory
from llmconsole.console.tui.charts.spec import downsample, minutes_ticks, nice_max, segments
from llmconsole.console.tui.logfilter import LogView, kind
from llmconsole.console.tui.sources.daemon import Command
from llmconsole.console.tui.toasts import asked, done
from llmconsole.console.tui.views.estimate import sweep_text, tune_text
from llmconsole.console.tui.views.status import Snapshot
from llmconsole.engine.tune.space import TrialOutcome


def _history(steps=120, measured=True):
    """A minute or two of an engine through the gateway, as the daemon's status gives it."""
    h = SeriesHistory()
    for i in range(steps):
        t = 10_000.0 + i
        trace = [
            {
                "at_s": t,
                "window": 8 + (i // 30),
                "target_ms": 800.0,
                "measured_ms": (600.0 + i) if measured else None,
                "action": "step",
            }
        ]
        e = {
            "name": "t1",
            "state": "ready",
            "metrics": {
                "taken_at_s": float(i),
                "kv_cache_usage": 0.01,
                "waiting": float(i % 3),
                "generation_tok_s": 80.0 + i,
            },
            "controller": {
                "window": 8 + (i // 30),
                "frozen": False,
                "signal": "ttft",
                "target_ms": 800.0,
                "min_window": 4,
                "max_window": 32,
                "trace": trace,
                "recent_ok": 12,
                "recent_streamed": 12 if measured else 0,
            },
        }
        snap = Snapshot.parse({"daemon": {"time_s": t}, "engines": [e]})
        h.add(snap)
    return h, snap.engines[0]


# --- the dashboard's charts --------------------------------------------------------------------


def test_the_pid_trace_has_the_window_the_signal_and_the_target_on_one_time_axis():
    h, e = _history()
    spec = pid_chart(h, e, 300.0, 80)
    labels = [s.label for s in spec.series]
    assert labels == ["window (req)", "measured p99 TTFT (ms)", "target (ms)"]
    assert [s.right for s in spec.series] == [False, True, True]  # requests left, milliseconds right
    assert (spec.y_label, spec.y2_label) == ("req", "ms")
    assert spec.title == "PID trace · last 5 min · controlled"
    assert spec.x_lim == (-5.0, 0.0) and spec.x_ticks[-1] == (0.0, "now") and spec.x_ticks[0][1] == "-5m"
    window = spec.series[0]
    assert max(x for x in window.x) <= 0.0 and window.y[-1] == 11.0
    assert spec.y2_lim[1] >= 800.0 + 119  # the target and the measurements fit under the right axis


def test_a_signal_without_samples_is_said_not_drawn():
    h, e = _history(measured=False)
    spec = pid_chart(h, e, 300.0, 80)
    assert spec.series[1].label == "no TTFT samples: requests not streamed"
    assert all(v is None for v in spec.series[1].y)


def test_usage_is_on_a_fixed_percent_scale_so_one_percent_looks_like_one_percent():
    h, e = _history()
    spec = usage_chart(h, e, 900.0, 80)
    assert [s.label for s in spec.series] == ["KV used (%)", "queue (req)", "generated (tok/s)"]
    assert spec.y_lim == (0.0, 100.0) and spec.series[0].y[-1] == pytest.approx(1.0)
    assert spec.title.endswith("last 15 min") and [t for _, t in spec.x_ticks] == [
        "-15m",
        "-12m",
        "-9m",
        "-6m",
        "-3m",
        "now",
    ]


def test_an_engine_without_a_gateway_or_figures_says_so():
    spec = pid_chart(SeriesHistory(), Snapshot.parse({"engines": [{"name": "x"}]}).engines[0], 300.0, 80)
    assert not spec.has_data and "not behind the gateway" in spec.empty
    assert (
        "no samples yet"
        in usage_chart(SeriesHistory(), Snapshot.parse({"engines": [{"name": "x"}]}).engines[0], 300.0, 80).empty
    )


def test_stored_history_fills_in_where_the_console_has_no_live_point():
    h, _ = _history(steps=10)
    first_live = h.series("t1", "generation_tok_s")[0][0]
    answer = {
        "metrics": {
            "at_s": [first_live - 3, first_live - 2, first_live + 5.2, first_live + 30.0],
            "generation_tok_s": [1.0, 2.0, 999.0, 7.0],
        },
        "window": {"at_s": [first_live - 3], "window": [4.0], "target_ms": [800.0], "measured_ms": [None]},
    }
    assert h.wants_fill("t1", 300.0)
    h.fill("t1", answer, 300.0)
    t, v = h.series("t1", "generation_tok_s")
    assert v[:2] == [1.0, 2.0] and 999.0 not in v and t == sorted(t)  # a live point at that second wins
    assert v[-1] == 7.0  # after the last poll (a gap the console was not there for)
    assert h.series("t1", "window")[1][0] == 4.0
    assert not h.wants_fill("t1", 300.0) and h.wants_fill("t1", 900.0)


def test_a_p99_is_kept_as_the_top_of_its_histogram_bucket_live_and_stored():
    """vLLM's end-to-end buckets: eight requests under 300 ms have a p99 histogram_quantile puts
    at 297 ms; the charts' memory keeps 0.3 s (the p99 was at most that), never 0.297."""
    h = SeriesHistory()
    for i, (value, bounds) in enumerate([(0.297, [0.0, 0.3]), (9000.0, [7680.0, None]), (0.297, None)]):
        metrics = {"taken_at_s": float(i), "p99_e2e_s": value}
        if bounds is not None:  # the last poll: a daemon that sends no bounds
            metrics["percentile_bounds"] = {"p99_e2e_s": bounds}
        h.add(Snapshot.parse({"daemon": {"time_s": 20_000.0 + i}, "engines": [{"name": "t1", "metrics": metrics}]}))
    assert "p99_e2e_s" not in SeriesHistory().of("t1").metrics.fields
    # The bucket's top; past the last finite bound, or with no bounds, there is none: a gap.
    assert h.series("t1", "p99_e2e_upper_s")[1] == [0.3, None, None]

    stored = {
        "metrics": {
            "at_s": [19_990.0, 19_991.0],
            "p99_e2e_s": [0.297, 0.62],
            "p99_e2e_lower_s": [0.0, 0.5],
            "p99_e2e_upper_s": [0.3, 0.8],
        }
    }
    h.fill("t1", stored, 300.0)
    assert h.series("t1", "p99_e2e_upper_s")[1][:2] == [0.3, 0.8]


def test_long_spans_are_averaged_to_the_charts_width_and_gaps_stay_gaps():
    x = [i / 60 for i in range(-3600, 0)]
    y = [None if 1000 <= i < 1100 else float(i % 10) for i in range(3600)]
    xs, ys = downsample(x, y, -60.0, 0.0, 120)
    assert len(xs) == 120 and ys[0] == pytest.approx(4.5)
    assert segments([0, 1, 2, 3], [1.0, None, 2.0, 3.0]) == [([0], [1.0]), ([2, 3], [2.0, 3.0])]
    assert [t for _, t in minutes_ticks(3600, 80)] == ["-60m", "-50m", "-40m", "-30m", "-20m", "-10m", "now"]
    assert [nice_max(v) for v in (0.0, 7.2, 1107.0, 31.0)] == [1.0, 8.0, 1500.0, 40.0]


# --- the sweep's and the tune's charts ------------------------------------------------------------


def test_the_sweep_chart_from_the_runners_own_events():
    from llmconsole.console.tui.views.sweep import sweep_plan
    from tests.support.sweep_points import FORM, P1, P2, P3, P4

    plan = sweep_plan("t1", FORM)
    assert sweep_chart(plan, ()).empty == "no point measured yet"
    spec = sweep_chart(plan, (P1, P2, P3, P4))
    by = {s.label: s for s in spec.series}
    assert (spec.x_label, spec.y_label) == ("p99 end-to-end (ms)", "req/s")
    assert by["points (req/s at p99 ms)"].y == (2.0, 3.0, 2.1, 3.5)
    assert by["Pareto front"].x == (480.0, 650.0, 700.0)  # P1 is dominated by P3
    assert any(label.startswith("knee: ") for label in by)
    # The SLO (5,000 ms) lies far past the points (480-700 ms): at the edge, with its value,
    # and the axis keeps the points' width.
    slo = by["SLO p99 e2e 5,000 ms →"]
    assert slo.kind == "points" and set(slo.x) == {max(slo.x)} and max(slo.x) < spec.x_lim[1] < 1000


def test_the_sweep_axis_scales_to_its_points_and_the_slo_goes_to_the_edge():
    """Two points 324 and 369 ms under a 10,000 ms SLO: an axis to 15,000 ms put both in its first
    column and hid the Pareto front."""
    from llmconsole.console.tui.views.sweep import sweep_plan
    from tests.support.sweep_points import FORM, point

    a, b = point(1, 4, 1, 2.0, 324.0), point(2, 4, 2, 3.0, 369.0)
    spec = sweep_chart(sweep_plan("t1", {**FORM, "slo": "p99_e2e_ms=10000"}), (a, b))
    lo, hi = spec.x_lim
    assert lo <= 324 and 369 <= hi and (369 - 324) / (hi - lo) > 0.5  # the points span most of the axis
    by = {s.label: s for s in spec.series}
    assert "SLO p99 e2e 10,000 ms →" in by and lo < by["SLO p99 e2e 10,000 ms →"].x[0] <= hi
    # Near the points the SLO stretches the axis and is drawn where it is.
    near = sweep_chart(sweep_plan("t1", {**FORM, "slo": "p99_e2e_ms=400"}), (a, b))
    line = {s.label: s for s in near.series}["SLO p99 e2e 400 ms"]
    assert line.x == (400.0, 400.0) and near.x_lim[0] <= 324 and 400 <= near.x_lim[1]
    # Every point past the SLO: it sits at the left edge.
    low = sweep_chart(sweep_plan("t1", {**FORM, "slo": "p99_e2e_ms=20"}), (a, b))
    assert "← SLO p99 e2e 20 ms" in {s.label for s in low.series} and low.x_lim[0] > 20


def test_repeats_spread_draws_error_bars():
    from llmconsole.console.tui.views.sweep import sweep_plan
    from tests.support.sweep_points import FORM, P1, P2

    spread = dataclasses.replace(P2, spread={"throughput_req_s": 0.2, "p99_e2e_ms": 0.1})
    spec = sweep_chart(sweep_plan("t1", FORM), (P1, spread))
    bars = next(s for s in spec.series if s.kind == "errorbars")
    assert bars.label == "spread of 2 repeats" and bars.err == (0.0, pytest.approx(0.6))


TRIALS = (
    TrialOutcome(0, {"max_num_seqs": 4, "kernel": "stock"}, "complete", 2.5, 24),
    TrialOutcome(1, {"max_num_seqs": 2, "kernel": "stock"}, "infeasible", None, 8, "did not start"),
    TrialOutcome(2, {"max_num_seqs": 8, "kernel": "custom"}, "complete", 3.1, 24),
    TrialOutcome(3, {"max_num_seqs": 2, "kernel": "custom"}, "pruned", 1.1, 8, "below the cut"),
    TrialOutcome(4, {"max_num_seqs": 16, "kernel": "stock"}, "running", None, 0),
)


def test_the_tune_chart_marks_pruned_and_failed_trials_and_the_best_so_far():
    spec = tune_chart(TRIALS)
    by = {s.label: s for s in spec.series}
    assert by["trial (req/s)"].x == (0.0, 2.0) and by["pruned early"].y == (1.1,)
    assert by["infeasible (at 0)"].x == (1.0,) and by["infeasible (at 0)"].y == (0.0,)
    best = [v for v in by["best so far"].y if v is not None]
    assert best == sorted(best) and best[-1] == 3.1  # never goes down
    assert [t for _, t in spec.x_ticks] == ["0", "1", "2", "3"]  # the running trial is not on it yet


def test_the_knob_chart_takes_numbers_and_names():
    numeric = knob_chart(TRIALS, "max_num_seqs")
    assert numeric.x_label == "max_num_seqs (o: next knob)" and numeric.series[0].x == (4.0, 8.0)
    named = knob_chart(TRIALS, "kernel")
    assert named.x_ticks == ((0.0, "stock"), (1.0, "custom"))
    assert knob_chart((), None).empty == "no trial finished yet"


# --- what else the screens say -------------------------------------------------------------------


def test_the_quiet_log_hides_the_daemons_polls_and_the_access_lines():
    lines = [
        'INFO:     127.0.0.1:59588 - "GET /metrics HTTP/1.1" 200 OK',
        'INFO:     127.0.0.1:59628 - "GET /health HTTP/1.1" 200 OK',
        'INFO:     127.0.0.1:41710 - "POST /v1/completions HTTP/1.1" 200 OK',
        'INFO:     10.0.0.7:41710 - "GET /metrics HTTP/1.1" 200 OK',
        "(APIServer pid=1) INFO 12-04 18:23:21 [loggers.py:335] Engine 000: Avg prompt throughput: 61.5 tokens/s",
        "(APIServer pid=1) WARNING 12-04 18:23:22 [x.py:1] Something to see",
    ]
    assert [kind(line) for line in lines] == ["poll", "poll", "access", "access", "own", "own"]
    quiet, hidden = LogView().lines(lines)
    assert quiet == lines[4:] and hidden == 4
    assert LogView(full=True).lines(lines) == (lines, 0)
    found, _ = LogView(full=True, search="WARN").lines(lines)
    assert found == lines[5:]
    assert LogView().describe(4) == "quiet: 4 request/poll line(s) hidden (v shows them)"
    assert "search 'warn'" in LogView(search="warn").describe(0)
    marked = LogView(search="prompt").mark(lines[4])
    assert any(span.style == "black on yellow" for span in marked.spans)


def test_freeze_and_set_by_hand_say_different_things():
    freeze, up = Command("window", "t1", {"freeze": True}), Command("window", "t1", {"set": 9})
    assert asked(freeze) == "window t1: freeze the controller" and asked(up) == "window t1: set to 9 by hand"
    assert (
        done(freeze, {"window": 8, "frozen": True})
        == "window t1: controller frozen at 8 (+/- set it by hand, f resumes)"
    )
    assert (
        done(up, {"window": 9, "frozen": True})
        == "window t1: set to 9 by hand; the controller is frozen (f resumes it)"
    )
    assert done(Command("window", "t1", {"freeze": False}), {"window": 9}) == "window t1: controller resumed from 9"
    assert (
        done(
            Command("mode", "t1", {"mode": "balanced"}),
            {"mode": "balanced", "applied": {"took_s": 41.2, "to_config_id": "abc"}},
        )
        == "mode t1: now balanced in 41 s, config abc"
    )


def _engine(**metrics):
    return Snapshot.parse(
        {"engines": [{"name": "t1", "state": "ready", "started_at_s": 100.0, "ready_at_s": 135.0, "metrics": metrics}]}
    ).engines[0]


def test_the_sweep_and_tune_questions_say_how_long():
    from llmconsole.console.tui.views.sweep import confirm_question, sweep_plan
    from tests.support.sweep_points import FORM

    plan = sweep_plan("t1", FORM)  # 2 server configs (one is new) x 2 loads, 2 repeats of 16
    e = _engine(p50_ttft_s=0.1, p50_tpot_s=0.01)  # 0.42 s a request of 32 tokens
    text = sweep_text(plan, {"max_num_seqs": 4}, e)
    assert text.startswith("It takes about 1 min") and "2 restart(s) (~35 s a restart, as its last start took)" in text
    assert "8 load run(s)" in text
    assert "It takes about" in confirm_question("t1", plan, {"max_num_seqs": 4}, e)
    idle = sweep_text(plan, {"max_num_seqs": 4}, _engine())
    assert idle.startswith("It takes at least 1 min 10 s") and "served nothing lately" in idle


def test_the_tune_question_says_how_long():
    from llmconsole.console.tui.views.tune import TUNE_DEFAULTS, snapshot_facts, tune_settings

    settings, _ = tune_settings(
        "t1", snapshot_facts({"model": "m", "max_num_seqs": 4}), dict(TUNE_DEFAULTS, knobs="max_num_seqs=1:8")
    )
    text = tune_text(settings, _engine(p50_ttft_s=0.1, p50_tpot_s=0.01))
    assert text.startswith("It takes about") and "up to 6 trials and 4 re-measurement runs" in text


def test_progress_reads_the_same_everywhere():
    assert (
        progress.timed("loading weights (4/9)", 12.0, 50.0, bar_width=10).plain
        == "██░░░░░░░░ loading weights (4/9) · 12 s elapsed · ~38 s left"
    )
    assert "longer than last time (50 s)" in progress.timed("x", 60.0, 50.0).plain
    assert "no earlier run to estimate from" in progress.timed("x", 5.0, None).plain
    assert progress.bar(None, 4).plain == "····"


def test_a_restart_is_a_gap_a_late_sample_is_not_and_a_setting_holds():
    x = [0.0, 1.0, 2.0, 3.5, 4.0, 9.0, 10.0]  # 2-3.5: late; 4-9: the engine restarted
    y = [1.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0]
    _, ys = downsample(x, y, 0.0, 10.0, 10)
    assert ys[:5] == (1.0, 1.0, 1.0, 2.0, 2.0) and ys[5:8] == (None, None, None) and ys[-1] == 3.0
    _, held = downsample(x, y, 0.0, 10.0, 10, hold=True)
    assert None not in held and held[6] == 2.0


# --- tables fitted to their width -----------------------------------------------------------------


def _widest(headers, rows) -> int:
    from llmconsole.console.tui.table_fit import CELL_PADDING

    return sum(max([len(h), *(len(r[i]) for r in rows)]) + CELL_PADDING for i, h in enumerate(headers))


def test_the_sweep_table_keeps_params_throughput_and_latency_at_80_and_160_columns():
    """At 160 columns the table sits beside the chart in half the screen: it used to lose its
    right-hand columns, latency among them. Narrow, the utilizations go first."""
    from llmconsole.console.tui.screens.sweep import SweepScreen
    from llmconsole.console.tui.table_fit import fit_table
    from llmconsole.console.tui.views.sweep import sweep_plan, table
    from tests.support.sweep_points import FORM, P1, P2, P3, P4

    headers, rows, _ = table(sweep_plan("t1", FORM), (P1, P2, P3, P4))
    for width in (78, 58):  # the table's room at 160 (beside the chart) and 80 columns, and narrower
        fitted = fit_table(
            headers, rows, width, short=SweepScreen.TABLE_SHORT, drop=SweepScreen.TABLE_DROP, cut=SweepScreen.TABLE_CUT
        )
        assert fitted.headers[:3] == ("params", "req/s", "p99 ms") and _widest(fitted.headers, fitted.rows) <= width
        assert [r[2] for r in fitted.rows] == [r[2] for r in rows]  # latency whole
        assert set(fitted.hidden) <= {"bandwidth util", "compute util", "memory (GiB)"}
    wide = fit_table(headers, rows, 200)
    assert wide.headers == tuple(headers) and wide.hidden == ()


def test_the_trial_table_cuts_params_and_reasons_together_and_keeps_both_starts():
    from llmconsole.console.tui.screens.tune import TuneScreen
    from llmconsole.console.tui.table_fit import fit_table
    from llmconsole.console.tui.views.tune import TRIAL_HEADERS

    why = "did not start: KV cache of 2,097,152 bytes cannot hold one request of max_model_len 2048"
    rows = [["0", "infeasible", "-", "-", "max_num_seqs=2, max_num_batched_tokens=2048", why]]
    fitted = fit_table(
        TRIAL_HEADERS, rows, 78, short=TuneScreen.TABLE_SHORT, drop=TuneScreen.TABLE_DROP, cut=TuneScreen.TABLE_CUT
    )
    assert _widest(fitted.headers, fitted.rows) <= 78 and fitted.hidden == ("requests",)
    params, reason = fitted.rows[0][-2], fitted.rows[0][-1]
    assert params.startswith("max_num_seqs=2") and reason.startswith("did not start") and reason.endswith("…")
