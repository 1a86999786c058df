"""A percentile read from a histogram, with the resolution its buckets allow.

histogram_quantile interpolates inside the bucket the quantile falls in, as if its observations
were spread evenly there. On vLLM's coarse buckets (the queue-time and end-to-end histograms'
first bucket is 0-300 ms) that invents figures: eight requests that all waited under 300 ms read
as "p50 150 ms, p99 297 ms". What is shown is the bucket: `< 300 ms` for the first one,
`300-500 ms` for one between two bounds, `> 20 s` past the last finite one.

The interpolated value stays beside the bounds (`value_s`): the window's numeric fields and the
status JSON's `p99_*_s` keep carrying it, for clients that read them and for the gateway's PID
controller, which needs a continuous estimate to steer on and does not show it. Anything a person
reads renders the bounds.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Percentile:
    quantile: float
    value_s: float  # histogram_quantile's interpolation inside the bucket (not shown)
    lower_s: float  # the bucket's lower bound: 0 for the first bucket
    upper_s: float  # its upper bound: math.inf for the +Inf bucket

    @property
    def upper_bound_s(self) -> float | None:
        return None if math.isinf(self.upper_s) else self.upper_s

    def text(self, compact: bool = False) -> str:
        """`< 300 ms`, `300-500 ms`, `1-1.5 s`, `> 20 s`: the bucket, never a figure inside it.
        `compact` drops the spaces and the thousands separator (`<300ms`, `0.8-1s`) for a
        table's narrow column."""
        sp = "" if compact else " "
        if math.isinf(self.upper_s):
            out = f">{sp}{_dur(self.lower_s, sp)}"
        elif self.lower_s <= 0:
            out = f"<{sp}{_dur(self.upper_s, sp)}"
        elif self.upper_s >= 1:  # both in seconds once the top reaches 1 s
            out = f"{_num(self.lower_s)}-{_num(self.upper_s)}{sp}s"
        else:
            out = f"{_num(self.lower_s * 1000)}-{_num(self.upper_s * 1000)}{sp}ms"
        return out.replace(",", "") if compact else out

    def bounds_json(self) -> list[float | None]:
        """[lower_s, upper_s] with null for +Inf (JSON has no infinity)."""
        return [self.lower_s, self.upper_bound_s]


def worst(readings: Iterable[Percentile]) -> Percentile | None:
    """The greatest of several readings of one percentile (a span's p99s), with a bucket that
    honestly holds it: each figure lies in its own bucket, so the greatest lies in [the greatest
    lower bound, the greatest upper bound], which with one bucket layout is exactly its bucket.
    None for no readings."""
    got = list(readings)
    if not got:
        return None
    top = max(got, key=lambda p: p.value_s)
    return Percentile(top.quantile, top.value_s, max(p.lower_s for p in got), max(p.upper_s for p in got))


def _num(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 or x == int(x) else f"{x:g}"


def _dur(seconds: float, sp: str = " ") -> str:
    return f"{_num(seconds)}{sp}s" if seconds >= 1 else f"{_num(seconds * 1000)}{sp}ms"


def bucket_percentile(
    q: float, upper_bounds: Sequence[float], cumulative_counts: Sequence[float], value_s: float | None
) -> Percentile | None:
    """The bucket the q-quantile falls in, as histogram_quantile picks it; None when nothing was
    observed or the layout is unusable (then histogram_quantile answers None too)."""
    n = len(upper_bounds)
    if value_s is None or n < 2 or n != len(cumulative_counts) or upper_bounds[-1] != math.inf:
        return None
    counts, running = [], 0.0
    for c in cumulative_counts:
        running = max(running, c)
        counts.append(running)
    if counts[-1] <= 0:
        return None
    rank = q * counts[-1]
    b = next((i for i in range(n - 1) if counts[i] >= rank), n - 1)
    lower = 0.0 if b == 0 else float(upper_bounds[b - 1])
    return Percentile(q, float(value_s), lower, float(upper_bounds[b]))


def percentile_from(metrics: Mapping[str, Any], key: str) -> Percentile | None:
    """The percentile `key` (e.g. `p99_queue_s`) of a window as JSON (WindowedMetrics: its
    numeric field and `percentile_bounds`); None when the window has no such figure. A window
    from a daemon that sends no bounds gives a Percentile whose bounds are the value itself."""
    value = metrics.get(key)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    q = float("0." + key.split("_")[0][1:])
    bounds = (metrics.get("percentile_bounds") or {}).get(key)
    if not bounds or len(bounds) != 2:
        return Percentile(q, float(value), float(value), float(value))
    lower, upper = bounds
    return Percentile(q, float(value), float(lower or 0.0), math.inf if upper is None else float(upper))


def percentile_text(metrics: Mapping[str, Any], key: str, na: str = "N/A", compact: bool = False) -> str:
    """What a person reads for `key`: the bucket's range, or the bare figure from an older
    daemon that sends no bounds."""
    p = percentile_from(metrics, key)
    if p is None:
        return na
    if p.lower_s == p.upper_s:
        ms = p.value_s * 1000
        return f"{ms:.1f} ms" if ms < 10 else f"{ms:.0f} ms"
    return p.text(compact)
