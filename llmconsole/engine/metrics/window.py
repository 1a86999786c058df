"""Rates and latency percentiles over a sliding window of /metrics samples.

A single page holds only totals since the engine started. What an operator needs is "how many
tokens per second now" and "p99 TTFT over the last minute", which come from the difference
between the newest sample and the oldest one still inside a window: counter deltas over elapsed
time, histogram bucket deltas fed to histogram_quantile. Rates use a short window so they react;
percentiles a longer one so that a p99 rests on enough requests.
"""

from __future__ import annotations

import collections
import dataclasses
from dataclasses import dataclass

from llmconsole.engine.metrics.page import COUNTER_FIELDS, HISTOGRAM_FIELDS, HistogramSample, ScrapeSample
from llmconsole.engine.metrics.percentile import Percentile, bucket_percentile
from llmconsole.engine.metrics.ranks import LagRule, RankFigures, RankWatch


@dataclass(frozen=True)
class WindowedMetrics:
    taken_at_s: float
    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None
    preemptions_total: float | None = None
    preemptions_per_s: float | None = None
    prompt_tok_s: float | None = None
    generation_tok_s: float | None = None
    request_per_s: float | None = None
    requests_in_window: float | None = None
    p50_ttft_s: float | None = None
    p90_ttft_s: float | None = None
    p99_ttft_s: float | None = None
    p50_itl_s: float | None = None
    p90_itl_s: float | None = None
    p99_itl_s: float | None = None
    p50_tpot_s: float | None = None
    p90_tpot_s: float | None = None
    p99_tpot_s: float | None = None
    p50_e2e_s: float | None = None
    p90_e2e_s: float | None = None
    p99_e2e_s: float | None = None
    p50_queue_s: float | None = None
    p90_queue_s: float | None = None
    p99_queue_s: float | None = None
    num_gpu_blocks: int | None = None
    block_size: int | None = None
    # What the figures are taken over: rates over the last `rate_window_s`, percentiles (and
    # requests_in_window) over the last `percentile_window_s`; no request in it, no percentile.
    rate_window_s: float | None = None
    percentile_window_s: float | None = None
    # Each percentile field's bucket, [lower_s, upper_s] (upper null past the last finite bound):
    # what the figures can tell apart. The fields above hold histogram_quantile's interpolation
    # inside that bucket, for the controller and older clients; what is shown renders the bucket
    # (percentile.py).
    percentile_bounds: dict[str, list[float | None]] = dataclasses.field(default_factory=dict)
    stale: bool = False
    scrape_errors: int = 0
    last_error: str | None = None
    # A data-parallel engine's ranks beside the merged figures above, and which one lags its
    # peers (ranks.py); empty for an engine of one rank.
    ranks: tuple[RankFigures, ...] = ()

    def percentile(self, key: str) -> Percentile | None:
        """`p99_queue_s` with its bucket; None when the window has no such figure."""
        from llmconsole.engine.metrics.percentile import percentile_from

        return percentile_from(dataclasses.asdict(self), key)


def _is_reset(newer: ScrapeSample, older: ScrapeSample) -> bool:
    """A counter that went down, or a histogram that changed layout: the engine restarted."""
    for f in COUNTER_FIELDS:
        a, b = getattr(newer, f), getattr(older, f)
        if a is not None and b is not None and a < b:
            return True
    for f in HISTOGRAM_FIELDS:
        a, b = getattr(newer, f), getattr(older, f)
        if a is not None and b is not None and a.minus(b) is None:
            return True
    return False


