"""Latency statistics and service-level objectives for load runs.

Percentiles use linear interpolation between closest ranks (numpy's default, which is what
`vllm bench serve` reports), so our medians and p99s can be laid beside vLLM's own.

An SLO is a set of targets such as `p99_e2e_ms=2000` or `ttft_ms=500`. Each target is read two
ways: per request (a request is *good* when every one of its latencies is within every limit;
goodput counts good requests per second) and per run (the run *meets* the SLO when the named
percentile of each latency is within its limit; a bare `ttft_ms` means p99).
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

METRICS = ("ttft", "tpot", "itl", "e2e")
_TARGET = re.compile(r"^(?:p(\d{1,2}(?:\.\d+)?|100)_)?(ttft|tpot|itl|e2e)_ms$")


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) by linear interpolation; None for no values."""
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile must be within 0..100, not {q}")
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class LatencyStats:
    """One latency over a run, in milliseconds (None when nothing was measured)."""

    count: int
    mean_ms: float | None
    median_ms: float | None
    p90_ms: float | None
    p99_ms: float | None
    max_ms: float | None

    @classmethod
    def of_seconds(cls, values_s: Iterable[float]) -> LatencyStats:
        ms = [v * 1000.0 for v in values_s]
        if not ms:
            return cls(0, None, None, None, None, None)
        return cls(len(ms), statistics.fmean(ms), percentile(ms, 50), percentile(ms, 90), percentile(ms, 99), max(ms))

    def at(self, q: float) -> float | None:
        """The stored percentile q (50, 90, 99 or 100)."""
        stored: dict[float, float | None] = {50: self.median_ms, 90: self.p90_ms, 99: self.p99_ms, 100: self.max_ms}
        return stored.get(q)


@dataclass(frozen=True)
class SloTarget:
    metric: str  # ttft | tpot | itl | e2e
    limit_ms: float
    percentile: float = 99.0

    @property
    def key(self) -> str:
        return f"p{self.percentile:g}_{self.metric}_ms"


@dataclass(frozen=True)
class Slo:
    targets: tuple[SloTarget, ...] = ()

    @classmethod
    def parse(cls, items: Iterable[str]) -> Slo:
        """From `KEY=MS` items, comma- or argument-separated: `p99_e2e_ms=2000,ttft_ms=500`.

        Raises ValueError naming the bad item; nothing is kept from a list with one bad item.
        """
        targets = []
        for raw in (part for item in items for part in item.split(",")):
            part = raw.strip()
            if not part:
                continue
            key, sep, value = part.partition("=")
            m = _TARGET.match(key.strip())
            if not sep or m is None:
                raise ValueError(
                    f"SLO target {part!r} is not KEY=MS with KEY like p99_e2e_ms, "
                    f"ttft_ms or p50_tpot_ms (metrics: {', '.join(METRICS)})"
                )
            pct = float(m.group(1)) if m.group(1) else 99.0
            if pct not in (50.0, 90.0, 99.0, 100.0):
                raise ValueError(f"SLO target {part!r}: percentile must be p50, p90, p99 or p100")
            try:
                limit = float(value)
            except ValueError:
                raise ValueError(f"SLO target {part!r}: {value!r} is not a number of milliseconds") from None
            if not limit > 0 or not math.isfinite(limit):
                raise ValueError(f"SLO target {part!r}: the limit must be a positive number of ms")
            targets.append(SloTarget(m.group(2), limit, pct))
        return cls(tuple(targets))

    def as_dict(self) -> dict[str, float]:
        return {t.key: t.limit_ms for t in self.targets}

    def __bool__(self) -> bool:
        return bool(self.targets)

    def request_is_good(
        self, ttft_s: float | None, tpot_s: float | None, e2e_s: float | None, max_itl_s: float | None
    ) -> bool:
        """Whether one successful request met every limit (a limit on a missing value fails)."""
        values = {"ttft": ttft_s, "tpot": tpot_s, "e2e": e2e_s, "itl": max_itl_s}
        for t in self.targets:
            v = values[t.metric]
            if t.metric == "tpot" and v is None:
                continue  # a one-token answer has no time per output token to miss
            if v is None or v * 1000.0 > t.limit_ms:
                return False
        return True

    def broken_by(self, stats: dict[str, LatencyStats]) -> list[str]:
        """The targets a run's statistics miss, as 'p99_e2e_ms 2512 > 2000' lines."""
        out = []
        for t in self.targets:
            s = stats.get(t.metric)
            v = s.at(t.percentile) if s is not None else None
            if v is None:
                out.append(f"{t.key}: not measured")
            elif v > t.limit_ms:
                out.append(f"{t.key} {v:.0f} > {t.limit_ms:g}")
        return out
