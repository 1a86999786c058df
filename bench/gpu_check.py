"""One prepared check of the CUDA decode kernel on a machine with an NVIDIA GPU, in under five
minutes. Not used by the test suite (the CPU suite checks the kernel's arithmetic through
llmconsole/kernels/cuda_emulation.py; this is what only a GPU can tell).

    bench/gpu_check.sh [--quick] [--no-variants] [--device 0] [--triton-source auto|installed|copy]
                       [--budget-s 270] [--json out.json]

1. Build: llmconsole/kernels/csrc/paged_attention.cu with nvcc for the GPU it finds (a shared
   library called through ctypes, no torch extension), and beside it, in parallel, the
   build-option variants (head 128 only): shared-memory-tree merge, the largest shared-memory
   carve-out, a register cap, fast math, 256 threads, a 2-stage ring.
2. Correctness on vLLM's CUDA KV layout, against the float64 reference computed on the GPU:
   bf16, fp16 and fp8 e4m3 caches with scales; head sizes 64/128/256; block sizes 16/32/64; GQA
   ratios 1 to 24; every KVCacheLayout; ragged batches with contexts from 0 to 16K; split
   counts from 1 to 256 and the chooser's; the query a strided slice of a qkv buffer. Every
   output buffer starts as NaN and has rows past the batch that must stay NaN; every element is
   compared; NaN or Inf fails. A CUDA graph captured with one split count is replayed on a new
   batch and checked. vLLM's Triton op is checked on the same inputs. Each variant runs the
   head-128 cases. Any miss fails the run loudly (exit 1).
3. The GPU's read bandwidth: a bf16 sum over 4 GiB, eager and as CUDA-graph replays (best).
4. The grid batch 1/8/32/64 x context 1K/4K/16K (bf16, 32 query / 8 KV heads, head 128, block
   16, the default LBNHC layout), each timed as CUDA-graph replays (20 launches a graph, K/V
   rotated over enough copies that it comes from HBM, not L2): the kernel, vLLM's Triton paged
   decode (unified_attention, called as vLLM's Triton backend calls it; from the installed vLLM,
   else its source files, from an installed package or a folder carried along with the run:
   bench/carry_vllm_ops.sh), SDPA on pre-gathered dense K/V; GB/s and the fraction of the
   measured read bandwidth; then each variant's time at each point.

Exit 0: every check passed; 1: a check failed; 2: this machine cannot run the check. Everything
also goes, as JSON, to $OUT/gpu_check.json when OUT is set, and to --json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

EXIT_OK, EXIT_FAILED, EXIT_CANNOT_RUN = 0, 1, 2
STARTED = time.monotonic()

# Correctness cases: (query dtype, cache dtype, head size, GQA group, block size, context
# lengths, kv heads, splits (0: the kernel's own plan), layout).
CHECK_CASES: list[tuple[str, str, int, int, int, list[int] | str, int, int, str]] = [
    ("bf16", "bf16", 128, 4, 16, [1, 15, 16, 17, 300, 1000], 8, 0, "LBNHC"),
    ("bf16", "bf16", 128, 4, 16, [0, 16384, 7, 4096], 8, 0, "LBNHC"),
    ("bf16", "bf16", 128, 4, 16, [16384], 8, 0, "LBNHC"),
    ("bf16", "bf16", 128, 8, 32, [3000, 7, 129], 2, 3, "LBHNC"),
    ("fp16", "fp16", 128, 1, 16, [2049, 33], 4, 1, "BLNHC"),
    ("fp16", "fp16", 128, 24, 16, [777, 5], 1, 2, "LBNHC"),
    ("bf16", "bf16", 128, 16, 64, [1200, 64, 65], 2, 0, "BHLNC"),
    ("bf16", "bf16", 128, 2, 16, [1, 2, 3, 4, 5, 6, 7, 8] * 8, 4, 0, "LBNHC"),
    ("bf16", "bf16", 128, 4, 16, "ragged48", 8, 0, "LBNHC"),
    ("fp16", "fp16", 64, 5, 16, [250, 3, 48, 1023], 2, 0, "BLHNC"),
    ("bf16", "bf16", 64, 12, 64, [900, 200], 1, 7, "LHBNC"),
    ("bf16", "bf16", 64, 16, 16, [5000, 1], 2, 256, "BHLNC"),
    ("bf16", "bf16", 256, 2, 16, [1500, 17], 2, 0, "LBNHC"),
    ("bf16", "bf16", 256, 16, 32, [640, 64], 1, 5, "LBHNC"),
    ("fp16", "fp16", 256, 7, 16, [16000], 1, 0, "LBNHC"),
    ("bf16", "fp8", 128, 4, 16, [1, 100, 4000], 8, 0, "LBNHC"),
    ("fp16", "fp8", 64, 3, 32, [70, 0, 16], 2, 2, "BLNHC"),
    ("bf16", "fp8", 256, 8, 16, [2000], 2, 0, "LBHNC"),
]
QUICK_CASES = [0, 1, 3, 6, 9, 12, 15]

# Timing: Llama-3-8B-like attention (32 q heads, 8 kv heads, head 128), bf16, block 16.
NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE, BLOCK_SIZE = 32, 8, 128, 16
FULL_GRID = [(b, c) for b in (1, 8, 32, 64) for c in (1024, 4096, 16384)]
QUICK_GRID = [(1, 1024), (1, 16384), (8, 1024), (32, 4096), (64, 16384)]
LAUNCHES_PER_GRAPH = 20

# Build-option variants, each built for head 128 only (the grid's head size).
VARIANTS: list[tuple[str, dict[str, Any]]] = [
    ("smem-tree merge", {"warp_reduce": False}),
    ("max carve-out", {"smem_carveout_kb": -1}),  # -1: the device's per-SM maximum
    ("regcap 96", {"max_registers": 96}),
    ("fast math", {"fast_math": True}),
    ("256 threads", {"threads": 256}),
    ("2-stage ring", {"stage_bytes": 16384}),
]


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def elapsed() -> float:
    return time.monotonic() - STARTED


def nvml_lines(label: str) -> list[str]:
    """GPU gauges through the console's own NVML wrapper; a line saying why when unavailable."""
    try:
        from llmconsole.engine.host import HostProbe, fmt_na

        host = HostProbe().sample_host()
    except Exception as exc:  # psutil/NVML missing on the GPU host: not a reason to stop
        return [f"NVML {label}: not available ({type(exc).__name__}: {exc})"]
    if not host.nvml_available:
        return [f"NVML {label}: not available ({host.nvml_error or 'no reason given'})"]
    lines = []
    for g in host.gpus:
        mem = (
            "N/A"
            if g.memory_used_bytes is None or g.memory_total_bytes is None
            else f"{g.memory_used_bytes / 2**30:.1f}/{g.memory_total_bytes / 2**30:.1f} GiB"
        )
        lines.append(
            f"NVML {label}: GPU {g.index} {fmt_na(g.name)}: memory {mem}, "
            f"util {fmt_na(g.utilization_gpu_pct, '{:.0f}%')}, "
            f"power {fmt_na(g.power_w, '{:.0f} W')}, temp {fmt_na(g.temperature_c, '{:.0f} C')}"
        )
    return lines or [f"NVML {label}: no GPUs listed"]


