"""Decode attention on the CPU: llmconsole's kernel against vLLM's own, on the same K/V.

The cache is written by vLLM's `cpu_attn_reshape_and_cache`, so both kernels read exactly the
bytes an engine would hold. vLLM runs the ISA it picks for this host (--vllm-isa another); on
an AMX host that is "amx", whose block layout the kernel does not read, so the same K/V is
written twice: once in vLLM's AMX layout for vLLM, once in the "vec" layout a custom-kernel
engine keeps for the kernel (the process asks for AMX tile state first, as engines do). Calls alternate (vLLM, ours, vLLM, ...) so background load on a
shared machine hits both alike, and a 64 MB read between calls evicts the caches: in a real
model each layer's KV is read once per step, with the weights streaming through in between.
Effective bandwidth is KV bytes read / time. The roofline is a plain read (torch.sum) of a
tensor as large as the case's KV, timed in the same alternation (vLLM, ours, read, ...), so
the three see the same background load; a 1 GB read before and after the run is printed too.
The read runs on torch's OpenMP pool, which the kernel shares (one libgomp in the process), so
both use torch.get_num_threads() threads; each read is as large as the case's KV and follows
the same 64 MB eviction, so neither is served from cache beyond what the L3 keeps.

With --rounds N the whole grid is run N times over, with fresh inputs each round, and each
case's figures are the medians over the rounds (each round's ratios are still measured side
by side); the spread of the two target ratios over the rounds is printed beneath. On a shared
host a neighbour's burst can drag one round of one case by 15-20%: a median over rounds says
what the kernel does, one round says what the neighbour did.

    VLLM_TARGET_DEVICE=cpu python bench/bench_kernel.py [--quick] [--rounds N] [--json out.json]
"""

from __future__ import annotations

import os

# vLLM's AVX-512 library dies with SIGILL on AVX2 hosts; must be set before vllm is imported.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from dataclasses import asdict, dataclass  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from llmconsole.kernels.cpu import paged_attention_decode, partition_tokens  # noqa: E402
from llmconsole.kernels.cpu_isa import kernel_isa, request_amx_tiles  # noqa: E402
from llmconsole.kernels.kv_layout import vllm_cache_views  # noqa: E402

NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE, BLOCK_SIZE = 32, 8, 128, 128
DTYPE = torch.bfloat16
FULL_GRID = [(b, c) for b in (1, 8, 32, 64) for c in (128, 1024, 4096)]
QUICK_GRID = [(1, 128), (8, 1024), (32, 1024), (32, 4096)]
# Targets from the kernel issue, for batch >= 8 and context >= 1K.
TARGET_SPEEDUP = 1.5
TARGET_BANDWIDTH_FRACTION = 0.60
FLUSH_BYTES = 64 << 20


@dataclass
class Row:
    batch: int
    context: int
    kv_mb: float
    vllm_ms: float
    ours_ms: float
    speedup: float
    vllm_gb_s: float
    ours_gb_s: float
    read_gb_s: float
    ours_of_read: float
    split: bool
    max_abs_diff: float
    load_1m: float  # the host's 1-minute load average when the case finished (shared machine)


