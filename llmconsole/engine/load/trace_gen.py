"""Synthetic traces with the shape of a serving day (bench/make_traces.py writes them).

Arrivals are a Poisson process whose rate follows a daily profile (drawn by thinning, so any
profile works): a quiet night, a morning ramp, a daytime plateau whose low is the trough, and an
evening peak at `peak_ratio` times that trough. Prompt and output lengths are lognormal. On top
come bursts of long prompts (the long-text case memory modes exist for): a few minutes in which
extra requests arrive with prompts several times the usual length. Everything comes from one
seed, so a trace is made again byte for byte.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from llmconsole.engine.load.trace import TraceRequest

DAY_S = 86_400.0

# (hour, rate relative to the daytime trough): night, morning ramp, day, evening peak, late.
# The peak's value is replaced by peak_ratio.
_PROFILE = (
    (0.0, 0.30),
    (5.0, 0.25),
    (7.0, 0.55),
    (9.0, 1.15),
    (12.0, 1.20),
    (15.0, 1.00),
    (17.0, 1.60),
    (20.0, 3.00),
    (22.0, 1.40),
    (24.0, 0.30),
)


@dataclass(frozen=True)
class DayShape:
    requests: int = 2400  # about this many in the whole day (bursts included)
    peak_ratio: float = 3.0  # the evening peak's rate over the daytime trough's
    input_median: int = 96
    output_median: int = 48
    sigma: float = 0.6
    bursts: tuple[float, ...] = (10.5, 14.0, 19.25)  # hours at which long-prompt bursts begin
    burst_minutes: float = 20.0
    burst_requests: int = 60  # extra requests per burst
    burst_input_factor: float = 8.0  # their prompts, times the usual median
    max_tokens: int = 4096  # no length above this (input and output each)

    def __post_init__(self) -> None:
        if self.requests < 1 or self.peak_ratio < 1 or self.sigma <= 0:
            raise ValueError("a day needs requests >= 1, peak_ratio >= 1 and sigma > 0")


def relative_rate(hour: float, peak_ratio: float = 3.0) -> float:
    """The profile's rate at `hour` (0-24), 1.0 at the daytime trough."""
    h = hour % 24.0
    pts = [(x, peak_ratio if x == 20.0 else y) for x, y in _PROFILE]
    for (x0, y0), (x1, y1) in zip(pts, pts[1:], strict=False):
        if x0 <= h <= x1:
            return y0 + (y1 - y0) * (h - x0) / (x1 - x0)
    return pts[-1][1]


def _length(rng: random.Random, median: float, sigma: float, cap: int) -> int:
    return max(1, min(cap, round(rng.lognormvariate(math.log(median), sigma))))


def diurnal_day(shape: DayShape = DayShape(), seed: int = 0) -> tuple[TraceRequest, ...]:
    """One day of requests in arrival order, the first at 0 s."""
    rng = random.Random(seed)
    steps = 24 * 12  # the profile's mean, on a five-minute grid
    mean_rel = sum(relative_rate(24.0 * k / steps, shape.peak_ratio) for k in range(steps)) / steps
    base = max(shape.requests - len(shape.bursts) * shape.burst_requests, 1)
    trough_rate = base / (DAY_S * mean_rel)  # requests/s at relative rate 1.0
    top = trough_rate * shape.peak_ratio
    out: list[TraceRequest] = []
    t = 0.0
    while True:
        t += rng.expovariate(top)
        if t >= DAY_S:
            break
        if rng.random() * top <= trough_rate * relative_rate(t / 3600.0, shape.peak_ratio):
            out.append(
                TraceRequest(
                    t,
                    _length(rng, shape.input_median, shape.sigma, shape.max_tokens),
                    _length(rng, shape.output_median, shape.sigma, shape.max_tokens),
                )
            )
    long_median = shape.input_median * shape.burst_input_factor
    for hour in shape.bursts:
        start = hour * 3600.0
        for _ in range(shape.burst_requests):
            at = start + rng.random() * shape.burst_minutes * 60.0
            out.append(
                TraceRequest(
                    at,
                    _length(rng, long_median, shape.sigma / 2, shape.max_tokens),
                    _length(rng, shape.output_median, shape.sigma, shape.max_tokens),
                )
            )
    out.sort(key=lambda r: r.arrival_s)
    return tuple(out)