def preflight(device_index: int):
    """torch with CUDA, a visible device, and nvcc; returns (torch, device, arch) or exits 2."""
    try:
        import torch
    except Exception as exc:
        say(f"cannot run: torch does not import ({exc}); install a CUDA build of torch")
        sys.exit(EXIT_CANNOT_RUN)
    if not torch.cuda.is_available():
        say(
            f"cannot run: torch {torch.__version__} sees no CUDA device "
            f"(torch.version.cuda={torch.version.cuda}); a CPU-only torch or no driver?"
        )
        sys.exit(EXIT_CANNOT_RUN)
    if device_index >= torch.cuda.device_count():
        say(f"cannot run: --device {device_index} but only {torch.cuda.device_count()} device(s) visible")
        sys.exit(EXIT_CANNOT_RUN)
    from llmconsole.kernels.cuda_build import find_nvcc

    if find_nvcc() is None:
        say("cannot run: nvcc not found; install the CUDA toolkit or set CUDA_HOME")
        sys.exit(EXIT_CANNOT_RUN)
    device = torch.device("cuda", device_index)
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:
        say(f"cannot run: the kernel needs sm_80 or newer (bf16 MMA, cp.async); this GPU is sm_{major}{minor}")
        sys.exit(EXIT_CANNOT_RUN)
    return torch, device, f"sm_{major}{minor}"


# ---- build ---------------------------------------------------------------------------------------


