"""One-shot check of the CUDA decode kernel on a machine with an NVIDIA GPU.

Builds llmconsole/kernels/csrc/paged_attention.cu for the GPU it finds (nvcc, no torch
extension), checks it against the float64 reference on fresh random inputs (output poisoned
with NaN before each call, every element compared), times it against torch's
scaled_dot_product_attention on the same KV gathered into dense tensors, and prints one
table, with NVML gauges before and after. Every stage says what it needs when it cannot run;
the exit code is 0 when all checks pass, 1 when a check fails, 2 when the machine cannot run
the check at all. Not used by the test suite.

    bench/gpu_check.sh [--quick] [--device 0] [--max-registers 64] [--smem-carveout-kb 96]
                       [--fast-math] [--no-warp-reduce] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

EXIT_OK, EXIT_FAILED, EXIT_CANNOT_RUN = 0, 1, 2

# Correctness cases: (dtype name, head_size, group, block_size, context lengths, kv heads,
# partition_size). Ragged lengths, GQA ratios, small and large blocks, a forced split path.
CHECK_CASES = [
    ("fp32", 64, 1, 16, [1, 11, 16, 17, 300], 2, 0),
    ("bf16", 64, 4, 16, [1, 11, 16, 17, 300], 2, 0),
    ("bf16", 128, 8, 16, [5, 129, 1000, 2049], 2, 0),
    ("bf16", 128, 4, 32, [3000, 7], 2, 256),
    ("fp32", 96, 2, 128, [1, 128, 129, 700], 4, 0),
    ("bf16", 32, 3, 64, [33, 64, 5000], 1, 0),
    ("bf16", 128, 4, 16, [16_000, 40], 8, 0),
]
TOLERANCE = {"fp32": (1e-4, 2e-5), "bf16": (2.0**-7, 1e-3)}

# Timing: Llama-3-8B-like attention (32 q heads, 8 kv heads, head 128), bf16, block 16.
NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE, BLOCK_SIZE = 32, 8, 128, 16
FULL_GRID = [(b, c) for b in (1, 8, 32, 64) for c in (128, 1024, 4096, 16384)]
QUICK_GRID = [(1, 1024), (8, 4096), (32, 4096)]


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def nvml_lines(label: str) -> list[str]:
    """GPU gauges through the console's own NVML wrapper; N/A where NVML has no answer."""
    from llmconsole.engine.host import HostProbe, fmt_na

    host = HostProbe().sample_host()
    if not host.nvml_available:
        return [f"NVML {label}: not available ({host.nvml_error or 'no reason given'})"]
    lines = []
    for g in host.gpus:
        mem = ("N/A" if g.memory_used_bytes is None or g.memory_total_bytes is None
               else f"{g.memory_used_bytes / 2**30:.1f}/{g.memory_total_bytes / 2**30:.1f} GiB")
        lines.append(
            f"NVML {label}: GPU {g.index} {fmt_na(g.name)}: memory {mem}, "
            f"util {fmt_na(g.utilization_gpu_pct, '{:.0f}%')}, "
            f"mem-bw util {fmt_na(g.utilization_memory_pct, '{:.0f}%')}, "
            f"power {fmt_na(g.power_w, '{:.0f} W')}, temp {fmt_na(g.temperature_c, '{:.0f} C')}")
    return lines or [f"NVML {label}: no GPUs listed"]


def preflight(device_index: int):
    """torch with CUDA, a visible device, and nvcc; returns (torch, device, arch) or exits."""
    try:
        import torch
    except Exception as exc:
        say(f"cannot run: torch does not import ({exc}); install a CUDA build of torch")
        sys.exit(EXIT_CANNOT_RUN)
    if not torch.cuda.is_available():
        say(f"cannot run: torch {torch.__version__} sees no CUDA device "
            f"(torch.version.cuda={torch.version.cuda}); a CPU-only torch or no driver?")
        sys.exit(EXIT_CANNOT_RUN)
    if device_index >= torch.cuda.device_count():
        say(f"cannot run: --device {device_index} but only {torch.cuda.device_count()} "
            "device(s) visible")
        sys.exit(EXIT_CANNOT_RUN)
    from llmconsole.kernels.cuda_build import find_nvcc

    if find_nvcc() is None:
        say("cannot run: nvcc not found; install the CUDA toolkit or set CUDA_HOME")
        sys.exit(EXIT_CANNOT_RUN)
    device = torch.device("cuda", device_index)
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:
        say(f"cannot run: the kernel needs sm_80 or newer (bf16); this GPU is sm_{major}{minor}")
        sys.exit(EXIT_CANNOT_RUN)
    return torch, device, f"sm_{major}{minor}"


