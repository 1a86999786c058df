"""The store's sample path: insert throughput and the disk a recorded engine costs.

Target: >= 20,000 sample rows/s inserted in batches. Prints figures; asserts nothing.

    .venv/bin/python bench/bench_store.py [--runs 5] [--rows 50000]
"""

from __future__ import annotations

import argparse
import random
import shutil
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from llmconsole.db import MetricSample, Retention, Store

HOUR_S = 3600.0
DAY_S = 86_400.0


def _sample(engine: str, at_s: float, rng: random.Random, resolution_s: float = 1.0) -> MetricSample:
    """A row with every gauge filled, as a busy engine on a GPU host reports them."""
    ttft = rng.uniform(0.05, 0.4)
    return MetricSample(
        engine,
        at_s,
        resolution_s,
        running=float(rng.randint(0, 64)),
        waiting=float(rng.randint(0, 32)),
        kv_cache_usage=rng.random(),
        prompt_tok_s=rng.uniform(0, 20_000),
        generation_tok_s=rng.uniform(0, 5_000),
        p50_ttft_s=ttft,
        p99_ttft_s=ttft * 3,
        p50_itl_s=rng.uniform(0.01, 0.05),
        p99_itl_s=rng.uniform(0.05, 0.2),
        p50_tpot_s=rng.uniform(0.01, 0.05),
        p99_tpot_s=rng.uniform(0.05, 0.2),
        p50_e2e_s=rng.uniform(1, 5),
        p99_e2e_s=rng.uniform(5, 20),
        gpu_memory_bytes=rng.randint(60, 80) * 2**30,
        host_memory_bytes=rng.randint(4, 8) * 2**30,
    )


def _file_bytes(path: Path) -> int:
    """The main file's size with free pages dropped and the WAL folded in."""
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("VACUUM")
    raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    raw.close()
    return path.stat().st_size


def insert_throughput(work: Path, runs: int, rows: int, batch: int) -> list[float]:
    rng = random.Random(0)
    rates = []
    for run in range(runs):
        path = work / f"throughput-{batch}-{run}.db"
        samples = [_sample(f"engine-{i % 4}", float(i // 4), rng) for i in range(rows)]
        with Store.open(path) as store:
            t0 = time.perf_counter()
            for i in range(0, rows, batch):
                store.add_metric_samples(samples[i : i + batch])
            rates.append(rows / (time.perf_counter() - t0))
        path.unlink()
    return rates


def size_per_engine_hour(work: Path) -> dict[str, float]:
    rng = random.Random(1)
    empty = work / "empty.db"
    Store.open(empty).close()
    base = _file_bytes(empty)

    full = work / "full-hour.db"
    with Store.open(full) as store:
        store.add_metric_samples([_sample("chat", float(t), rng) for t in range(int(HOUR_S))])
    full_hour = _file_bytes(full) - base

    minutes = work / "minute-day.db"
    with Store.open(minutes) as store:
        # Recorded at full resolution, then compacted by the store itself, as the daemon would.
        start_s = 30 * DAY_S
        store.add_metric_samples([_sample("chat", start_s + t, rng) for t in range(int(DAY_S))])
        store.compact(start_s + DAY_S + HOUR_S)
        n_minutes = len(store.metric_samples("chat"))
    minute_day = _file_bytes(minutes) - base
    r = Retention()
    steady = full_hour * r.full_resolution_s / HOUR_S + minute_day * (r.keep_samples_s - r.full_resolution_s) / DAY_S
    return {"full_hour": full_hour, "minute_day": minute_day, "minute_rows": n_minutes, "steady": steady}


def open_time(work: Path, engines: int) -> tuple[float, int]:
    """How long Store.open takes on a week's worth of data (the read-only check included)."""
    rng = random.Random(2)
    path = work / "week.db"
    with Store.open(path) as store:
        for e in range(engines):
            week_minutes = int((7 * DAY_S - HOUR_S) / 60)
            store.add_metric_samples([_sample(f"e{e}", m * 60.0, rng, 60.0) for m in range(week_minutes)])
            store.add_metric_samples([_sample(f"e{e}", 7 * DAY_S - HOUR_S + t, rng) for t in range(int(HOUR_S))])
    size = _file_bytes(path)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        Store.open(path).close()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), size


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--rows", type=int, default=50_000)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="llmc-bench-store-"))
    try:
        print(f"sample inserts, {args.rows} rows per run, median of {args.runs} runs (target >= 20000 rows/s):")
        for batch in (10, 100, 1_000, 10_000):
            rates = insert_throughput(work, args.runs, args.rows, batch)
            print(
                f"  batch {batch:>6}: {statistics.median(rates):>10,.0f} rows/s "
                f"(min {min(rates):,.0f}, max {max(rates):,.0f})"
            )
        s = size_per_engine_hour(work)
        print("database size per engine (every gauge filled):")
        print(f"  1 s samples:         {s['full_hour'] / 1024:8.1f} KiB per engine-hour")
        print(
            f"  1 min after compact: {s['minute_day'] / 24 / 1024:8.1f} KiB per engine-hour "
            f"({s['minute_rows']} rows for a day)"
        )
        print(
            f"  default retention (1 h full + 7 d minutes): {s['steady'] / 2**20:.2f} MiB per engine, "
            f"{s['steady'] / (7 * 24) / 1024:.1f} KiB per engine-hour kept"
        )
        engines = 4
        t, size = open_time(work, engines)
        print(f"Store.open on a full week for {engines} engines ({size / 2**20:.1f} MiB): {t * 1000:.0f} ms")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
