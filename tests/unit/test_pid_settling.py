"""How bench/exp_window.py judges settling: the rolling p99 after a load step, and the time from
the step until it is within 10% of the target and stays there."""

from __future__ import annotations

import sys

from tests.support.paths import ROOT

sys.path.insert(0, str(ROOT / "bench"))

from exp_window_figures import MIN_ROLL_SAMPLES, pct, rolling_p99_ms, settling  # noqa: E402


def test_settling_is_the_start_of_the_last_run_inside_the_band():
    target = 100.0
    points = [(1.0, None), (2.0, 150.0), (3.0, 105.0), (4.0, 95.0), (5.0, 120.0), (6.0, 108.0), (7.0, 91.0)]
    assert settling(points, target) == 6.0  # in at 3 s, out at 5 s, in again from 6 s on
    assert settling(points + [(8.0, 89.0)], target) is None  # ends outside: never settled
    assert settling(points + [(8.0, None)], target) is None  # no evidence at the end is not "inside"
    assert settling([(1.0, 100.0), (2.0, 110.0)], target) == 1.0


def test_rolling_p99_counts_requests_by_dispatch_after_the_step_only():
    step_at, end = 100.0, 110.0
    # Twenty requests a second; each second's slowest takes 50 ms more than the one before.
    ttfts = [(step_at + k / 20.0, 10.0 + (50.0 * (k // 20) if k % 20 == 19 else 0.0)) for k in range(200)]
    ttfts += [(step_at - 1.0 + k / 100.0, 9999.0) for k in range(100)]  # the low phase: never counted
    points = rolling_p99_ms(ttfts, step_at, end, roll_s=3.0)
    assert [t for t, _ in points] == [float(t) for t in range(1, 11)]
    assert MIN_ROLL_SAMPLES == 50
    assert points[0][1] is None and points[1][1] is None  # 20 and 40 requests: too few for a p99
    assert points[2][1] == 10.0 + 50.0 * 2  # 60: enough
    # At t=5 s the span is [2 s, 5 s): 60 requests, nearest-rank p99 is their slowest, from second 4.
    assert dict(points)[5.0] == 10.0 + 50.0 * 4
    assert pct([1.0, 2.0, 3.0], 99) == 3.0 and pct([float(v) for v in range(1, 101)], 99) == 99.0