def build_all(torch, device, arch: str, with_variants: bool) -> tuple[Any, dict, dict[str, Any]]:
    """(the default library, its build report, {variant: library or error string})."""
    from llmconsole.kernels.cuda_build import CudaBuildError, CudaBuildOptions, compile_cuda
    from llmconsole.kernels.cuda_lib import CudaKernelLibrary

    props = torch.cuda.get_device_properties(device)
    per_sm_kb = getattr(props, "shared_memory_per_multiprocessor", 0) // 1024 or (
        228 if int(arch[3:].rstrip("a")) >= 90 else 164
    )
    jobs: dict[str, CudaBuildOptions] = {"default": CudaBuildOptions()}
    if with_variants:
        for name, kw in VARIANTS:
            kw = {k: (per_sm_kb if v == -1 else v) for k, v in kw.items()}
            jobs[name] = CudaBuildOptions(only_head_size=HEAD_SIZE, fp8_kv=False, **kw)

    def one(item):
        name, options = item
        t0 = time.monotonic()
        try:
            return name, compile_cuda(options, archs=(arch,), kind="shared"), time.monotonic() - t0
        except (CudaBuildError, OSError) as exc:
            return name, exc, time.monotonic() - t0

    with ThreadPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 4)) as pool:
        results = list(pool.map(one, jobs.items()))
    default_lib, default_report, variants = None, {}, {}
    for name, result, took in results:
        if isinstance(result, Exception):
            if name == "default":
                say(f"cannot run: the CUDA kernel did not build for {arch}:\n{result}")
                sys.exit(EXIT_CANNOT_RUN)
            say(f"variant {name!r} did not build: {str(result).splitlines()[0]}")
            variants[name] = f"build failed: {result}"
            continue
        say(
            f"built {name} for {arch} in {took:.1f} s{' (cached)' if result.cached else ''}: "
            f"{' '.join(f for f in result.flags if f.startswith(('-D', '-max', '--use')))}"
        )
        for kname, r in result.resources.get(arch, {}).items():
            if name == "default" or "decode_kernel<__nv_bfloat16, __nv_bfloat16, 128" in kname:
                say(
                    f"    {kname}: {r.registers} regs, spill {r.spill_store_bytes}/{r.spill_load_bytes} B, "
                    f"static smem {r.shared_bytes} B"
                )
        lib = CudaKernelLibrary(result.path)
        if name == "default":
            default_lib, default_report = lib, result.as_dict()
        else:
            variants[name] = lib
    return default_lib, default_report, variants


# ---- correctness ---------------------------------------------------------------------------------


def dtype_of(torch, name: str):
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn}[name]


def make_inputs(torch, device, case, gen):
    """Inputs for one case on the device, in their layout: (query, query buffer, key_cache,
    value_cache, table, seq_lens, lens, k_scale, v_scale)."""
    from llmconsole.kernels.kv_layout import move_keeping_layout, random_cuda_paged_cache, split_cuda_kv_cache

    qd, kvd, head_size, group, block_size, lens, kv_heads, _, layout = case
    if lens == "ragged48":
        lens = [int(x) for x in torch.randint(0, 4097, (48,), generator=gen)]
    num_heads = kv_heads * group
    kv_cache, table, seq_lens = random_cuda_paged_cache(
        lens, kv_heads, head_size, block_size, dtype_of(torch, kvd), layout, generator=gen
    )
    kv_cache = move_keeping_layout(kv_cache, device)
    key_cache, value_cache = split_cuda_kv_cache(kv_cache, head_size)
    # The query as vLLM hands it over: a slice of the qkv projection, rows past the batch included.
    qkv = torch.randn(len(lens) + 3, num_heads + 2 * kv_heads, head_size, generator=gen) * 2
    qkv = qkv.to(dtype_of(torch, qd)).to(device)
    query = qkv[: len(lens), :num_heads]
    scales = (0.6, 1.7) if kvd == "fp8" else (1.0, 1.0)
    return query, key_cache, value_cache, table.to(device), seq_lens.to(device), lens, scales


def check_one(torch, device, lib, case, gen=None, inputs=None) -> dict:
    """One case through the kernel: poisoned output, every element against float64, rows past
    the batch untouched. `inputs` (make_inputs() and the reference) are built when not given."""
    from llmconsole.kernels.reference import compare_to_reference, cuda_layout_decode_reference

    qd, kvd, head_size, group, block_size, _, kv_heads, splits, layout = case
    if inputs is None:
        inputs = make_inputs(torch, device, case, gen)
    query, key_cache, value_cache, table, seq_lens, lens, (ks, vs), *cached_ref = inputs
    what = (
        f"{qd}/{kvd} H={head_size} G={group} bs={block_size} kv={kv_heads} {layout} "
        f"{len(lens)} seqs max {max(lens)} splits={splits or 'plan'}"
    )
    row = {"case": what, "ok": False, "error": None}
    try:
        scale = head_size**-0.5
        ref = (
            cached_ref[0]
            if cached_ref
            else cuda_layout_decode_reference(query, key_cache, value_cache, table, seq_lens, scale, ks, vs)
        )
        out_buf = torch.full((len(lens) + 2, *query.shape[1:]), float("nan"), dtype=query.dtype, device=device)
        out = out_buf[: len(lens)]
        kw = dict(
            out=out,
            max_seq_len=max(lens),
            num_splits=splits,
            k_scale=ks if kvd == "fp8" else None,
            v_scale=vs if kvd == "fp8" else None,
        )
        lib.paged_attention_decode(query, key_cache, value_cache, table, seq_lens, scale, **kw)
        torch.cuda.synchronize(device)
        result = compare_to_reference(out, ref)
        untouched = bool(torch.isnan(out_buf[len(lens) :].float()).all())
        row.update(result, rows_past_batch_untouched=untouched)
        row["ok"] = bool(result["ok"]) and untouched
        if not result["finite"]:
            row["error"] = "NaN or Inf in the output (an element not written, or a read outside a context)"
        elif not result["ok"]:
            row["error"] = f"{result['bad']} elements out of tolerance, first at {result['first_bad']}"
        elif not untouched:
            row["error"] = "wrote rows of the output buffer past the batch"
    except Exception as exc:  # a failed launch is a result to report, not a crash
        row["error"] = f"{type(exc).__name__}: {exc}"
    return row


