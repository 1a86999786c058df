"""The throughput / latency trade-off of a sweep: Pareto front, best point under an SLO, knee.

Throughput is higher-is-better (req/s), latency lower-is-better (p99 end-to-end, ms). The knee
rule operators quote, "accept a step while delta-throughput / delta-latency > 2.5", has no units
until someone gives it some; here they are explicit:

- `relative` (default): (dT / T_prev) / (dL / L_prev), a ratio of relative changes, unitless.
  2.5 means "take a step that buys at least 2.5 % more throughput for each 1 % of latency".
- `absolute`: dT / dL in (req/s) per ms, which depends on the engine's scale.

The walk goes along the Pareto front from its lowest-latency point; the knee is the last point
reached before the first step whose ratio falls to the threshold or below.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Sequence

KneeUnits = Literal["relative", "absolute"]
UNIT_TEXT = {
    "relative": "(dT/T)/(dL/L), unitless: % throughput gained per % p99 latency added",
    "absolute": "dT/dL in (req/s) per ms of p99 latency",
}


@dataclass(frozen=True)
class TradeoffPoint:
    throughput_req_s: float | None
    p99_latency_ms: float | None
    goodput_req_s: float | None = None
    meets_slo: bool = True

    @property
    def measured(self) -> bool:
        return (self.throughput_req_s is not None and self.p99_latency_ms is not None
                and math.isfinite(self.throughput_req_s) and math.isfinite(self.p99_latency_ms))


@dataclass(frozen=True)
class KneeStep:
    from_index: int
    to_index: int
    ratio: float          # in the units of the pick; inf when latency did not rise
    accepted: bool


@dataclass(frozen=True)
class KneePick:
    index: int | None     # None: no measured point
    threshold: float
    units: KneeUnits
    steps: tuple[KneeStep, ...]

    @property
    def units_text(self) -> str:
        return UNIT_TEXT[self.units]


def _dominates(a: TradeoffPoint, b: TradeoffPoint) -> bool:
    return (a.throughput_req_s >= b.throughput_req_s and a.p99_latency_ms <= b.p99_latency_ms
            and (a.throughput_req_s > b.throughput_req_s or a.p99_latency_ms < b.p99_latency_ms))


def pareto_front(points: Sequence[TradeoffPoint]) -> list[int]:
    """Indices of the measured points no other point beats on both axes, lowest latency first.

    Of two identical points only the first is kept, so the front has no duplicates.
    """
    measured = [i for i, p in enumerate(points) if p.measured]
    front = []
    for i in measured:
        p = points[i]
        if any(_dominates(points[j], p) for j in measured if j != i):
            continue
        if any(points[j].throughput_req_s == p.throughput_req_s and points[j].p99_latency_ms == p.p99_latency_ms
               for j in front):
            continue
        front.append(i)
    return sorted(front, key=lambda i: (points[i].p99_latency_ms, -points[i].throughput_req_s))


def step_ratio(prev: TradeoffPoint, nxt: TradeoffPoint, units: KneeUnits = "relative") -> float:
    """Throughput gained per latency added between two points, in `units` (see the module doc)."""
    d_thr = nxt.throughput_req_s - prev.throughput_req_s
    d_lat = nxt.p99_latency_ms - prev.p99_latency_ms
    if d_lat <= 0:
        return math.inf if d_thr > 0 else (0.0 if d_thr == 0 else -math.inf)
    if units == "absolute":
        return d_thr / d_lat
    if prev.throughput_req_s <= 0 or prev.p99_latency_ms <= 0:
        return math.inf if d_thr > 0 else 0.0
    return (d_thr / prev.throughput_req_s) / (d_lat / prev.p99_latency_ms)


def knee(points: Sequence[TradeoffPoint], threshold: float = 2.5, units: KneeUnits = "relative") -> KneePick:
    """Walk the Pareto front from its fastest point while each step's ratio beats `threshold`."""
    if units not in UNIT_TEXT:
        raise ValueError(f"knee units must be one of {', '.join(UNIT_TEXT)}, not {units!r}")
    if not threshold >= 0:
        raise ValueError(f"the knee threshold must be >= 0, not {threshold}")
    front = pareto_front(points)
    if not front:
        return KneePick(None, threshold, units, ())
    steps, pick, walking = [], front[0], True
    for a, b in zip(front, front[1:]):
        r = step_ratio(points[a], points[b], units)
        accepted = walking and r > threshold
        steps.append(KneeStep(a, b, r, accepted))
        if accepted:
            pick = b
        else:
            walking = False
    return KneePick(pick, threshold, units, tuple(steps))


def best_under_slo(points: Sequence[TradeoffPoint]) -> int | None:
    """The point with the most goodput among those meeting the SLO (ties: lower latency).

    Goodput falls back to throughput for points without one (no per-request SLO given).
    """
    ok = [i for i, p in enumerate(points) if p.measured and p.meets_slo]
    if not ok:
        return None

    def key(i: int) -> tuple[float, float]:
        p = points[i]
        good = p.goodput_req_s if p.goodput_req_s is not None else p.throughput_req_s
        return (good, -p.p99_latency_ms)

    return max(ok, key=key)


def relative_change(prev: float | None, now: float | None) -> float | None:
    """(now - prev) / prev, None when either is missing or prev is zero."""
    if prev is None or now is None or prev == 0:
        return None
    return (now - prev) / prev