def build(arch: str, args):
    from llmconsole.kernels.cuda_build import CudaBuildError, CudaBuildOptions, compile_cuda
    from llmconsole.kernels.cuda_lib import CudaKernelLibrary

    options = CudaBuildOptions(warp_reduce=not args.no_warp_reduce,
                               smem_carveout_kb=args.smem_carveout_kb,
                               max_registers=args.max_registers, fast_math=args.fast_math)
    started = time.monotonic()
    try:
        result = compile_cuda(options, archs=(arch,), kind="shared")
    except CudaBuildError as exc:
        say(f"cannot run: the CUDA kernel did not build for {arch}:\n{exc}")
        sys.exit(EXIT_CANNOT_RUN)
    say(f"built {result.path} for {arch} in {time.monotonic() - started:.1f} s"
        f"{' (cached)' if result.cached else ''}; flags: {' '.join(result.flags)}")
    for name, r in result.resources.get(arch, {}).items():
        say(f"  {name}: {r.registers} regs, spill {r.spill_store_bytes}/{r.spill_load_bytes} B, "
            f"smem {r.shared_bytes} B")
    return CudaKernelLibrary(result.path), result


def check_correctness(torch, device, lib) -> list[dict]:
    from llmconsole.kernels.kv_layout import random_paged_cache
    from llmconsole.kernels.reference import paged_attention_decode_reference

    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16}
    seed = int(time.time_ns() % 2**31)
    gen = torch.Generator().manual_seed(seed)
    results = []
    for dtype_name, head_size, group, block_size, lens, kv_heads, partition in CHECK_CASES:
        dtype = dtypes[dtype_name]
        what = (f"{dtype_name} H={head_size} G={group} bs={block_size} kv={kv_heads} "
                f"lens={lens} partition={partition or 'auto'}")
        row = {"case": what, "seed": seed, "ok": False, "max_err_of_row_max": None, "error": None}
        try:
            cache, table, ctx = random_paged_cache(len(lens), lens, kv_heads, head_size,
                                                   block_size, dtype, generator=gen)
            query = (torch.randn(len(lens), kv_heads * group, head_size, generator=gen) * 2).to(dtype)
            scale = head_size ** -0.5
            ref = paged_attention_decode_reference(query, cache, table, ctx, scale)
            out = torch.full(query.shape, float("nan"), dtype=dtype, device=device)
            lib.paged_attention_decode(query.to(device), cache.to(device), table.to(device),
                                       ctx.to(device), scale, out=out,
                                       max_context_len=max(lens), partition_size=partition)
            torch.cuda.synchronize(device)
            got = out.cpu().double()
            rtol, atol = TOLERANCE[dtype_name]
            row_max = ref.abs().amax(dim=-1, keepdim=True)
            err = (got - ref).abs()
            finite = bool(torch.isfinite(got).all())
            row["max_err_of_row_max"] = float((err / row_max.clamp_min(1e-30)).max()) if finite else None
            row["ok"] = finite and bool((err <= rtol * ref.abs() + atol * row_max).all())
            if not finite:
                row["error"] = "NaN or Inf in the output (an element not written, or read past a context)"
        except Exception as exc:  # a failed launch is a result to report, not a crash
            row["error"] = f"{type(exc).__name__}: {exc}"
        results.append(row)
        say(f"  check {'ok  ' if row['ok'] else 'FAIL'} {what}"
            + (f": {row['error']}" if row["error"] else ""))
    return results


def median_ms(torch, fn, reps: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        fn()
    samples = []
    for _ in range(reps):
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)


