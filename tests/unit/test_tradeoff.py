"""Percentiles, SLOs and goodput, Pareto front, knee and best-under-SLO on data with known answers."""

from __future__ import annotations

import math

import pytest

from llmconsole.engine.load.generator import RequestRecord, summarize
from llmconsole.engine.metrics.latency import LatencyStats, Slo, percentile
from llmconsole.engine.sweep.tradeoff import TradeoffPoint, best_under_slo, knee, pareto_front, step_ratio


def test_percentile_interpolates_like_numpy():
    xs = [10, 20, 30, 40]
    assert percentile(xs, 50) == 25
    assert percentile(xs, 0) == 10 and percentile(xs, 100) == 40
    assert percentile(list(range(1, 101)), 99) == pytest.approx(99.01)
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None
    with pytest.raises(ValueError):
        percentile(xs, 101)


def test_latency_stats_in_ms():
    s = LatencyStats.of_seconds([0.1, 0.2, 0.3])
    assert (s.count, s.median_ms, s.max_ms) == (3, pytest.approx(200), pytest.approx(300))
    assert s.mean_ms == pytest.approx(200)
    assert LatencyStats.of_seconds([]).p99_ms is None


def test_slo_parse_and_errors_leave_nothing():
    slo = Slo.parse(["p99_e2e_ms=2000,ttft_ms=500", "p50_tpot_ms=40"])
    assert slo.as_dict() == {"p99_e2e_ms": 2000.0, "p99_ttft_ms": 500.0, "p50_tpot_ms": 40.0}
    for bad in ["e2e=5", "p99_e2e_ms=abc", "p99_foo_ms=3", "p99_e2e_ms=-1", "p42_e2e_ms=10"]:
        with pytest.raises(ValueError):
            Slo.parse([bad])


def _rec(i, ttft, e2e, out=11, status="ok", warmup=False):
    return RequestRecord(
        i,
        warmup,
        status,
        0.0,
        10,
        out if status == "ok" else None,
        ttft if status == "ok" else None,
        e2e if status == "ok" else None,
        (0.01,) * (out - 1) if status == "ok" else (),
    )


def test_goodput_and_attainment_count_requests_within_every_limit():
    recs = [
        _rec(0, 0.1, 1.0),
        _rec(1, 0.2, 1.5),
        _rec(2, 0.6, 1.2),
        _rec(3, 0.1, 2.5),
        _rec(4, 0, 0, status="http_503"),
        _rec(5, 9, 9, warmup=True),
    ]
    s = summarize(recs, duration_s=2.0, slo=Slo.parse(["ttft_ms=500", "e2e_ms=2000"]))
    assert (s.requests, s.completed, s.failed) == (5, 4, 1)
    assert s.errors_by_kind == {"http_503": 1}
    assert s.good_requests == 2  # #2 misses TTFT, #3 misses end-to-end
    assert s.goodput_req_s == pytest.approx(1.0)
    assert s.slo_attainment == pytest.approx(0.5)
    assert s.request_throughput_req_s == pytest.approx(2.0)
    # TPOT as vLLM defines it: (e2e - ttft) / (out - 1)
    assert s.tpot.median_ms == pytest.approx(1000 * statistics_median([0.09, 0.13, 0.06, 0.24]))
    assert any(line.startswith("p99_e2e_ms") for line in s.slo_broken)
    assert s.error_rate == pytest.approx(0.2)


def statistics_median(xs):
    import statistics

    return statistics.median(xs)


P = TradeoffPoint


def test_pareto_front_keeps_undominated_points_lowest_latency_first():
    pts = [P(10, 100), P(18, 150), P(15, 200), P(25, 400), P(24, 500), P(None, None), P(25, 400)]
    assert pareto_front(pts) == [0, 1, 3]


def test_knee_relative_units_stop_at_first_poor_step():
    # Step 0->1: +80 % throughput for +50 % latency: ratio 1.6; with threshold 1.5 it is taken.
    # Step 1->2: +10 % for +100 %: ratio 0.1, the walk stops at point 1.
    pts = [P(10, 100), P(18, 150), P(19.8, 300)]
    assert step_ratio(pts[0], pts[1]) == pytest.approx(1.6)
    k = knee(pts, threshold=1.5)
    assert k.index == 1 and [s.accepted for s in k.steps] == [True, False]
    # The rule as quoted (2.5) refuses even the first step: the fastest point is the knee.
    assert knee(pts, threshold=2.5).index == 0
    assert "unitless" in k.units_text


def test_knee_absolute_units_are_req_s_per_ms():
    pts = [P(10, 100), P(18, 150), P(19.8, 300)]
    assert step_ratio(pts[0], pts[1], "absolute") == pytest.approx(8 / 50)
    assert knee(pts, threshold=0.1, units="absolute").index == 1
    assert knee(pts, threshold=0.2, units="absolute").index == 0
    with pytest.raises(ValueError):
        knee(pts, units="percent")


def test_knee_takes_free_throughput_and_handles_no_points():
    pts = [P(10, 100), P(12, 100)]  # more throughput at no latency cost: point 0 is dominated
    assert knee(pts).index == 1
    assert knee([P(None, None)]).index is None
    assert math.isinf(step_ratio(P(10, 100), P(12, 90)))


def test_best_under_slo_is_max_goodput_among_those_meeting_it():
    pts = [
        P(10, 100, goodput_req_s=10),
        P(20, 300, goodput_req_s=19),
        P(30, 900, goodput_req_s=12, meets_slo=False),
        P(20, 250, goodput_req_s=19),
    ]
    assert best_under_slo(pts) == 3  # tie on goodput: the lower latency
    assert best_under_slo([P(10, 100, meets_slo=False)]) is None
    assert best_under_slo([P(5, 10), P(7, 20)]) == 1  # no goodput: throughput stands in
