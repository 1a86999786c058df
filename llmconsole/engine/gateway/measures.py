"""What the window controller measures: one request's latencies as the gateway saw them, one
controller step as the trace keeps it, and the statistics the controller judges them by."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any


class Signal(StrEnum):
    TTFT = "ttft"  # p99 time to first token
    E2E = "e2e"  # p99 end-to-end latency
    TPOT = "tpot"  # p99 time per output token


@dataclass(frozen=True)
class LatencySample:
    """One request as the gateway measured it; times from dispatch to the engine.

    The gateway reports TTFT the moment the first token passes (`e2e_s` None) and the rest when
    the request finishes (`count_ttft` False): waiting for the end would delay the TTFT signal
    by a whole generation, which on long answers is longer than the loop can afford."""

    at_s: float  # monotonic time of the measurement
    ttft_s: float | None  # None when not streamed (the first token is not visible)
    e2e_s: float | None = None  # None: the request is still generating
    output_chunks: int = 0  # streamed events carrying output (about one token each)
    count_ttft: bool = True  # False when this request's TTFT was reported on its own
    output_tokens: int | None = None  # the stream's usage frame's count, where it had one

    @property
    def dispatched_at_s(self) -> float:
        """When the request was sent to the engine: which window it ran under."""
        if self.e2e_s is not None:
            return self.at_s - self.e2e_s
        return self.at_s - (self.ttft_s or 0.0)

    @property
    def tpot_s(self) -> float | None:
        # Events stand for tokens only without a usage count: vLLM merges tokens into fewer
        # events under load, which would make each look slower than it was.
        tokens = self.output_tokens if self.output_tokens is not None else self.output_chunks
        if self.ttft_s is None or self.e2e_s is None or tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (tokens - 1)


@dataclass(frozen=True)
class TraceSample:
    """One controller step, as the console's trace panel and the store see it."""

    at_s: float  # wall clock (time.time) of the step
    target_ms: float
    measured_ms: float | None
    error: float | None  # relative: (target - measured) / target
    p: float
    i: float
    d: float
    output: float  # unclamped controller output
    window: int  # what the admission gate uses now
    samples: int
    action: str  # step, clamped, capped, floored, hold-band, hold-settling, hold-unsure, hold-samples, hold-idle,
    # hold-unsaturated, frozen, manual

    def to_json(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def tail_chance(n: int, over: int, share: float) -> float:
    """The chance that `over` or more of `n` samples land beyond a quantile that only `share` of
    them exceed (a binomial tail): how easily chance alone explains that many slow requests."""
    if over <= 0:
        return 1.0
    if share <= 0:
        return 0.0
    below = sum(math.comb(n, k) * share**k * (1 - share) ** (n - k) for k in range(min(over, n + 1)))
    return max(0.0, 1.0 - below)


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile: with few samples p99 is the worst one, never an interpolation."""
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100.0 * len(ordered)))
    return ordered[rank - 1]
