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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

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
        return self.axes is not None

    @property
    def axes(self) -> tuple[float, float] | None:
        """(throughput, p99 latency) of a measured point (both finite), else None."""
        thr, lat = self.throughput_req_s, self.p99_latency_ms
        if thr is None or lat is None or not (math.isfinite(thr) and math.isfinite(lat)):
            return None
        return thr, lat


@dataclass(frozen=True)
class KneeStep:
    from_index: int
    to_index: int
    ratio: float  # in the units of the pick; inf when latency did not rise
    accepted: bool


@dataclass(frozen=True)
class KneePick:
    index: int | None  # None: no measured point
    threshold: float
    units: KneeUnits
    steps: tuple[KneeStep, ...]

    @property
    def units_text(self) -> str:
        return UNIT_TEXT[self.units]


def _axes(p: TradeoffPoint) -> tuple[float, float]:
    axes = p.axes
    if axes is None:
        raise ValueError(f"{p} is not a measured point")
    return axes


def _dominates(a: tuple[float, float], b: tuple[float, float]) -> bool:
    (a_thr, a_lat), (b_thr, b_lat) = a, b
    return a_thr >= b_thr and a_lat <= b_lat and (a_thr > b_thr or a_lat < b_lat)


def pareto_front(points: Sequence[TradeoffPoint]) -> list[int]:
    """Indices of the measured points no other point beats on both axes, lowest latency first.

    Of two identical points only the first is kept, so the front has no duplicates.
    """
    measured = {i: axes for i, p in enumerate(points) if (axes := p.axes) is not None}
    front: list[int] = []
    for i, p in measured.items():
        if any(_dominates(q, p) for j, q in measured.items() if j != i):
            continue
        if any(measured[j] == p for j in front):
            continue
        front.append(i)
    return sorted(front, key=lambda i: (measured[i][1], -measured[i][0]))


def step_ratio(prev: TradeoffPoint, nxt: TradeoffPoint, units: KneeUnits = "relative") -> float:
    """Throughput gained per latency added between two measured points, in `units` (see the
    module doc). ValueError for a point that was not measured."""
    (prev_thr, prev_lat), (nxt_thr, nxt_lat) = _axes(prev), _axes(nxt)
    d_thr = nxt_thr - prev_thr
    d_lat = nxt_lat - prev_lat
    if d_lat <= 0:
        return math.inf if d_thr > 0 else (0.0 if d_thr == 0 else -math.inf)
    if units == "absolute":
        return d_thr / d_lat
    if prev_thr <= 0 or prev_lat <= 0:
        return math.inf if d_thr > 0 else 0.0
    return (d_thr / prev_thr) / (d_lat / prev_lat)


def knee(points: Sequence[TradeoffPoint], threshold: float = 2.5, units: KneeUnits = "relative") -> KneePick:
    """Walk the Pareto front from its fastest point while each step's ratio beats `threshold`."""
    if units not in UNIT_TEXT:
        raise ValueError(f"knee units must be one of {', '.join(UNIT_TEXT)}, not {units!r}")
    if not threshold >= 0:
        raise ValueError(f"the knee threshold must be >= 0, not {threshold}")
    front = pareto_front(points)
    if not front:
        return KneePick(None, threshold, units, ())
    steps: list[KneeStep] = []
    pick, walking = front[0], True
    for a, b in zip(front, front[1:], strict=False):  # consecutive pairs
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
    ok = {i: axes for i, p in enumerate(points) if p.meets_slo and (axes := p.axes) is not None}
    if not ok:
        return None

    def key(i: int) -> tuple[float, float]:
        thr, lat = ok[i]
        good = points[i].goodput_req_s
        return (good if good is not None else thr, -lat)

    return max(ok, key=key)


def relative_change(prev: float | None, now: float | None) -> float | None:
    """(now - prev) / prev, None when either is missing or prev is zero."""
    if prev is None or now is None or prev == 0:
        return None
    return (now - prev) / prev