def measure_read_gb_s(size_bytes: int = 1 << 30, reps: int = 7) -> float:
    """A plain sequential read of a large fp32 tensor (torch.sum, all threads), median GB/s."""
    x = torch.ones(size_bytes // 4, dtype=torch.float32)
    x.sum()
    samples = []
    for _ in range(reps):
        t = time.perf_counter()
        x.sum()
        samples.append(size_bytes / (time.perf_counter() - t) / 1e9)
    del x
    return statistics.median(samples)


def build_case(ops, isa: str, batch: int, context: int, gen: torch.Generator):
    blocks_per_seq = -(-context // BLOCK_SIZE)
    num_blocks = batch * blocks_per_seq
    cache = torch.zeros(num_blocks, NUM_KV_HEADS, BLOCK_SIZE, 2 * HEAD_SIZE, dtype=DTYPE)
    key_cache, value_cache = vllm_cache_views(cache)
    ours_isa = kernel_isa(isa)
    ours = cache if ours_isa == isa else torch.zeros_like(cache)
    table = torch.randperm(num_blocks, generator=gen).to(torch.int32).view(batch, blocks_per_seq)
    positions = torch.arange(context)
    for s in range(batch):  # one sequence at a time keeps the staging K/V small
        slots = table[s, positions // BLOCK_SIZE].long() * BLOCK_SIZE + positions % BLOCK_SIZE
        key = torch.randn(context, NUM_KV_HEADS, HEAD_SIZE, generator=gen).to(DTYPE)
        value = torch.randn(context, NUM_KV_HEADS, HEAD_SIZE, generator=gen).to(DTYPE)
        ops.cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, slots, isa)
        if ours is not cache:
            ops.cpu_attn_reshape_and_cache(key, value, *vllm_cache_views(ours), slots, ours_isa)
    lens = torch.full((batch,), context, dtype=torch.int32)
    query = torch.randn(batch, NUM_HEADS, HEAD_SIZE, generator=gen).to(DTYPE)
    return ours, key_cache, value_cache, table, lens, query


def run_case(ops, isa: str, batch: int, context: int, flush: bool, budget_s: float, gen: torch.Generator) -> Row:
    cache, key_cache, value_cache, table, lens, query = build_case(ops, isa, batch, context, gen)
    scale = HEAD_SIZE**-0.5
    out_vllm = torch.empty_like(query)
    out_ours = torch.empty_like(query)
    query_start = torch.arange(batch + 1, dtype=torch.int32)
    meta = ops.cpu_attn_get_scheduler_metadata(
        batch, NUM_HEADS, NUM_KV_HEADS, HEAD_SIZE, lens, DTYPE, query_start, True, -1, isa, True
    )

    def vllm_call():
        ops.cpu_attention_with_kv_cache(
            query, key_cache, value_cache, out_vllm, query_start, lens, scale, True, None, -1, table, 0.0, meta, None
        )

    def ours_call():
        paged_attention_decode(query, cache, table, lens, scale, out=out_ours)

    kv_bytes = batch * context * NUM_KV_HEADS * HEAD_SIZE * 2 * DTYPE.itemsize
    plain = torch.ones(kv_bytes // 4, dtype=torch.float32)

    def read_call():
        plain.sum()

    evict = torch.ones(FLUSH_BYTES // 4, dtype=torch.float32)
    for f in (vllm_call, ours_call, read_call, vllm_call, ours_call, read_call):
        f()
    samples: dict[str, list[float]] = {"vllm": [], "ours": [], "read": []}
    started = time.perf_counter()
    while True:
        for name, f in (("vllm", vllm_call), ("ours", ours_call), ("read", read_call)):
            if flush:
                evict.sum()
            t = time.perf_counter()
            f()
            samples[name].append(time.perf_counter() - t)
        n = len(samples["ours"])
        if n >= 41 or (n >= 7 and time.perf_counter() - started > budget_s):
            break
    vllm_s, ours_s = statistics.median(samples["vllm"]), statistics.median(samples["ours"])
    read_gb_s = kv_bytes / statistics.median(samples["read"]) / 1e9
    split_at = partition_tokens(lens, NUM_KV_HEADS, BLOCK_SIZE)
    return Row(
        batch=batch,
        context=context,
        kv_mb=kv_bytes / 1e6,
        vllm_ms=vllm_s * 1e3,
        ours_ms=ours_s * 1e3,
        speedup=vllm_s / ours_s,
        vllm_gb_s=kv_bytes / vllm_s / 1e9,
        ours_gb_s=kv_bytes / ours_s / 1e9,
        read_gb_s=read_gb_s,
        ours_of_read=kv_bytes / ours_s / 1e9 / read_gb_s,
        split=split_at < context,
        max_abs_diff=float((out_vllm.float() - out_ours.float()).abs().max()),
        load_1m=os.getloadavg()[0],
    )


def format_table(rows: list[Row], read_gb_s: float, threads: int, flush: bool) -> str:
    lines = [
        f"decode attention, bf16, {NUM_HEADS} q heads / {NUM_KV_HEADS} kv heads, head {HEAD_SIZE}, "
        f"block {BLOCK_SIZE}, {threads} threads, {'cold' if flush else 'warm'} caches; "
        f"medians; 'read' is a plain read of the same bytes timed alongside; "
        f"1 GB read {read_gb_s:.1f} GB/s",
        f"{'batch':>5} {'ctx':>5} {'KV MB':>7} {'vLLM ms':>8} {'ours ms':>8} {'speedup':>7} "
        f"{'vLLM GB/s':>9} {'ours GB/s':>9} {'read GB/s':>9} {'of read':>7} {'of 1GB':>6} "
        f"{'split':>5} {'max|diff|':>9} {'load':>5}",
    ]
    for r in rows:
        lines.append(
            f"{r.batch:>5} {r.context:>5} {r.kv_mb:>7.1f} {r.vllm_ms:>8.3f} {r.ours_ms:>8.3f} "
            f"{r.speedup:>6.2f}x {r.vllm_gb_s:>9.1f} {r.ours_gb_s:>9.1f} {r.read_gb_s:>9.1f} "
            f"{r.ours_of_read:>6.0%} {r.ours_gb_s / read_gb_s:>6.0%} "
            f"{'yes' if r.split else 'no':>5} {r.max_abs_diff:>9.2g} {r.load_1m:>5.2f}"
        )
    return "\n".join(lines)


def combine_rounds(rounds: list[list[Row]]) -> list[Row]:
    """Per case, the median of every figure over the rounds (ratios as measured per round)."""
    combined = []
    for case_rows in zip(*rounds, strict=True):
        first = case_rows[0]
        med = {
            f: statistics.median(getattr(r, f) for r in case_rows)
            for f in (
                "kv_mb",
                "vllm_ms",
                "ours_ms",
                "speedup",
                "vllm_gb_s",
                "ours_gb_s",
                "read_gb_s",
                "ours_of_read",
                "load_1m",
            )
        }
        combined.append(
            Row(
                batch=first.batch,
                context=first.context,
                split=first.split,
                max_abs_diff=max(r.max_abs_diff for r in case_rows),
                **med,
            )
        )
    return combined


def spread_lines(rounds: list[list[Row]]) -> list[str]:
    lines = [f"spread over {len(rounds)} rounds (min / median / max):"]
    for case_rows in zip(*rounds, strict=True):
        sp = sorted(r.speedup for r in case_rows)
        fr = sorted(r.ours_of_read for r in case_rows)
        lines.append(
            f"  batch {case_rows[0].batch:>2} ctx {case_rows[0].context:>4}: "
            f"speedup {sp[0]:.2f}x / {statistics.median(sp):.2f}x / {sp[-1]:.2f}x, "
            f"of read {fr[0]:.0%} / {statistics.median(fr):.0%} / {fr[-1]:.0%}"
        )
    return lines


def verdict(rows: list[Row]) -> tuple[bool, str]:
    judged = [r for r in rows if r.batch >= 8 and r.context >= 1024]
    if not judged:
        return True, "no case with batch >= 8 and context >= 1K in this grid"
    misses = [r for r in judged if r.speedup < TARGET_SPEEDUP or r.ours_of_read < TARGET_BANDWIDTH_FRACTION]
    text = (
        f"targets (batch >= 8, context >= 1K): >= {TARGET_SPEEDUP}x vLLM and >= "
        f"{TARGET_BANDWIDTH_FRACTION:.0%} of read bandwidth: "
        f"{len(judged) - len(misses)}/{len(judged)} cases met"
    )
    for r in misses:
        text += f"\n  missed: batch {r.batch} ctx {r.context}: {r.speedup:.2f}x, {r.ours_of_read:.0%}"
    return not misses, text


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a reduced grid (4 cases)")
    p.add_argument(
        "--warm", action="store_true", help="do not evict caches between calls (small cases then fit in L2/L3)"
    )
    p.add_argument("--budget-s", type=float, default=3.0, help="time per case after the 7th sample pair (default 3)")
    p.add_argument(
        "--rounds", type=int, default=1, help="run the grid this many times and report per-case medians (default 1)"
    )
    p.add_argument("--vllm-isa", help="the ISA vLLM's kernel runs (default: the one vLLM picks here)")
    p.add_argument("--json", type=Path, help="also write the rows here")
    p.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from vllm import _custom_ops as ops
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    request_amx_tiles()
    isa = args.vllm_isa or _get_attn_isa(DTYPE, BLOCK_SIZE, HEAD_SIZE)
    gen = torch.Generator().manual_seed(0)
    read_before = measure_read_gb_s()
    if args.rounds < 1:
        raise SystemExit("--rounds must be at least 1")
    rounds: list[list[Row]] = []
    for i in range(args.rounds):
        rows = []
        for batch, context in QUICK_GRID if args.quick else FULL_GRID:
            rows.append(run_case(ops, isa, batch, context, not args.warm, args.budget_s, gen))
            print(f"  round {i + 1}/{args.rounds}: done batch {batch} ctx {context}", file=sys.stderr, flush=True)
        rounds.append(rows)
    rows = combine_rounds(rounds)
    read_after = measure_read_gb_s()
    read_gb_s = max(read_before, read_after)
    print(format_table(rows, read_gb_s, torch.get_num_threads(), not args.warm))
    print(
        f"plain read: {read_before:.1f} GB/s before, {read_after:.1f} GB/s after; "
        f"vLLM ISA '{isa}', the kernel's KV layout '{kernel_isa(isa)}'"
    )
    if len(rounds) > 1:
        print("\n".join(spread_lines(rounds)))
    ok, text = verdict(rows)
    print(text)
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "read_gb_s": read_gb_s,
                    "isa": isa,
                    "rows": [asdict(r) for r in rows],
                    "rounds": [[asdict(r) for r in rr] for rr in rounds],
                },
                indent=1,
            )
        )
    return 1 if (args.check and not ok) else 0


if __name__ == "__main__":
    sys.exit(main())
