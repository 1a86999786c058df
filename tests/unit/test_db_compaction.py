"""Retention: samples older than an hour fold into minutes (max for p99 and KV), old ones expire."""

from __future__ import annotations

import pytest

from llmconsole.db import MetricSample, Retention, Store, WindowSample

DAY_S = 86_400.0
NOW_S = 10 * DAY_S  # a round "now": the hour before it is 9 d 23 h .. 10 d


@pytest.fixture
def store(tmp_path):
    s = Store.open(tmp_path / "llmconsole.db")
    yield s
    s.close()


def _three_old_minutes(engine: str, start_s: float) -> list[MetricSample]:
    """180 one-second samples with values whose minute averages and maxima are easy to check."""
    rows = []
    for i in range(180):
        rows.append(
            MetricSample(
                engine,
                start_s + i,
                running=float(i),
                waiting=None,  # a gauge the engine never reported
                kv_cache_usage=(i % 60) / 60,
                p50_ttft_s=0.01 * i,
                p99_ttft_s=0.02 * i if i % 7 else None,  # some samples missing
                generation_tok_s=100.0,
                gpu_memory_bytes=1000 + i,
            )
        )
    return rows


def test_downsampling_math(store):
    old_start_s = NOW_S - 2 * 3600  # two hours ago, on a minute boundary
    store.add_metric_samples(_three_old_minutes("chat", old_start_s))
    recent = [MetricSample("chat", NOW_S - 100 + i, running=5.0) for i in range(50)]
    store.add_metric_samples(recent)

    result = store.compact(NOW_S)
    assert result.raw_rows_downsampled == 180 and result.downsampled_rows_written == 3
    assert result.samples_expired == 0

    rows = store.metric_samples("chat")
    coarse = [r for r in rows if r.resolution_s == 60.0]
    assert [r.at_s for r in coarse] == [old_start_s, old_start_s + 60, old_start_s + 120]
    for m, r in enumerate(coarse):
        idx = range(60 * m, 60 * m + 60)
        assert r.running == pytest.approx(sum(idx) / 60)  # 29.5, 89.5, 149.5
        assert r.p50_ttft_s == pytest.approx(0.01 * sum(idx) / 60)
        assert r.kv_cache_usage == pytest.approx(59 / 60)  # the fullest moment, not the mean
        assert r.p99_ttft_s == pytest.approx(0.02 * max(i for i in idx if i % 7))  # max of those present
        assert r.waiting is None  # missing stays missing
        assert r.generation_tok_s == pytest.approx(100.0)
        assert r.gpu_memory_bytes == round(1000 + sum(idx) / 60 + 1e-9)  # whole bytes
        assert isinstance(r.gpu_memory_bytes, int)
    assert coarse[0].running == pytest.approx(29.5)
    # The last hour is untouched, sample for sample.
    assert [r for r in rows if r.resolution_s == 1.0] == recent

    again = store.compact(NOW_S)
    assert (again.raw_rows_downsampled, again.downsampled_rows_written) == (0, 0)
    assert store.metric_samples("chat") == rows


def test_a_bucket_reaching_into_the_last_hour_is_not_split(store):
    boundary_s = NOW_S - 3600  # minute-aligned
    store.add_metric_samples([MetricSample("chat", boundary_s - 30 + i, running=1.0) for i in range(60)])
    store.compact(NOW_S)
    rows = store.metric_samples("chat")
    assert len(rows) == 31 and {r.resolution_s for r in rows} == {60.0, 1.0}
    assert rows[0].at_s == boundary_s - 60 and rows[0].resolution_s == 60.0  # the whole old minute
    # Half a minute later the hour boundary is still inside the same minute bucket: nothing more folds.
    store.compact(NOW_S + 30)
    assert len(store.metric_samples("chat")) == 31
    store.compact(NOW_S + 60)
    assert [r.resolution_s for r in store.metric_samples("chat")] == [60.0, 60.0]


def test_engines_fold_separately(store):
    start_s = NOW_S - 3 * 3600
    store.add_metric_samples([MetricSample("a", start_s + i, running=1.0) for i in range(60)])
    store.add_metric_samples([MetricSample("b", start_s + i, running=3.0) for i in range(60)])
    store.compact(NOW_S)
    assert [(r.engine, r.running) for r in store.metric_samples()] == [("a", 1.0), ("b", 3.0)]