class MetricsWindow:
    """Keeps recent samples of one engine and turns each new one into a WindowedMetrics."""

    def __init__(self, rate_window_s: float = 10.0, percentile_window_s: float = 60.0, lag_rule: LagRule | None = None):
        self.rate_window_s = rate_window_s
        self.percentile_window_s = percentile_window_s
        self._ranks = RankWatch(lag_rule)
        self._samples: collections.deque[ScrapeSample] = collections.deque()
        self._last: WindowedMetrics | None = None
        self._errors = 0

    def _oldest_within(self, now_s: float, window_s: float) -> ScrapeSample | None:
        for s in self._samples:  # oldest first; the deque holds at most the longest window
            if now_s - s.taken_at_s <= window_s + 1e-9:
                return s
        return None

    def add(self, sample: ScrapeSample) -> WindowedMetrics:
        if self._samples and _is_reset(sample, self._samples[-1]):
            # Everything after a restart counts from zero: the new totals are the deltas since
            # the last sample of the old engine (the restart happened in between).
            restarted_after_s = self._samples[-1].taken_at_s
            self._samples.clear()
            self._samples.append(_zero_like(sample, restarted_after_s))
        self._samples.append(sample)
        horizon = max(self.rate_window_s, self.percentile_window_s)
        while len(self._samples) > 2 and sample.taken_at_s - self._samples[1].taken_at_s >= horizon:
            self._samples.popleft()

        rates: dict[str, float] = {}  # counter -> its increase per second over the rate window
        rate_base = self._oldest_within(sample.taken_at_s, self.rate_window_s)
        if rate_base is not None and rate_base is not sample:
            dt = sample.taken_at_s - rate_base.taken_at_s
            for counter in COUNTER_FIELDS:
                a, b = getattr(sample, counter), getattr(rate_base, counter)
                if a is not None and b is not None and dt > 0:
                    rates[counter] = (a - b) / dt
        seen: dict[str, HistogramSample] = {}  # histogram -> what it observed over the percentile window
        pct_base = self._oldest_within(sample.taken_at_s, self.percentile_window_s)
        if pct_base is not None and pct_base is not sample:
            for h in HISTOGRAM_FIELDS:
                a, b = getattr(sample, h), getattr(pct_base, h)
                delta: HistogramSample | None = a.minus(b) if a is not None and b is not None else None
                if delta is not None and delta.count > 0:
                    seen[h] = delta

        bounds: dict[str, list[float | None]] = {}

        def q(h: str, quantile: float) -> float | None:
            delta = seen.get(h)
            if delta is None:
                return None
            value = delta.quantile(quantile)
            p = bucket_percentile(quantile, delta.upper_bounds, delta.cumulative_counts, value)
            if p is not None:
                bounds[f"p{round(quantile * 100)}_{h}_s"] = p.bounds_json()
            return value

        e2e = seen.get("e2e")
        cache = sample.cache
        snap = WindowedMetrics(
            taken_at_s=sample.taken_at_s,
            running=sample.num_requests_running,
            waiting=sample.num_requests_waiting,
            kv_cache_usage=sample.kv_cache_usage,
            preemptions_total=sample.preemptions_total,
            preemptions_per_s=rates.get("preemptions_total"),
            prompt_tok_s=rates.get("prompt_tokens_total"),
            generation_tok_s=rates.get("generation_tokens_total"),
            request_per_s=rates.get("request_success_total"),
            requests_in_window=e2e.count if e2e is not None else None,
            p50_ttft_s=q("ttft", 0.50),
            p90_ttft_s=q("ttft", 0.90),
            p99_ttft_s=q("ttft", 0.99),
            p50_itl_s=q("itl", 0.50),
            p90_itl_s=q("itl", 0.90),
            p99_itl_s=q("itl", 0.99),
            p50_tpot_s=q("tpot", 0.50),
            p90_tpot_s=q("tpot", 0.90),
            p99_tpot_s=q("tpot", 0.99),
            p50_e2e_s=q("e2e", 0.50),
            p90_e2e_s=q("e2e", 0.90),
            p99_e2e_s=q("e2e", 0.99),
            p50_queue_s=q("queue", 0.50),
            p90_queue_s=q("queue", 0.90),
            p99_queue_s=q("queue", 0.99),
            num_gpu_blocks=cache.num_gpu_blocks if cache else None,
            block_size=cache.block_size if cache else None,
            rate_window_s=self.rate_window_s,
            percentile_window_s=self.percentile_window_s,
            percentile_bounds=bounds,
            scrape_errors=self._errors,
            ranks=self._ranks.add(sample.ranks, sample.taken_at_s),
        )
        self._last = snap
        return snap

    def failed(self, error: str, at_s: float) -> WindowedMetrics:
        """A scrape failed: keep the last figures, marked stale, and count the error."""
        self._errors += 1
        base = self._last or WindowedMetrics(taken_at_s=at_s)
        snap = dataclasses.replace(base, stale=True, scrape_errors=self._errors, last_error=error)
        self._last = snap
        return snap


def _zero_like(sample: ScrapeSample, at_s: float) -> ScrapeSample:
    """The baseline of a restarted engine: its counters and histograms at zero, gauges unknown."""

    def zero(total: float | None) -> float | None:
        return 0.0 if total is not None else None

    def zeroed(h: HistogramSample | None) -> HistogramSample | None:
        return h.zeroed() if h is not None else None

    return ScrapeSample(
        taken_at_s=at_s,
        preemptions_total=zero(sample.preemptions_total),
        prompt_tokens_total=zero(sample.prompt_tokens_total),
        generation_tokens_total=zero(sample.generation_tokens_total),
        request_success_total=zero(sample.request_success_total),
        ttft=zeroed(sample.ttft),
        itl=zeroed(sample.itl),
        tpot=zeroed(sample.tpot),
        e2e=zeroed(sample.e2e),
        queue=zeroed(sample.queue),
    )
