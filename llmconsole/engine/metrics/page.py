"""A vLLM /metrics page turned into one immutable sample.

The page is Prometheus text. Only a handful of its ~90 families matter to the console, and the
scraper reads every engine once a second, so the page is cut down to those families before
prometheus_client's parser sees it: the parser is pure Python and costs ~20 us a line, and a
page has ~600 lines. Lines that are dropped still get a cheap shape check, so an HTML error page
or a JSON body is reported as malformed instead of passing as "no series".

Every vLLM series carries the labels model_name and engine (engine is the data-parallel rank;
releases before V1 have model_name only). Figures are summed across label sets, histograms
bucket-wise, so a data-parallel engine reads as one; its ranks' running, waiting and KV use are
kept beside, one RankSample each (ranks.py says what they are for).

Windowed figures (rates, percentiles) live in window.py; this module knows one page.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from llmconsole.engine.metrics.ranks import RankSample, rank_order


class MetricsParseError(ValueError):
    """The page is not Prometheus text (or not the part of it we read)."""


@dataclass(frozen=True)
class HistogramSample:
    """One histogram as scraped: cumulative counts per upper bound, the last bound is +Inf."""

    upper_bounds: tuple[float, ...]
    cumulative_counts: tuple[float, ...]
    count: float
    sum: float

    def minus(self, older: HistogramSample) -> HistogramSample | None:
        """What was observed between `older` and this one; None when the two cannot be compared.

        None means a different bucket layout (another vLLM release answered) or a count that
        went down (the engine restarted): the caller treats both as a counter reset.
        """
        if self.upper_bounds != older.upper_bounds:
            return None
        counts = tuple(a - b for a, b in zip(self.cumulative_counts, older.cumulative_counts, strict=True))
        if any(c < 0 for c in counts) or self.count < older.count:
            return None
        return HistogramSample(self.upper_bounds, counts, self.count - older.count, self.sum - older.sum)

    def quantile(self, q: float) -> float | None:
        return histogram_quantile(q, self.upper_bounds, self.cumulative_counts)

    def zeroed(self) -> HistogramSample:
        """The same layout with nothing observed: the baseline right after an engine restart."""
        return HistogramSample(self.upper_bounds, (0.0,) * len(self.upper_bounds), 0.0, 0.0)


@dataclass(frozen=True)
class CacheInfo:
    """Static KV cache facts from `vllm:cache_config_info`, which carries them as label values."""

    num_gpu_blocks: int | None = None
    block_size: int | None = None
    kv_cache_size_tokens: int | None = None
    kv_cache_memory_bytes: int | None = None
    cache_dtype: str | None = None
    gpu_memory_utilization: float | None = None
    labels: tuple[tuple[str, str], ...] = ()  # every label as scraped, for facts not named above

    def label(self, name: str) -> str | None:
        return dict(self.labels).get(name)


@dataclass(frozen=True)
class ScrapeSample:
    """One engine's /metrics page at one moment. A series the page lacks is None."""

    taken_at_s: float
    num_requests_running: float | None = None
    num_requests_waiting: float | None = None
    num_requests_swapped: float | None = None  # releases before 0.10 only (V0 CPU swap)
    kv_cache_usage: float | None = None  # fraction 0..1 of KV blocks in use
    cpu_cache_usage: float | None = None  # V0's CPU swap space in use, not the KV cache
    preemptions_total: float | None = None
    prompt_tokens_total: float | None = None
    generation_tokens_total: float | None = None
    request_success_total: float | None = None  # all finish reasons together
    ttft: HistogramSample | None = None
    itl: HistogramSample | None = None
    tpot: HistogramSample | None = None
    e2e: HistogramSample | None = None
    queue: HistogramSample | None = None
    cache: CacheInfo | None = None
    # Each data-parallel rank's gauges, in rank order, where the page has two ranks or more.
    ranks: tuple[RankSample, ...] = ()


COUNTER_FIELDS = ("preemptions_total", "prompt_tokens_total", "generation_tokens_total", "request_success_total")
HISTOGRAM_FIELDS = ("ttft", "itl", "tpot", "e2e", "queue")