def time_case(torch, device, lib, batch: int, context: int, reps: int) -> dict:
    import torch.nn.functional as F

    dtype = torch.bfloat16
    blocks_per_seq = -(-context // BLOCK_SIZE)
    num_blocks = batch * blocks_per_seq
    cache = torch.randn(num_blocks, NUM_KV_HEADS, BLOCK_SIZE, 2 * HEAD_SIZE, dtype=dtype,
                        device=device)
    table = torch.randperm(num_blocks, device=device).to(torch.int32).view(batch, blocks_per_seq)
    lens = torch.full((batch,), context, dtype=torch.int32, device=device)
    query = torch.randn(batch, NUM_HEADS, HEAD_SIZE, dtype=dtype, device=device)
    out = torch.empty_like(query)
    scale = HEAD_SIZE ** -0.5
    workspace_bytes = lib.workspace_bytes(batch, NUM_HEADS, HEAD_SIZE, context)
    workspace = torch.empty(max(workspace_bytes, 1), dtype=torch.uint8, device=device)

    # The same KV, gathered once into the dense [batch, kv_heads, context, head] tensors SDPA
    # reads; the gather is not timed (SDPA gets the best case).
    slabs = cache.view(num_blocks, NUM_KV_HEADS, 2, BLOCK_SIZE * HEAD_SIZE)
    k_t = slabs[:, :, 0].view(num_blocks, NUM_KV_HEADS, HEAD_SIZE, BLOCK_SIZE)
    v = slabs[:, :, 1].view(num_blocks, NUM_KV_HEADS, BLOCK_SIZE, HEAD_SIZE)
    idx = table.long()
    keys = k_t[idx].permute(0, 2, 1, 4, 3).reshape(batch, NUM_KV_HEADS, -1, HEAD_SIZE)[:, :, :context]
    values = v[idx].permute(0, 2, 1, 3, 4).reshape(batch, NUM_KV_HEADS, -1, HEAD_SIZE)[:, :, :context]
    keys, values = keys.contiguous(), values.contiguous()
    q4 = query.view(batch, NUM_HEADS, 1, HEAD_SIZE)

    def ours():
        lib.paged_attention_decode(query, cache, table, lens, scale, out=out,
                                   max_context_len=context, workspace=workspace)

    def sdpa():
        return F.scaled_dot_product_attention(q4, keys, values, scale=scale, enable_gqa=True)

    ours_ms = median_ms(torch, ours, reps)
    sdpa_ms = median_ms(torch, sdpa, reps)
    ours()
    diff = float((out.float() - sdpa().view_as(out).float()).abs().max())
    kv_bytes = batch * context * NUM_KV_HEADS * HEAD_SIZE * 2 * 2
    return {"batch": batch, "context": context, "kv_mb": kv_bytes / 1e6, "ours_ms": ours_ms,
            "sdpa_ms": sdpa_ms, "speedup": sdpa_ms / ours_ms,
            "ours_gb_s": kv_bytes / ours_ms / 1e6, "sdpa_gb_s": kv_bytes / sdpa_ms / 1e6,
            "max_abs_diff": diff}


def format_table(arch: str, name: str, checks: list[dict], rows: list[dict]) -> str:
    passed = sum(c["ok"] for c in checks)
    lines = [f"GPU {name} ({arch}); correctness vs float64 reference: {passed}/{len(checks)} "
             "cases passed",
             f"decode attention, bf16, {NUM_HEADS} q / {NUM_KV_HEADS} kv heads, head {HEAD_SIZE}, "
             f"block {BLOCK_SIZE}; medians of CUDA-event timings; SDPA on pre-gathered dense KV",
             f"{'batch':>5} {'ctx':>6} {'KV MB':>8} {'ours ms':>8} {'SDPA ms':>8} {'speedup':>7} "
             f"{'ours GB/s':>9} {'SDPA GB/s':>9} {'max|diff|':>9}"]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['batch']:>5} {r['context']:>6}  error: {r['error']}")
            continue
        lines.append(f"{r['batch']:>5} {r['context']:>6} {r['kv_mb']:>8.1f} {r['ours_ms']:>8.3f} "
                     f"{r['sdpa_ms']:>8.3f} {r['speedup']:>6.2f}x {r['ours_gb_s']:>9.0f} "
                     f"{r['sdpa_gb_s']:>9.0f} {r['max_abs_diff']:>9.2g}")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="3 timing cases instead of 16")
    p.add_argument("--reps", type=int, default=50, help="timed calls per case (median)")
    p.add_argument("--max-registers", type=int)
    p.add_argument("--smem-carveout-kb", type=int, default=0)
    p.add_argument("--fast-math", action="store_true")
    p.add_argument("--no-warp-reduce", action="store_true")
    p.add_argument("--json", type=Path, help="also write everything here")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    for line in nvml_lines("before"):
        print(line)
    torch, device, arch = preflight(args.device)
    torch.cuda.set_device(device)
    name = torch.cuda.get_device_name(device)
    lib, build_result = build(arch, args)
    say("correctness:")
    checks = check_correctness(torch, device, lib)
    rows = []
    for batch, context in QUICK_GRID if args.quick else FULL_GRID:
        try:
            rows.append(time_case(torch, device, lib, batch, context, args.reps))
        except Exception as exc:
            rows.append({"batch": batch, "context": context,
                         "error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"})
            say(traceback.format_exc())
        torch.cuda.empty_cache()
    print(format_table(arch, name, checks, rows))
    for line in nvml_lines("after"):
        print(line)
    if args.json:
        args.json.write_text(json.dumps({"arch": arch, "gpu": name, "build": build_result.as_dict(),
                                         "checks": checks, "timings": rows}, indent=1))
    failed = [c for c in checks if not c["ok"]] + [r for r in rows if "error" in r]
    return EXIT_FAILED if failed else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
