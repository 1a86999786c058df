"""Percentiles kept in the store carry the histogram bucket they fell in, through the recorder,
compaction, the export's CSV and JSON, its p99 plot and its report.

The bucket layouts are vLLM's own, read from a page a real engine served (tests/fixtures/metrics):
its end-to-end histogram's first bucket is 0-300 ms, so eight requests that all finished under
300 ms have a p99 histogram_quantile interpolates to 297 ms, a figure the data cannot tell from
10 ms. Whatever a person reads says `< 300 ms`.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import re
import xml.etree.ElementTree as ET

import pytest

from llmconsole.db import MetricSample, Store
from llmconsole.db.export import export_bundle
from llmconsole.db.recorder import Recorder
from llmconsole.engine.metrics.page import HistogramSample, ScrapeSample, parse_metrics
from llmconsole.engine.metrics.window import MetricsWindow
from llmconsole.engine.status import EngineState, EngineStatus
from tests.support.paths import FIXTURES

T0 = 1_767_000_000.0
SVG = "{http://www.w3.org/2000/svg}"


def _vllm_page() -> ScrapeSample:
    return parse_metrics((FIXTURES / "metrics" / "load_seq_0.txt").read_text(), T0)


def _observed(layout: HistogramSample, seconds: list[float]) -> HistogramSample:
    """`layout`'s buckets (vLLM's), holding just these observations."""
    bounds = layout.upper_bounds
    counts = tuple(float(sum(1 for x in seconds if x <= b)) for b in bounds)
    return HistogramSample(bounds, counts, float(len(seconds)), sum(seconds))


def _window_after(e2e_s: list[float], ttft_s: list[float]) -> tuple[MetricsWindow, ScrapeSample]:
    page = _vllm_page()
    assert page.e2e is not None and page.ttft is not None
    assert page.e2e.upper_bounds[:3] == (0.3, 0.5, 0.8) and page.e2e.upper_bounds[-2:] == (7680.0, math.inf)
    w = MetricsWindow(rate_window_s=10, percentile_window_s=60)
    zero = dataclasses.replace(page, e2e=_observed(page.e2e, []), ttft=_observed(page.ttft, []))
    w.add(zero)
    return w, dataclasses.replace(
        page, taken_at_s=T0 + 5, e2e=_observed(page.e2e, e2e_s), ttft=_observed(page.ttft, ttft_s)
    )


def _status(metrics) -> EngineStatus:
    return EngineStatus(
        name="chat",
        state=EngineState.READY,
        config_id="c0ffee000001",
        model="m",
        served_model_name="m",
        device="cpu",
        metrics=metrics,
    )


@pytest.fixture
def store(tmp_path):
    s = Store.open(tmp_path / "llmconsole.db")
    yield s
    s.close()


def _record(store: Store, at_s: float, e2e_s: list[float], ttft_s: list[float]) -> None:
    w, page = _window_after(e2e_s, ttft_s)
    snap = w.add(page)
    assert Recorder(store).sample([_status(snap)], at_s=at_s) == 1


def test_eight_requests_under_300_ms_are_stored_exported_and_reported_as_under_300_ms(store, tmp_path):
    fast = [0.01, 0.02, 0.05, 0.08, 0.1, 0.12, 0.2, 0.25]
    _record(store, T0 + 10, fast, [0.025] * 8)

    (s,) = store.metric_samples("chat")
    # The interpolation stays for machines; the bucket is stored beside it.
    assert s.p99_e2e_s == pytest.approx(0.297) and s.p50_e2e_s == pytest.approx(0.15)
    assert (s.p99_e2e_lower_s, s.p99_e2e_upper_s) == (0.0, 0.3) == (s.p50_e2e_lower_s, s.p50_e2e_upper_s)
    assert (s.p99_ttft_lower_s, s.p99_ttft_upper_s) == (0.02, 0.04)
    assert s.percentile("p99_e2e_s").text() == "< 300 ms" and s.percentile("p99_ttft_s").text() == "20-40 ms"
    assert (s.p99_itl_lower_s, s.p99_itl_upper_s) == (None, None)  # no figure, no bucket

    out = tmp_path / "bundle"
    export_bundle(store, out, since_s=T0, until_s=T0 + 60)

    (row,) = csv.DictReader(open(out / "metric_samples.csv"))
    assert (row["p99_e2e_lower_s"], row["p99_e2e_upper_s"]) == ("0.0", "0.3")
    assert float(row["p99_e2e_s"]) == pytest.approx(0.297)
    header = next(csv.reader(open(out / "metric_samples.csv")))
    i = header.index("p99_e2e_s")
    assert header[i : i + 3] == ["p99_e2e_s", "p99_e2e_lower_s", "p99_e2e_upper_s"]  # the bucket beside its figure
    assert (row["p99_itl_lower_s"], row["p99_itl_upper_s"]) == ("", "")

    (j,) = [json.loads(line) for line in (out / "metric_samples.jsonl").read_text().splitlines()]
    assert (j["p99_e2e_lower_s"], j["p99_e2e_upper_s"], j["p99_ttft_upper_s"]) == (0.0, 0.3, 0.04)

    md = (out / "report.md").read_text()
    over_time = md[md.index("## Over time") :]
    assert "| chat | 20-40 ms | — | — | < 300 ms |" in over_time
    assert "297" not in md and "150 ms" not in md

    svg = (out / "plots" / "p99_latency.svg").read_text()
    root = ET.fromstring(svg)
    legend = [t.text for t in root.iter(f"{SVG}text")]
    assert "chat E2E at most" in legend and "chat TTFT at most" in legend
    assert "297" not in svg and not any("no bucket" in (t or "") for t in legend)
    assert any("bucket" in (t or "") for t in legend)  # the title says what is drawn


def test_a_p99_past_the_last_bound_is_open_ended_everywhere(store, tmp_path):
    _record(store, T0 + 10, [0.2] * 7 + [8000.0], [0.025] * 8)
    (s,) = store.metric_samples("chat")
    assert (s.p99_e2e_lower_s, s.p99_e2e_upper_s) == (7680.0, None)
    assert s.percentile("p99_e2e_s").text() == "> 7,680 s"

    out = tmp_path / "bundle"
    export_bundle(store, out, since_s=T0, until_s=T0 + 60)
    (row,) = csv.DictReader(open(out / "metric_samples.csv"))
    assert (row["p99_e2e_lower_s"], row["p99_e2e_upper_s"]) == ("7680.0", "inf")
    (j,) = [json.loads(line) for line in (out / "metric_samples.jsonl").read_text().splitlines()]
    assert (j["p99_e2e_lower_s"], j["p99_e2e_upper_s"]) == (7680.0, None)  # JSON has no infinity
    assert "| chat | 20-40 ms | — | — | > 7,680 s |" in (out / "report.md").read_text()
    legend = [t.text for t in ET.parse(out / "plots" / "p99_latency.svg").getroot().iter(f"{SVG}text")]
    assert "chat E2E more than" in legend


def test_samples_from_before_buckets_were_kept_are_shown_as_before_and_marked(store, tmp_path):
    store.add_metric_samples([MetricSample("chat", T0 + 1, p99_e2e_s=0.297)])  # as schema v2 stored it
    out = tmp_path / "bundle"
    export_bundle(store, out, since_s=T0, until_s=T0 + 60)
    (row,) = csv.DictReader(open(out / "metric_samples.csv"))
    assert (row["p99_e2e_s"], row["p99_e2e_lower_s"], row["p99_e2e_upper_s"]) == ("0.297", "", "")
    md = (out / "report.md").read_text()
    assert "1 sample without bucket, worst 297 ms interpolated" in md
    legend = [t.text for t in ET.parse(out / "plots" / "p99_latency.svg").getroot().iter(f"{SVG}text")]
    assert "chat E2E no bucket" in legend


def test_the_p99_plot_draws_the_top_of_the_bucket(store, tmp_path):
    _record(store, T0 + 10, [0.2] * 8, [0.025] * 8)  # < 300 ms
    _record(store, T0 + 20, [0.9] * 8, [0.025] * 8)  # 0.8-1 s
    out = tmp_path / "bundle"
    export_bundle(store, out, since_s=T0, until_s=T0 + 60)
    root = ET.parse(out / "plots" / "p99_latency.svg").getroot()
    ticks = {t.text: float(t.get("y")) - 4 for t in root.iter(f"{SVG}text") if t.get("text-anchor") == "end"}
    lines = list(root.iter(f"{SVG}polyline"))
    e2e = lines[-1].get("points").split()
    ys = [float(p.split(",")[1]) for p in e2e]
    # y = top of the plot for 1.0 s, and the 0.3 s point sits 30 % of the way up from 0.
    y0, y1 = ticks["0"], ticks["1"]
    assert ys[0] == pytest.approx(y0 + 0.3 * (y1 - y0), abs=0.15) and ys[1] == pytest.approx(y1, abs=0.15)
    assert re.search(r"seconds \(p99 at most\)", ET.tostring(root, encoding="unicode"))