def test_expiry_beyond_retention(store):
    store.add_metric_samples(
        [
            MetricSample("chat", NOW_S - 8 * DAY_S, running=1.0),  # past the week: gone
            MetricSample("chat", NOW_S - 6 * DAY_S, running=2.0),  # folded, kept
            MetricSample("chat", NOW_S - 60, running=3.0),  # recent, kept as is
        ]
    )
    store.add_window_trace(
        [
            WindowSample("g", NOW_S - 2 * DAY_S, window=4),
            WindowSample("g", NOW_S - 100, window=8),
        ]
    )
    cid = "c0ffee000002"
    rid = store.run_started("chat", cid, spec_public={}, at=NOW_S - 30 * DAY_S)
    action = store.record_action("start", engine="chat", to_config_id=cid, at=NOW_S - 30 * DAY_S)
    sweep = store.create_sweep("chat", {}, {}, {}, at=NOW_S - 30 * DAY_S)

    result = store.compact(NOW_S)
    assert (result.samples_expired, result.trace_rows_expired) == (1, 1)
    assert [(r.running, r.resolution_s) for r in store.metric_samples("chat")] == [(2.0, 60.0), (3.0, 1.0)]
    assert [w.window for w in store.window_trace("g")] == [8.0]
    # History is never compacted away.
    assert store.config(cid) and store.run(rid) and store.action(action) and store.sweep(sweep)


def test_custom_retention(tmp_path):
    r = Retention(full_resolution_s=60, downsample_to_s=10, keep_samples_s=600, keep_trace_s=600)
    with Store.open(tmp_path / "x.db", retention=r) as store:
        store.add_metric_samples([MetricSample("e", 1000.0 + i, kv_cache_usage=i / 100) for i in range(100)])
        out = store.compact(1100.0)
        # Fold before floor((1100 - 60) / 10) * 10 = 1040: rows 1000..1039 become 4 ten-second rows.
        assert (out.raw_rows_downsampled, out.downsampled_rows_written) == (40, 4)
        coarse = [s for s in store.metric_samples("e") if s.resolution_s == 10]
        assert [s.kv_cache_usage for s in coarse] == pytest.approx([0.09, 0.19, 0.29, 0.39])
    with pytest.raises(ValueError):
        Retention(full_resolution_s=3600, keep_samples_s=60)
    with pytest.raises(ValueError):
        Retention(downsample_to_s=0)


def _bucketed(at_s: float, **fields: tuple[float, float, float | None]) -> MetricSample:
    """A sample whose percentiles carry buckets of vLLM's end-to-end layout (0.3, 0.5, 0.8, ...):
    field=(figure, lower, upper), upper None past the last finite bound."""
    values: dict[str, float | None] = {}
    for name, (value, lower, upper) in fields.items():
        stem = name.removesuffix("_s")
        values |= {name: value, f"{stem}_lower_s": lower, f"{stem}_upper_s": upper}
    return MetricSample("chat", at_s, **values)


def test_a_folded_percentile_keeps_the_bucket_of_the_figure_it_keeps(store):
    start_s = NOW_S - 2 * 3600
    minute = [_bucketed(start_s + i, p99_e2e_s=(0.297, 0.0, 0.3), p50_e2e_s=(0.15, 0.0, 0.3)) for i in range(59)]
    minute.append(_bucketed(start_s + 59, p99_e2e_s=(0.62, 0.5, 0.8), p50_e2e_s=(0.4, 0.3, 0.5)))
    # The next minute: one p99 past vLLM's last finite bound (7680 s).
    open_ended = [_bucketed(start_s + 60 + i, p99_e2e_s=(1.2, 1.0, 1.5)) for i in range(30)]
    open_ended.append(_bucketed(start_s + 90, p99_e2e_s=(9000.0, 7680.0, None)))
    # And a minute that mixes a sample stored before buckets were kept: its bounds are unknown.
    mixed = [_bucketed(start_s + 120, p99_e2e_s=(0.297, 0.0, 0.3)), MetricSample("chat", start_s + 121, p99_e2e_s=0.7)]
    store.add_metric_samples(minute + open_ended + mixed)
    store.compact(NOW_S)

    first, second, third = store.metric_samples("chat")
    assert first.resolution_s == 60.0
    # The worst p99 (the minute's maximum) with its own bucket, 500-800 ms: not 0-800 ms.
    assert first.p99_e2e_s == pytest.approx(0.62) and (first.p99_e2e_lower_s, first.p99_e2e_upper_s) == (0.5, 0.8)
    assert first.percentile("p99_e2e_s").text() == "500-800 ms"
    # The mean p50 lies between its least and greatest figure: in [least lower, greatest upper].
    assert (first.p50_e2e_lower_s, first.p50_e2e_upper_s) == (0.0, 0.5)
    assert first.p50_e2e_lower_s <= first.p50_e2e_s <= first.p50_e2e_upper_s
    assert second.p99_e2e_s == 9000.0 and (second.p99_e2e_lower_s, second.p99_e2e_upper_s) == (7680.0, None)
    assert second.percentile("p99_e2e_s").text() == "> 7,680 s"
    assert third.p99_e2e_s == 0.7 and not third.bounds_recorded("p99_e2e_s")
    assert (third.p99_e2e_lower_s, third.p99_e2e_upper_s) == (None, None)
    assert (first.p99_ttft_lower_s, first.p99_ttft_upper_s) == (None, None)  # no figure, no bucket