# Field -> the names vLLM has used for it, newest first. A page from a release in a hand-over
# period carries both names with the same values; the newest present wins, they never add up.
#
# - `vllm:kv_cache_usage_perc`: V1 engine. `vllm:gpu_cache_usage_perc` is the V0 name (every
#   release up to 0.9.x); V1 kept it as a deprecated copy from 0.9.2, hidden behind
#   --show-hidden-metrics-for-version=0.10 in 0.11.x and dropped in 0.12.
# - `vllm:cpu_cache_usage_perc` and `vllm:num_requests_swapped`: V0 only (releases up to 0.10),
#   the CPU swap space that V1's recompute preemption no longer has. Swap usage is not KV usage,
#   so it keeps a field of its own rather than standing in for kv_cache_usage.
# - `vllm:inter_token_latency_seconds`: from 0.11. Before that the same histogram was
#   `vllm:time_per_output_token_seconds` (V0 and V1); 0.11 exports both and deprecates the old.
#   Per-request TPOT (`vllm:request_time_per_output_token_seconds`) is new in 0.11: no alias.
# - `vllm:request_queue_time_seconds`: V0 also had `vllm:time_in_queue_requests`, a duplicate
#   it deprecated and V1 never exported.
# - Counters are declared without `_total` and exposed with it; exporters that are not
#   prometheus_client, and untyped pages, may show the bare name, so both are accepted.
_GAUGES: dict[str, tuple[str, ...]] = {
    "num_requests_running": ("vllm:num_requests_running",),
    "num_requests_waiting": ("vllm:num_requests_waiting",),
    "num_requests_swapped": ("vllm:num_requests_swapped",),
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "cpu_cache_usage": ("vllm:cpu_cache_usage_perc",),
}
_COUNTERS: dict[str, tuple[str, ...]] = {
    "preemptions_total": ("vllm:num_preemptions",),
    "prompt_tokens_total": ("vllm:prompt_tokens",),
    "generation_tokens_total": ("vllm:generation_tokens",),
    "request_success_total": ("vllm:request_success",),
}
_HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "ttft": ("vllm:time_to_first_token_seconds",),
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "tpot": ("vllm:request_time_per_output_token_seconds",),
    "e2e": ("vllm:e2e_request_latency_seconds",),
    "queue": ("vllm:request_queue_time_seconds", "vllm:time_in_queue_requests"),
}
# Fractions are averaged over engines (data-parallel ranks have equal caches), never summed.
_AVERAGED_GAUGES = frozenset({"kv_cache_usage", "cpu_cache_usage"})
# The gauges kept per data-parallel rank too (as RankSample's fields).
_RANK_GAUGES = ("num_requests_running", "num_requests_waiting", "kv_cache_usage")
_CACHE_INFO = "vllm:cache_config_info"

# Sample name -> (field, part, rank). rank orders aliases, 0 is the current name.
_ROUTES: dict[str, tuple[str, str, int]] = {}
for _field, _names in _GAUGES.items():
    for _rank, _name in enumerate(_names):
        _ROUTES[_name] = (_field, "gauge", _rank)
for _field, _names in _COUNTERS.items():
    for _rank, _name in enumerate(_names):
        _ROUTES[_name + "_total"] = (_field, "counter", _rank)
        _ROUTES[_name] = (_field, "counter", _rank)
for _field, _names in _HISTOGRAMS.items():
    for _rank, _name in enumerate(_names):
        for _part in ("bucket", "count", "sum"):
            _ROUTES[f"{_name}_{_part}"] = (_field, _part, _rank)
_ROUTES[_CACHE_INFO] = ("cache", "info", 0)
# Names that keep a line: sample names plus HELP/TYPE family names (histogram and gauge
# families are named bare, counter families bare or with `_total`).
_KEPT_NAMES = frozenset(_ROUTES) | frozenset(n for names in _HISTOGRAMS.values() for n in names)

_NAME_START = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_:")


def _line_name(line: str) -> str:
    end = len(line)
    for stop in ("{", " "):
        i = line.find(stop, 0, end)
        if i != -1:
            end = i
    return line[:end]


def prefilter(text: str) -> str:
    """The page cut down to the lines of the families we read.

    Raises MetricsParseError when a line we drop is not shaped like a sample, a comment or a
    blank, which is what an HTML or JSON error body looks like.
    """
    kept: list[str] = []
    for line in text.split("\n"):
        if not line:
            continue
        if line[0] == "#":
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                end = line.find(" ", 7)
                if (line[7:end] if end != -1 else line[7:]) in _KEPT_NAMES:
                    kept.append(line)
            continue
        if _line_name(line) in _KEPT_NAMES:
            kept.append(line)
            continue
        head, sep, tail = line.rstrip().rpartition(" ")
        if not sep or line[0] not in _NAME_START:
            raise MetricsParseError(f"not a Prometheus sample line: {line[:80]!r}")
        try:
            float(tail)
        except ValueError:
            raise MetricsParseError(f"not a Prometheus sample line: {line[:80]!r}") from None
    kept.append("")
    return "\n".join(kept)


def _to_int(value: str | None) -> int | None:
    try:
        return int(float(value)) if value not in (None, "", "None") else None
    except ValueError:
        return None


def _to_float(value: str | None) -> float | None:
    try:
        return float(value) if value not in (None, "", "None") else None
    except ValueError:
        return None


