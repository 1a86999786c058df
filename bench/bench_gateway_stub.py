"""Benchmark: the gateway's own cost and ceiling, against a stub upstream that answers at once.

On a shared two-core box a real engine's TTFT moves by more than the gateway could ever add,
so bench_gateway_overhead.py can only bound the overhead as loosely as the noise allows. Here
the upstream is a local stub (its own process) that streams canned chunks with no delay, so
what remains is the door itself: the added TTFT of one request, alternating direct and via the
gateway, and how many chunks per second the gateway can pass at 32 streams (its ceiling, to
set against the engines' token rates).

    .venv/bin/python bench/bench_gateway_stub.py
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aiohttp import web
from bench_gateway_parts import (
    client_session,
    free_port,
    one_request,
    request_body,
    start_gateway,
    stop,
    stream_loop,
    wait_http,
)


def serve_stub(port: int, chunks: int) -> None:
    piece = b'data: {"choices": [{"index": 0, "text": "tok", "finish_reason": null}]}\n\n'

    async def completions(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _ in range(chunks):
            await resp.write(piece)
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/health", health)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


async def alternating(direct: str, gateway: str, pairs: int):
    body = request_body(8, 1)
    d, g = [], []
    async with client_session() as http:
        for k in range(pairs):
            for url, out in ((direct, d), (gateway, g)) if k % 2 == 0 else ((gateway, g), (direct, d)):
                r = await one_request(http, url, body)
                out.append(r.ttft_s * 1000)
    return d, g


async def ceiling(url: str, streams: int, seconds: float) -> float:
    records: list = []
    async with client_session() as http:
        began = time.monotonic()
        await asyncio.gather(
            *(stream_loop(http, url, request_body(8, 1), began + seconds, records) for _ in range(streams))
        )
        span = time.monotonic() - began
    return sum(r.chunks for r in records if r.status == 200) / span


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", type=int, default=400)
    ap.add_argument("--chunks", type=int, default=64, help="chunks per streamed answer")
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--stub-port", type=int)
    ns = ap.parse_args()
    if ns.stub_port:
        serve_stub(ns.stub_port, ns.chunks)
        return
    port = free_port()
    stub = subprocess.Popen(
        [sys.executable, __file__, "--stub-port", str(port), "--chunks", str(ns.chunks)], start_new_session=True
    )
    direct = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{direct}/health", 30, stub)
        with tempfile.TemporaryDirectory(prefix="bench-gw-stub-") as tmp:
            gw, gateway = start_gateway(
                direct, Path(tmp), window=256, controlled=False, target_ms=1000.0, max_window=256
            )
            gateway += "/g/g"
            try:
                asyncio.run(alternating(direct, gateway, 20))  # warm-up
                d, g = asyncio.run(alternating(direct, gateway, ns.pairs))
                rd = asyncio.run(ceiling(direct, 32, ns.seconds))
                rg = asyncio.run(ceiling(gateway, 32, ns.seconds))
            finally:
                stop(gw)
    finally:
        stop(stub)
    md, mg = statistics.median(d), statistics.median(g)
    print(f"stub upstream, {ns.chunks} chunks per answer; gateway in its own process")
    print(
        f"TTFT, one stream, {ns.pairs} pairs alternating: direct {md:.3f} ms, via gateway {mg:.3f} ms, "
        f"added {mg - md:+.3f} ms (target <= 1 ms)"
    )
    print(
        f"ceiling, 32 streams for {ns.seconds:.0f} s: direct {rd:,.0f} chunks/s, via gateway {rg:,.0f} chunks/s "
        f"(one chunk is about one token)"
    )


if __name__ == "__main__":
    main()
