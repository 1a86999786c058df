"""Percentiles from histograms carry their buckets' resolution wherever they are shown.

Recorded pages of a real engine under load (tests/fixtures/metrics): every request waited under
300 ms, the first bucket of vLLM's queue-time histogram, so histogram_quantile's interpolation
reads "p50 150 ms, p99 297 ms", figures the data cannot tell apart. What is shown is `< 300 ms`.
"""

from __future__ import annotations

import json
import math

import pytest

from llmconsole.engine.metrics.page import HistogramSample, parse_metrics
from llmconsole.engine.metrics.percentile import Percentile, percentile_from, percentile_text
from llmconsole.engine.metrics.window import MetricsWindow, WindowedMetrics
from llmconsole.engine.status import EngineStatus
from tests.support.paths import FIXTURES


def page(name: str) -> str:
    return (FIXTURES / "metrics" / name).read_text()


def _window() -> WindowedMetrics:
    times = json.loads(page("load_seq_times.json"))["taken_at_s"]
    w = MetricsWindow(rate_window_s=10, percentile_window_s=60)
    snap = None
    for i, t in enumerate(times):
        snap = w.add(parse_metrics(page(f"load_seq_{i}.txt"), t))
    assert snap is not None
    return snap


def test_a_percentile_inside_the_first_bucket_shows_the_bound_not_an_interpolation():
    m = _window()
    # The numeric fields keep histogram_quantile's interpolation (older clients, the PID controller).
    assert m.p50_queue_s == pytest.approx(0.15) and m.p99_queue_s == pytest.approx(0.297)
    assert m.percentile_bounds["p50_queue_s"] == [0.0, 0.3] == m.percentile_bounds["p99_queue_s"]
    assert m.percentile("p50_queue_s").text() == "< 300 ms" == m.percentile("p99_queue_s").text()
    assert m.percentile("p99_queue_s").text(compact=True) == "<300ms"


def test_a_percentile_between_two_bounds_shows_the_bucket():
    m = _window()
    assert m.percentile_bounds["p99_ttft_s"] == [0.02, 0.04] and m.percentile("p99_ttft_s").text() == "20-40 ms"
    assert m.percentile("p50_e2e_s").text() == "2-2.5 s" and m.percentile("p99_e2e_s").text() == "2.5-5 s"
    # Every bucket holds its interpolation: the bounds are the figure's true resolution.
    for key, (lower, upper) in m.percentile_bounds.items():
        assert lower <= getattr(m, key) <= upper, key


def test_past_the_last_finite_bound_and_text_edges():
    slow = HistogramSample((0.3, 0.5, math.inf), (0.0, 0.0, 4.0), 4.0, 40.0)
    value = slow.quantile(0.99)
    from llmconsole.engine.metrics.percentile import bucket_percentile

    p = bucket_percentile(0.99, slow.upper_bounds, slow.cumulative_counts, value)
    assert p is not None and p.text() == "> 500 ms" and p.bounds_json() == [0.5, None]
    assert Percentile(0.5, 0.9, 0.8, 1.0).text() == "0.8-1 s"
    assert Percentile(0.5, 0.9, 0.1, 0.3).text(compact=True) == "100-300ms"
    assert Percentile(0.5, 12.0, 10.0, 15.0).text() == "10-15 s"


def test_status_json_adds_the_bucket_and_keeps_the_number():
    m = _window()
    d = EngineStatus(
        name="e", state="ready", config_id="c", model="m", served_model_name="m", device="cpu", metrics=m
    ).to_json()
    assert d["p99_ttft_s"] == m.p99_ttft_s  # the number stays: histogram_quantile's interpolation
    assert d["p99_ttft_bounds_s"] == [0.02, 0.04] and d["p99_ttft_text"] == "20-40 ms"
    assert d["p99_e2e_text"] == "2.5-5 s"
    assert d["metrics"]["percentile_bounds"]["p99_queue_s"] == [0.0, 0.3]
    json.dumps(d)  # plain JSON: no infinity


def test_a_window_from_an_older_daemon_without_bounds_shows_its_figure():
    old = {"p99_queue_s": 0.297}
    assert percentile_text(old, "p99_queue_s") == "297 ms" and percentile_text(old, "p50_queue_s") == "N/A"
    p = percentile_from({"p99_queue_s": 0.297, "percentile_bounds": {"p99_queue_s": [0.0, 0.3]}}, "p99_queue_s")
    assert p == Percentile(0.99, 0.297, 0.0, 0.3)


def test_the_status_command_shows_the_bucket():
    from llmconsole.console.cli import format_status
    from llmconsole.wire.status import StatusAnswer

    d = EngineStatus(
        name="e", state="ready", config_id="c", model="m", served_model_name="m", device="cpu", metrics=_window()
    ).to_json()
    out = format_status(StatusAnswer.model_validate({"engines": [d]}))
    assert "20-40 ms" in out