def with_reference(torch, device, case, gen) -> tuple:
    """make_inputs() plus the float64 reference, for running one case through several builds."""
    from llmconsole.kernels.reference import cuda_layout_decode_reference

    inputs = make_inputs(torch, device, case, gen)
    query, key_cache, value_cache, table, seq_lens, _, (ks, vs) = inputs
    ref = cuda_layout_decode_reference(query, key_cache, value_cache, table, seq_lens, query.shape[2] ** -0.5, ks, vs)
    return (*inputs, ref)


def check_graph_replay(torch, device, lib, gen) -> dict:
    """A launch captured in a CUDA graph with the split count for 16K contexts, replayed after the
    batch's lengths and block tables change: the output must match the new batch."""
    from llmconsole.kernels.kv_layout import move_keeping_layout, random_cuda_paged_cache, split_cuda_kv_cache
    from llmconsole.kernels.reference import compare_to_reference, cuda_layout_decode_reference

    row = {"case": "CUDA graph captured for 4 x 16K, replayed on 4 x (1, 100, 5000, 16000)", "ok": False, "error": None}
    try:
        lens_a, lens_b = [16384] * 4, [1, 100, 5000, 16000]
        kv_cache, table_a, seq_a = random_cuda_paged_cache(lens_a, 8, 128, 16, torch.bfloat16, generator=gen)
        kv_cache = move_keeping_layout(kv_cache, device)
        key_cache, value_cache = split_cuda_kv_cache(kv_cache, 128)
        table = table_a.to(device)
        seq_lens = seq_a.to(device)
        query = (torch.randn(4, 32, 128, generator=gen)).to(torch.bfloat16).to(device)
        plan = lib.plan(4, 32, 8, 128, 16384, torch.bfloat16, torch.bfloat16, device)
        workspace = torch.empty(max(plan.workspace_bytes, 16), dtype=torch.uint8, device=device)
        out = torch.full_like(query, float("nan"))

        def launch():
            lib.paged_attention_decode(
                query,
                key_cache,
                value_cache,
                table,
                seq_lens,
                128**-0.5,
                out=out,
                num_splits=plan.num_splits,
                workspace=workspace,
            )

        launch()
        torch.cuda.synchronize(device)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            launch()
        # New batch, same buffers: shorter contexts over a reshuffled subset of the blocks.
        seq_lens.copy_(torch.tensor(lens_b, dtype=torch.int32))
        perm = torch.randperm(table.shape[1] - 1, generator=gen)
        table[:, :-1] = table_a[:, perm].to(device)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize(device)
        ref = cuda_layout_decode_reference(query, key_cache, value_cache, table, seq_lens, 128**-0.5)
        result = compare_to_reference(out, ref)
        row.update(result, num_splits=plan.num_splits)
        row["ok"] = bool(result["ok"])
        if not row["ok"]:
            row["error"] = f"{result['bad']} elements out of tolerance (finite: {result['finite']})"
    except Exception as exc:
        row["error"] = f"{type(exc).__name__}: {exc}"
    return row


def check_triton(torch, device, triton_fn, gen) -> dict:
    """vLLM's op on two of the same kind of inputs, so the baseline timed is a correct call."""
    from triton_baseline import TritonDecode

    from llmconsole.kernels.reference import compare_to_reference, cuda_layout_decode_reference

    rows = []
    for case in (CHECK_CASES[0], CHECK_CASES[7]):
        query, key_cache, value_cache, table, seq_lens, lens, _ = make_inputs(torch, device, case, gen)
        num_heads, kv_heads = query.shape[1], key_cache.shape[2]
        op = TritonDecode(triton_fn, len(lens), num_heads, kv_heads, query.shape[2], device)
        out = torch.full_like(query, float("nan"))
        op(query.contiguous(), key_cache, value_cache, table, seq_lens, max(lens), query.shape[2] ** -0.5, out)
        torch.cuda.synchronize(device)
        ref = cuda_layout_decode_reference(query, key_cache, value_cache, table, seq_lens, query.shape[2] ** -0.5)
        rows.append(compare_to_reference(out, ref))
    return {"ok": all(r["ok"] for r in rows), "cases": rows}


# ---- timing --------------------------------------------------------------------------------------


