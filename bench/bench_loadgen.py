"""The load generator's own ceiling and timing overhead, against a fast local stub server.

    .venv/bin/python bench/bench_loadgen.py [--requests 20000] [--concurrency 64] [--runs 3]

(1) Ceiling: requests/s the generator completes against a stub that answers instantly (target
    >= 2,000 req/s on 2 cores, the stub sharing them), and the generator's CPU per request.
(2) Overhead: against a stub that waits a known time before the first chunk and between chunks,
    how much the generator's measured TTFT and inter-token gaps exceed the truth.
Prints medians over --runs; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from llmconsole.engine.load.generator import run_load
from llmconsole.engine.load.workload import Workload, load_tokenizer, plan_requests

HERE = Path(__file__).resolve().parent
MODEL = Path(__file__).resolve().parent.parent / ".models" / "tiny"


def stub(*args: str) -> tuple[subprocess.Popen, str]:
    p = subprocess.Popen(
        [sys.executable, str(HERE / "bench_loadgen_stub.py"), "--port", "0", *args], stdout=subprocess.PIPE, text=True
    )
    port = int(p.stdout.readline().split()[-1])
    return p, f"http://127.0.0.1:{port}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=4)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--model", default=str(MODEL), help="the tokenizer that builds the prompts")
    a = ap.parse_args()
    tok = load_tokenizer(a.model)

    p, url = stub()
    try:
        wl = Workload.closed(a.concurrency, a.requests, 16, a.output_len, warmup_requests=a.concurrency)
        plan = plan_requests(wl, tok)
        rates, cpu_us = [], []
        for _ in range(a.runs):
            c0 = time.process_time()
            r = asyncio.run(run_load(url, "stub", wl, plan=plan))
            cpu_us.append((time.process_time() - c0) / (a.requests + a.concurrency) * 1e6)
            assert r.summary.completed == a.requests, r.summary.errors_by_kind
            rates.append(r.summary.request_throughput_req_s)
    finally:
        p.kill()
    load1 = os.getloadavg()[0]
    print(f"host: {os.cpu_count()} cores, load average {load1:.1f} (others' work shares these cores)")
    print(
        f"ceiling: {statistics.median(rates):,.0f} req/s median of {a.runs} "
        f"(runs: {', '.join(f'{x:,.0f}' for x in rates)}; target >= 2,000), concurrency {a.concurrency}, "
        f"{a.output_len} chunks per request"
    )
    print(
        f"generator CPU per request: {statistics.median(cpu_us):.0f} us (median), i.e. "
        f"{1e6 / statistics.median(cpu_us):,.0f} req/s for each core it has to itself"
    )

    first_ms, gap_ms = 20.0, 2.0
    p, url = stub("--first-delay-ms", str(first_ms), "--gap-ms", str(gap_ms))
    try:
        wl = Workload.closed(8, 400, 16, 16, warmup_requests=8)
        plan = plan_requests(wl, tok)
        ttft, itl = [], []
        for _ in range(a.runs):
            s = asyncio.run(run_load(url, "stub", wl, plan=plan)).summary
            ttft.append(s.ttft.median_ms - first_ms)
            itl.append(s.itl.median_ms - gap_ms)
    finally:
        p.kill()
    print(
        f"timing overhead (measured minus true, median): TTFT +{statistics.median(ttft):.2f} ms "
        f"(true {first_ms:g} ms), inter-token gap +{statistics.median(itl):.2f} ms (true {gap_ms:g} ms); "
        f"asyncio timers add their own ~1 ms granularity to the stub's delays"
    )


if __name__ == "__main__":
    main()