def _cache_info(labels: dict[str, str]) -> CacheInfo:
    dtype = labels.get("cache_dtype")
    return CacheInfo(
        num_gpu_blocks=_to_int(labels.get("num_gpu_blocks")),
        block_size=_to_int(labels.get("block_size")),
        kv_cache_size_tokens=_to_int(labels.get("kv_cache_size_tokens")),
        kv_cache_memory_bytes=_to_int(labels.get("kv_cache_memory_bytes")),
        cache_dtype=dtype if dtype not in (None, "", "None") else None,
        gpu_memory_utilization=_to_float(labels.get("gpu_memory_utilization")),
        labels=tuple(sorted(labels.items())),
    )


class _Histo:
    __slots__ = ("buckets", "count", "sum")

    def __init__(self) -> None:
        self.buckets: dict[float, float] = {}
        self.count: float | None = None
        self.sum = 0.0

    def freeze(self) -> HistogramSample | None:
        if not self.buckets:
            return None
        bounds = sorted(self.buckets)
        counts = []
        running = 0.0
        for b in bounds:
            # Cumulative counts never fall; float noise in a summed page must not make them.
            running = max(running, self.buckets[b])
            counts.append(running)
        if bounds[-1] != math.inf:
            # Prometheus requires +Inf; a page without it still has a total in _count.
            bounds.append(math.inf)
            counts.append(max(running, self.count or 0.0))
        count = self.count if self.count is not None else counts[-1]
        return HistogramSample(tuple(bounds), tuple(counts), count, self.sum)


def _families(text: str) -> Iterator[Metric]:
    try:
        yield from text_string_to_metric_families(text)
    except MetricsParseError:
        raise
    except Exception as exc:  # the parser raises ValueError, IndexError, KeyError ...
        raise MetricsParseError(f"malformed /metrics page: {exc}") from exc


# Series key ("name{labels}") -> (sample name, labels) as prometheus_client parsed it. An engine
# exports the same few hundred series on every scrape; only their values change. So the parser
# reads each distinct series once, and later pages cost a dict lookup and a float() per line:
# that is what brings a page under 1 ms where a full parse takes several.
_SERIES: dict[str, tuple[str, dict[str, str]]] = {}
_SERIES_MAX = 20_000  # label churn (e.g. a new model name per restart) must not grow it forever


def _series(key: str) -> tuple[str, dict[str, str]]:
    hit = _SERIES.get(key)
    if hit is None:
        samples = [s for fam in _families(key + " 0\n") for s in fam.samples]
        if len(samples) != 1:
            raise MetricsParseError(f"not one Prometheus sample: {key[:80]!r}")
        hit = (samples[0].name, dict(samples[0].labels))
        if len(_SERIES) >= _SERIES_MAX:
            _SERIES.clear()
        _SERIES[key] = hit
    return hit


def _samples(kept: str) -> Iterable[tuple[str, dict[str, str], float]]:
    for line in kept.split("\n"):
        if not line or line[0] == "#":
            continue
        brace = line.find("}")
        if brace != -1:
            key, rest = line[: brace + 1], line[brace + 1 :]
        else:
            key, _, rest = line.partition(" ")
        parts = rest.split()
        if not parts or len(parts) > 2:  # value, and optionally a timestamp
            raise MetricsParseError(f"not a Prometheus sample line: {line[:80]!r}")
        try:
            value = float(parts[0])
        except ValueError:
            raise MetricsParseError(f"bad value in {line[:80]!r}") from None
        name, labels = _series(key)
        yield name, labels, value