def graph_ms(torch, fns: list, replays: int = 7) -> float:
    """Per-launch time of `fns` (called in turn, LAUNCHES_PER_GRAPH launches) captured in one CUDA
    graph: the median over replays of the replay's time / launches."""
    for fn in fns[:2]:
        fn()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for fn in fns[:3]:
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(LAUNCHES_PER_GRAPH):
            fns[i % len(fns)]()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(replays):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / LAUNCHES_PER_GRAPH)
    del graph
    return statistics.median(samples)


def read_bandwidth(torch, device) -> dict:
    """The GPU's own read rate: a bf16 sum over 4 GiB, eager (best of 5) and in a CUDA graph."""
    n_bytes = 4 * 2**30
    x = torch.ones(n_bytes // 2, dtype=torch.bfloat16, device=device)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    x.sum(dtype=torch.float32)
    eager = []
    for _ in range(5):
        start.record()
        x.sum(dtype=torch.float32)
        end.record()
        end.synchronize()
        eager.append(start.elapsed_time(end))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        x.sum(dtype=torch.float32)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(5):
            x.sum(dtype=torch.float32)
    graph.replay()
    torch.cuda.synchronize()
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    graph_ms_each = start.elapsed_time(end) / 5
    del graph, x
    torch.cuda.empty_cache()
    eager_gbs = n_bytes / min(eager) / 1e6
    graph_gbs = n_bytes / graph_ms_each / 1e6
    return {"bytes": n_bytes, "eager_gb_s": eager_gbs, "graph_gb_s": graph_gbs, "gb_s": max(eager_gbs, graph_gbs)}


class GridPoint:
    """One (batch, context) point's inputs, in HBM: K/V rotated over enough copies that the
    launches of one graph do not find the previous launch's data in L2."""

    def __init__(self, torch, device, batch: int, context: int, l2_bytes: int) -> None:
        from llmconsole.kernels.kv_layout import cuda_kv_cache, split_cuda_kv_cache

        self.batch, self.context = batch, context
        blocks_per_seq = -(-context // BLOCK_SIZE)
        num_blocks = batch * blocks_per_seq
        self.kv_bytes = batch * context * NUM_KV_HEADS * HEAD_SIZE * 2 * 2
        copy_bytes = num_blocks * BLOCK_SIZE * NUM_KV_HEADS * 2 * HEAD_SIZE * 2
        self.copies = max(1, min(LAUNCHES_PER_GRAPH, math.ceil(4 * l2_bytes / copy_bytes)))
        self.caches = []
        for _ in range(self.copies):
            kv = cuda_kv_cache(num_blocks, NUM_KV_HEADS, BLOCK_SIZE, HEAD_SIZE, torch.bfloat16, device=device)
            kv.normal_()
            self.caches.append(split_cuda_kv_cache(kv, HEAD_SIZE))
        self.table = torch.randperm(num_blocks, device=device).to(torch.int32).view(batch, blocks_per_seq)
        self.seq_lens = torch.full((batch,), context, dtype=torch.int32, device=device)
        self.query = torch.randn(batch, NUM_HEADS, HEAD_SIZE, dtype=torch.bfloat16, device=device)
        self.out = torch.empty_like(self.query)
        self.scale = HEAD_SIZE**-0.5

    def dense(self, torch, i: int):
        """Copy i's K/V gathered into the [batch, kv_heads, context, head] tensors SDPA reads."""
        key_cache, value_cache = self.caches[i]
        idx = self.table.long()
        keys = key_cache[idx].reshape(self.batch, -1, NUM_KV_HEADS, HEAD_SIZE)[:, : self.context]
        values = value_cache[idx].reshape(self.batch, -1, NUM_KV_HEADS, HEAD_SIZE)[:, : self.context]
        return keys.transpose(1, 2).contiguous(), values.transpose(1, 2).contiguous()


def time_point(
    torch,
    device,
    lib,
    variants: dict,
    triton_fn,
    batch: int,
    context: int,
    l2_bytes: int,
    read_gbs: float,
    budget_s: float,
) -> dict:
    import torch.nn.functional as F
    from triton_baseline import TritonDecode

    from llmconsole.kernels.reference import compare_to_reference, cuda_layout_decode_reference

    pt = GridPoint(torch, device, batch, context, l2_bytes)
    row: dict[str, Any] = {"batch": batch, "context": context, "kv_mb": pt.kv_bytes / 1e6, "kv_copies": pt.copies}
    plan = lib.plan(batch, NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE, context, torch.bfloat16, torch.bfloat16, device)
    row["num_splits"] = plan.num_splits

    def ours_fns(library):
        p = library.plan(batch, NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE, context, torch.bfloat16, torch.bfloat16, device)
        ws = torch.empty(max(p.workspace_bytes, 16), dtype=torch.uint8, device=device)

        def make(i):
            k, v = pt.caches[i]
            return lambda: library.paged_attention_decode(
                pt.query, k, v, pt.table, pt.seq_lens, pt.scale, out=pt.out, num_splits=p.num_splits, workspace=ws
            )

        return [make(i) for i in range(pt.copies)]

    row["ours_ms"] = graph_ms(torch, ours_fns(lib))
    # The timed output against the reference on a few sequences (the full check ran above).
    ref = cuda_layout_decode_reference(
        pt.query[:2], *pt.caches[(LAUNCHES_PER_GRAPH - 1) % pt.copies], pt.table[:2], pt.seq_lens[:2], pt.scale
    )
    row["ours_check"] = compare_to_reference(pt.out[:2], ref)["ok"]

    if triton_fn is not None:
        try:
            op = TritonDecode(triton_fn, batch, NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE, device)
            tout = torch.empty_like(pt.query)

            def tmake(i):
                k, v = pt.caches[i]
                return lambda: op(pt.query, k, v, pt.table, pt.seq_lens, context, pt.scale, tout)

            row["triton_ms"] = graph_ms(torch, [tmake(i) for i in range(pt.copies)])
            row["triton_path"] = "3D (segments)" if op.uses_3d else "2D"
            row["triton_max_abs_diff_vs_ours"] = float((tout.float() - pt.out.float()).abs().max())
        except Exception as exc:
            row["triton_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    try:
        dense = [pt.dense(torch, i) for i in range(pt.copies)]
        q4 = pt.query.view(batch, NUM_HEADS, 1, HEAD_SIZE)

        def smake(i):
            keys, values = dense[i]
            return lambda: F.scaled_dot_product_attention(q4, keys, values, scale=pt.scale, enable_gqa=True)

        row["sdpa_ms"] = graph_ms(torch, [smake(i) for i in range(pt.copies)])
    except Exception as exc:
        row["sdpa_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"

    for key in ("ours", "triton", "sdpa"):
        if f"{key}_ms" in row:
            row[f"{key}_gb_s"] = pt.kv_bytes / row[f"{key}_ms"] / 1e6
            row[f"{key}_of_read"] = row[f"{key}_gb_s"] / read_gbs
    if "triton_ms" in row:
        row["speed_vs_triton"] = row["triton_ms"] / row["ours_ms"]

    row["variants"] = {}
    for name, vlib in variants.items():
        if isinstance(vlib, str):
            continue
        if elapsed() > budget_s:
            row["variants"][name] = "skipped: time budget"
            continue
        try:
            row["variants"][name] = graph_ms(torch, ours_fns(vlib))
        except Exception as exc:
            row["variants"][name] = f"error: {type(exc).__name__}: {exc}"
    return row


# ---- report --------------------------------------------------------------------------------------


def fmt(v: Any, spec: str) -> str:
    return format(v, spec) if isinstance(v, (int, float)) else "-"


def targets(rows: list[dict], checks_ok: bool) -> list[str]:
    """The measured figures against the kernel's targets (informational: the exit code is
    correctness only)."""
    lines = [f"  correct on every case, no NaN: {'met' if checks_ok else 'MISSED'}"]
    timed = [r for r in rows if "ours_ms" in r]
    vs = [r for r in timed if r["batch"] >= 8 and "speed_vs_triton" in r]
    if vs:
        worst = min(vs, key=lambda r: r["speed_vs_triton"])
        lines.append(
            f"  >= 1.2x vLLM's Triton decode from batch 8 x 1K on: "
            f"{'met' if worst['speed_vs_triton'] >= 1.2 else 'MISSED'} (lowest "
            f"{worst['speed_vs_triton']:.2f}x at {worst['batch']} x {worst['context']})"
        )
    small = [r for r in timed if (r["batch"], r["context"]) == (1, 1024)]
    if small:
        lines.append(
            f"  batch 1 x 1K under 0.02 ms: {'met' if small[0]['ours_ms'] < 0.02 else 'MISSED'} "
            f"({small[0]['ours_ms']:.4f} ms)"
        )
    big = [r for r in timed if r["batch"] * r["context"] >= 32 * 4096]
    if big:
        worst = min(big, key=lambda r: r["ours_of_read"])
        lines.append(
            f"  >= 80% of the read bandwidth from 32 x 4K on: "
            f"{'met' if worst['ours_of_read'] >= 0.8 else 'MISSED'} (lowest {worst['ours_of_read']:.0%} "
            f"at {worst['batch']} x {worst['context']})"
        )
    one = [r for r in timed if (r["batch"], r["context"]) == (1, 16384)]
    if one:
        lines.append(
            f"  batch 1 x 16K at >= 50% of the read bandwidth: "
            f"{'met' if one[0]['ours_of_read'] >= 0.5 else 'MISSED'} ({one[0]['ours_of_read']:.0%})"
        )
    return lines


def report(
    name: str,
    arch: str,
    sm_count: int,
    bandwidth: dict,
    checks: list[dict],
    graph_check: dict,
    triton_src: str,
    triton_check: dict | None,
    variant_checks: dict,
    rows: list[dict],
) -> str:
    passed = sum(c["ok"] for c in checks) + int(graph_check["ok"])
    lines = [
        f"GPU {name} ({arch}, {sm_count} SMs); read bandwidth (bf16 sum over 4 GiB, best of eager and "
        f"graph): {bandwidth['gb_s']:,.0f} GB/s (eager {bandwidth['eager_gb_s']:,.0f}, graph {bandwidth['graph_gb_s']:,.0f})",
        f"correctness vs float64 reference: {passed}/{len(checks) + 1} cases passed (default build)",
    ]
    for name_v, vc in variant_checks.items():
        lines.append(f"  variant {name_v}: {vc}")
    lines.append(
        f"vLLM Triton decode from {triton_src}"
        + (f"; its output vs the reference: {'ok' if triton_check['ok'] else 'WRONG'}" if triton_check else "")
    )
    lines += [
        "",
        f"decode, bf16, {NUM_HEADS} q / {NUM_KV_HEADS} kv heads, head {HEAD_SIZE}, block {BLOCK_SIZE}, LBNHC; per-launch ms "
        f"from CUDA-graph replays ({LAUNCHES_PER_GRAPH} launches a graph, K/V rotated over copies to stay out of L2)",
        f"{'batch':>5} {'ctx':>6} {'KV MB':>8} {'splits':>6} {'ours ms':>8} {'Triton ms':>9} {'SDPA ms':>8} "
        f"{'vs Triton':>9} {'ours GB/s':>9} {'%read':>6} {'Triton GB/s':>11} {'%read':>6} {'SDPA GB/s':>9}",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['batch']:>5} {r['context']:>6}  error: {r['error']}")
            continue
        lines.append(
            f"{r['batch']:>5} {r['context']:>6} {r['kv_mb']:>8.1f} {r['num_splits']:>6} {fmt(r.get('ours_ms'), '8.4f')} "
            f"{fmt(r.get('triton_ms'), '9.4f'):>9} {fmt(r.get('sdpa_ms'), '8.4f'):>8} "
            f"{fmt(r.get('speed_vs_triton'), '8.2f'):>8}x {fmt(r.get('ours_gb_s'), '9,.0f'):>9} "
            f"{fmt(r.get('ours_of_read'), '6.0%'):>6} {fmt(r.get('triton_gb_s'), '11,.0f'):>11} "
            f"{fmt(r.get('triton_of_read'), '6.0%'):>6} {fmt(r.get('sdpa_gb_s'), '9,.0f'):>9}"
        )
        for key in ("triton_error", "sdpa_error"):
            if key in r:
                lines.append(f"{'':>13}{key.split('_')[0]}: {r[key]}")
    names = sorted({n for r in rows for n in r.get("variants", {})})
    if names:
        lines += ["", "build-option variants (head-128 builds): ours ms at each point (default first)"]
        header = f"{'batch x ctx':>12} {'default':>9} " + " ".join(f"{n[:14]:>14}" for n in names)
        lines.append(header)
        for r in rows:
            if "ours_ms" not in r:
                continue
            cells = [
                fmt(r["variants"].get(n), "14.4f")
                if isinstance(r["variants"].get(n), float)
                else f"{str(r['variants'].get(n, '-'))[:14]:>14}"
                for n in names
            ]
            lines.append(f"{r['batch']:>5} x {r['context']:>5} {r['ours_ms']:>9.4f} " + " ".join(cells))
    lines += ["", "targets:"] + targets(rows, passed == len(checks) + 1)
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="7 correctness cases and 5 grid points")
    p.add_argument("--no-variants", action="store_true", help="skip the build-option variants")
    p.add_argument(
        "--triton-source",
        choices=("auto", "installed", "files"),
        default="auto",
        help="where vLLM's Triton op comes from (auto: the installed vLLM if it imports, else its files)",
    )
    p.add_argument(
        "--vllm-ops-dir",
        type=Path,
        help="a folder of vLLM's op files for a machine without vLLM (bench/carry_vllm_ops.sh makes one)",
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=270.0,
        help="stop timing variants past this many seconds (correctness always runs)",
    )
    p.add_argument("--json", type=Path, help="also write everything here")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    for line in nvml_lines("before"):
        print(line, flush=True)
    torch, device, arch = preflight(args.device)
    torch.cuda.set_device(device)
    props = torch.cuda.get_device_properties(device)
    name, sm_count = torch.cuda.get_device_name(device), props.multi_processor_count
    l2_bytes = int(getattr(props, "L2_cache_size", 0) or 50 * 2**20)
    say(
        f"{name} ({arch}), {sm_count} SMs, L2 {l2_bytes / 2**20:.0f} MiB; torch {torch.__version__}, "
        f"CUDA {torch.version.cuda}"
    )

    lib, build_report, variants = build_all(torch, device, arch, not args.no_variants)
    gen = torch.Generator().manual_seed(int(time.time_ns() % 2**31))

    say("correctness (default build):")
    cases = [CHECK_CASES[i] for i in QUICK_CASES] if args.quick else CHECK_CASES
    checks = []
    for case in cases:
        row = check_one(torch, device, lib, case, gen)
        checks.append(row)
        say(
            f"  {'ok  ' if row['ok'] else 'FAIL'} {row['case']}"
            + (f" (worst {row.get('worst_err_of_row_max', 0):.1e} of row max)" if row["ok"] else f": {row['error']}")
        )
    graph_check = check_graph_replay(torch, device, lib, gen)
    say(
        f"  {'ok  ' if graph_check['ok'] else 'FAIL'} {graph_check['case']}"
        + ("" if graph_check["ok"] else f": {graph_check['error']}")
    )

    variant_checks: dict[str, str] = {}
    variant_failed = []
    built = {n: v for n, v in variants.items() if not isinstance(v, str)}
    variant_rows: dict[str, list[dict]] = {n: [] for n in built}
    for n, v in variants.items():
        if isinstance(v, str):
            variant_checks[n] = v.splitlines()[0]
    if built:
        for case in cases:
            if case[2] != HEAD_SIZE or case[1] == "fp8":
                continue
            inputs = with_reference(torch, device, case, gen)  # once per case, for every variant
            for vname, vlib in built.items():
                variant_rows[vname].append(check_one(torch, device, vlib, case, inputs=inputs))
            del inputs
    for vname, vrows in variant_rows.items():
        bad = [r for r in vrows if not r["ok"]]
        variant_checks[vname] = f"{len(vrows) - len(bad)}/{len(vrows)} head-128 cases passed" + (
            f"; FAIL {bad[0]['case']}: {bad[0]['error']}" if bad else ""
        )
        if bad:
            variant_failed.append(vname)
        say(f"  variant {vname}: {variant_checks[vname]}")

    triton_fn, triton_src, triton_check = None, "unavailable", None
    try:
        from triton_baseline import load_unified_attention

        triton_fn, triton_src = load_unified_attention(args.triton_source, args.vllm_ops_dir)
        triton_check = check_triton(torch, device, triton_fn, gen)
        say(f"vLLM Triton decode from {triton_src}: output vs reference {'ok' if triton_check['ok'] else 'WRONG'}")
    except Exception as exc:
        triton_src = f"unavailable ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})"
        say(f"vLLM's Triton decode cannot run here: {triton_src}")
        say(traceback.format_exc())

    say("read bandwidth:")
    bandwidth = read_bandwidth(torch, device)
    say(f"  {bandwidth['gb_s']:,.0f} GB/s")

    rows = []
    for batch, context in QUICK_GRID if args.quick else FULL_GRID:
        say(f"timing {batch} x {context} ({elapsed():.0f} s in)")
        try:
            rows.append(
                time_point(
                    torch, device, lib, variants, triton_fn, batch, context, l2_bytes, bandwidth["gb_s"], args.budget_s
                )
            )
        except Exception as exc:
            rows.append(
                {
                    "batch": batch,
                    "context": context,
                    "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                }
            )
            say(traceback.format_exc())
        torch.cuda.empty_cache()

    text = report(name, arch, sm_count, bandwidth, checks, graph_check, triton_src, triton_check, variant_checks, rows)
    print(text, flush=True)
    for line in nvml_lines("after"):
        print(line, flush=True)

    failed = [c["case"] for c in checks if not c["ok"]] + ([graph_check["case"]] if not graph_check["ok"] else [])
    failed += [f"variant {v}" for v in variant_failed]
    failed += [f"timed output at {r['batch']} x {r['context']}" for r in rows if r.get("ours_check") is False]
    failed += [f"grid point {r['batch']} x {r['context']}: {r['error']}" for r in rows if "error" in r]
    result = {
        "gpu": name,
        "arch": arch,
        "sm_count": sm_count,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "elapsed_s": elapsed(),
        "build": build_report,
        "read_bandwidth": bandwidth,
        "checks": checks,
        "graph_check": graph_check,
        "variant_checks": variant_checks,
        "triton_source": triton_src,
        "triton_check": triton_check,
        "timings": rows,
        "failed": failed,
        "report": text,
    }
    outputs = [args.json] if args.json else []
    if os.environ.get("OUT"):
        outputs.append(Path(os.environ["OUT"]) / "gpu_check.json")
    for path in outputs:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(result, indent=1, default=str))
        say(f"wrote {path}")
    if failed:
        bar = "!" * 78
        say(
            f"\n{bar}\nCORRECTNESS FAILED: {len(failed)} check(s):\n"
            + "\n".join(f"  - {f}" for f in failed)
            + f"\n{bar}"
        )
        return EXIT_FAILED
    say(f"all checks passed in {elapsed():.0f} s")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