def parse_metrics(text: str, taken_at_s: float) -> ScrapeSample:
    """The page as one ScrapeSample. taken_at_s is the scraper's clock (monotonic is best)."""
    # field -> rank -> accumulated value(s)
    gauges: dict[str, dict[int, list[float]]] = {}
    # field -> alias rank -> engine label -> value(s), for the gauges kept per rank
    per_engine: dict[str, dict[int, dict[str, list[float]]]] = {}
    counters: dict[str, dict[int, float]] = {}
    histos: dict[str, dict[int, _Histo]] = {}
    cache: CacheInfo | None = None
    cache_engine: str | None = None

    for name, labels, value in _samples(prefilter(text)):
        route = _ROUTES.get(name)
        if route is None:
            continue
        field, part, rank = route
        if part == "gauge":
            if not math.isnan(value):
                gauges.setdefault(field, {}).setdefault(rank, []).append(value)
                if field in _RANK_GAUGES:
                    by_engine = per_engine.setdefault(field, {}).setdefault(rank, {})
                    by_engine.setdefault(labels.get("engine", ""), []).append(value)
        elif part == "counter":
            by_rank = counters.setdefault(field, {})
            by_rank[rank] = by_rank.get(rank, 0.0) + value
        elif part == "info":
            engine = labels.get("engine", "")
            # With several data-parallel ranks, rank 0's facts stand for the engine.
            if cache is None or engine < (cache_engine or ""):
                cache, cache_engine = _cache_info(dict(labels)), engine
        else:
            h = histos.setdefault(field, {}).setdefault(rank, _Histo())
            if part == "bucket":
                le = labels.get("le")
                if le is None:
                    raise MetricsParseError(f"{name} without an le label")
                try:
                    bound = float(le)
                except ValueError:
                    raise MetricsParseError(f"{name} with le={le!r}") from None
                h.buckets[bound] = h.buckets.get(bound, 0.0) + value
            elif part == "count":
                h.count = (h.count or 0.0) + value
            else:
                h.sum += value

    # Of each field's aliases, the newest present (lowest rank) wins.
    figures: dict[str, float] = {}
    for field, values_by_rank in gauges.items():
        values = values_by_rank[min(values_by_rank)]
        figures[field] = sum(values) / len(values) if field in _AVERAGED_GAUGES else sum(values)
    for field, total_by_rank in counters.items():
        figures[field] = total_by_rank[min(total_by_rank)]
    hists = {field: by_rank[min(by_rank)].freeze() for field, by_rank in histos.items()}
    return ScrapeSample(
        taken_at_s=taken_at_s,
        num_requests_running=figures.get("num_requests_running"),
        num_requests_waiting=figures.get("num_requests_waiting"),
        num_requests_swapped=figures.get("num_requests_swapped"),
        kv_cache_usage=figures.get("kv_cache_usage"),
        cpu_cache_usage=figures.get("cpu_cache_usage"),
        preemptions_total=figures.get("preemptions_total"),
        prompt_tokens_total=figures.get("prompt_tokens_total"),
        generation_tokens_total=figures.get("generation_tokens_total"),
        request_success_total=figures.get("request_success_total"),
        ttft=hists.get("ttft"),
        itl=hists.get("itl"),
        tpot=hists.get("tpot"),
        e2e=hists.get("e2e"),
        queue=hists.get("queue"),
        cache=cache,
        ranks=_ranks(per_engine),
    )


def _ranks(per_engine: dict[str, dict[int, dict[str, list[float]]]]) -> tuple[RankSample, ...]:
    """One RankSample per `engine` label (the newest alias of each gauge, merged over the rank's
    label sets as the engine's figures are); none for a page of one rank."""
    newest = {f: by_alias[min(by_alias)] for f, by_alias in per_engine.items()}
    engines = {e for by_engine in newest.values() for e in by_engine}
    if len(engines) < 2:
        return ()

    def value(field: str, engine: str) -> float | None:
        values = newest.get(field, {}).get(engine)
        if not values:
            return None
        return sum(values) / len(values) if field in _AVERAGED_GAUGES else sum(values)

    return tuple(
        RankSample(
            rank=e,
            running=value("num_requests_running", e),
            waiting=value("num_requests_waiting", e),
            kv_cache_usage=value("kv_cache_usage", e),
        )
        for e in sorted(engines, key=rank_order)
    )


def histogram_quantile(
    q: float, upper_bounds: tuple[float, ...] | list[float], cumulative_counts: tuple[float, ...] | list[float]
) -> float | None:
    """The q-quantile of a bucketed distribution, the way PromQL's histogram_quantile does it.

    Observations are assumed spread evenly inside their bucket, so the answer is a linear
    interpolation between the bucket's bounds (the first bucket starts at 0). A quantile that
    falls in the +Inf bucket answers the highest finite bound: nothing better is known. None when
    nothing was observed or the layout is unusable (no +Inf bucket, fewer than two buckets).
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile {q} outside [0, 1]")
    n = len(upper_bounds)
    if n != len(cumulative_counts):
        raise ValueError("upper_bounds and cumulative_counts differ in length")
    if n < 2 or upper_bounds[-1] != math.inf:
        return None
    counts = []
    running = 0.0
    for c in cumulative_counts:
        running = max(running, c)
        counts.append(running)
    total = counts[-1]
    if total <= 0:
        return None
    rank = q * total
    b = next((i for i in range(n - 1) if counts[i] >= rank), n - 1)
    if b == n - 1:
        return upper_bounds[n - 2]
    if b == 0 and upper_bounds[0] <= 0:
        return upper_bounds[0]
    start = 0.0 if b == 0 else upper_bounds[b - 1]
    end = upper_bounds[b]
    below = 0.0 if b == 0 else counts[b - 1]
    in_bucket = counts[b] - below
    if in_bucket <= 0:
        return start
    return start + (end - start) * ((rank - below) / in_bucket)
