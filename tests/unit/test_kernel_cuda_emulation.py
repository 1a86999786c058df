"""The CUDA decode kernel's arithmetic, checked without a GPU.

cuda_emulation walks the kernel's grid, warps and lanes: block-table lookups, cp.async copies
into the swizzled stage ring, ldmatrix/mma/movmatrix fragments, the online softmax, the CTA's
combine of its warps, the split-K partial results and their merge. Here it runs on ragged
batches in vLLM's CUDA layouts, over head sizes, block sizes, GQA ratios, dtypes (fp8 KV with
scales included) and split counts, against the float64 reference, with every element compared,
poisoned memory around every context and a count of every K/V element read. Its constants and
split chooser are compared with the compiled library's (when nvcc is present).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

from llmconsole.kernels import cuda_emulation  # noqa: E402
from llmconsole.kernels.cuda_build import CudaBuildOptions, compile_cuda, find_nvcc  # noqa: E402
from llmconsole.kernels.cuda_emulation import (  # noqa: E402
    MAX_SPLITS,
    choose_splits,
    emulate_decode,
    head_tiles,
    kernel_geometry,
    split_tokens,
)
from llmconsole.kernels.kv_layout import (  # noqa: E402
    CUDA_LAYOUTS,
    random_cuda_paged_cache,
    split_cuda_kv_cache,
)
from llmconsole.kernels.reference import compare_to_reference, cuda_layout_decode_reference  # noqa: E402

needs_nvcc = pytest.mark.skipif(find_nvcc() is None, reason="nvcc (CUDA toolkit) not found; set CUDA_HOME or PATH")

FP8 = torch.float8_e4m3fn

# (query dtype, cache dtype, head size, GQA group, block size, context lengths, kv heads, splits
# (0: the chooser's, for a 132-SM GPU at 2 CTAs per SM), layout)
CASES = [
    (torch.bfloat16, torch.bfloat16, 128, 4, 16, [1, 15, 16, 17, 161], 2, 1, "LBNHC"),
    (torch.bfloat16, torch.bfloat16, 128, 4, 16, [0, 33, 300, 7], 2, 3, "LBHNC"),
    (torch.bfloat16, torch.bfloat16, 64, 1, 32, [64, 65, 200], 3, 2, "BLNHC"),
    (torch.float16, torch.float16, 64, 5, 16, [250, 3, 48], 2, 0, "BLHNC"),
    (torch.float16, torch.float16, 128, 8, 32, [129, 31], 1, 7, "LHBNC"),
    (torch.bfloat16, torch.bfloat16, 64, 12, 64, [90, 200], 1, 2, "BHLNC"),
    (torch.bfloat16, torch.bfloat16, 64, 16, 16, [40, 1], 2, 1, "LBNHC"),
    (torch.float16, torch.float16, 64, 24, 16, [77], 1, 2, "LBNHC"),  # 2 head tiles
    (torch.bfloat16, torch.bfloat16, 256, 2, 16, [50, 17], 1, 2, "LBNHC"),
    (torch.bfloat16, torch.bfloat16, 256, 16, 32, [40], 1, 1, "LBHNC"),  # Q fragments in smem
    (torch.bfloat16, FP8, 128, 4, 16, [1, 100, 37], 2, 2, "LBNHC"),
    (torch.float16, FP8, 64, 3, 32, [70, 0, 16], 2, 0, "BLNHC"),
    (torch.bfloat16, torch.bfloat16, 64, 4, 16, [2100, 5], 1, 0, "LBNHC"),  # > 32 tiles per warp
]


def _case_id(case: tuple) -> str:
    qd, kvd, d, group, bs, lens, kvh, splits, layout = case
    kv = "fp8" if kvd == FP8 else str(kvd).removeprefix("torch.")
    return f"{str(qd).removeprefix('torch.')}-{kv}-d{d}-g{group}-bs{bs}-kv{kvh}-s{splits or 'auto'}-{layout}-{len(lens)}seq"


def run_case(case: tuple, seed: int = 0):
    qd, kvd, d, group, bs, lens, kvh, splits, layout = case
    gen = torch.Generator().manual_seed(seed)
    kv_cache, table, seq_lens = random_cuda_paged_cache(lens, kvh, d, bs, kvd, layout, generator=gen)
    key_cache, value_cache = split_cuda_kv_cache(kv_cache, d)
    query = (torch.randn(len(lens), kvh * group, d, generator=gen) * 2).to(qd)
    k_scale, v_scale = (0.6, 1.7) if kvd == FP8 else (1.0, 1.0)
    if not splits:
        splits = choose_splits(len(lens), kvh * group, kvh, max(lens), 132, 2)
    scale = d**-0.5
    ref = cuda_layout_decode_reference(query, key_cache, value_cache, table, seq_lens, scale, k_scale, v_scale)
    out, trace = emulate_decode(
        query, key_cache, value_cache, table, seq_lens, scale, splits, k_scale=k_scale, v_scale=v_scale
    )
    return out, ref, trace, (key_cache, value_cache, table, lens)


def expected_reads(cache: torch.Tensor, table: torch.Tensor, lens: list[int], per_element: int) -> torch.Tensor:
    """Reads per element of the cache's storage if every K (or V) element of every context is
    read `per_element` times and nothing else is read."""
    elems = cache.untyped_storage().nbytes() // cache.element_size()
    want = torch.zeros(elems, dtype=torch.int64)
    _, bs, kvh, d = cache.shape
    sb, st, sh, _ = cache.stride()
    for s, n in enumerate(lens):
        t = torch.arange(n)
        blocks = table[s, t // bs].long()
        rows = cache.storage_offset() + blocks * sb + (t % bs) * st
        offsets = rows[:, None, None] + torch.arange(kvh)[None, :, None] * sh + torch.arange(d)
        want.index_add_(0, offsets.reshape(-1), torch.full((offsets.numel(),), per_element))
    return want


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_emulated_kernel_matches_float64_reference(case):
    out, ref, trace, (key_cache, value_cache, table, lens) = run_case(case)
    result = compare_to_reference(out, ref)
    assert result["finite"], "NaN/Inf in the output: a read outside a context or of unwritten memory"
    assert result["ok"], result
    # Every output element written exactly once (by the CTA, or by the merge for several splits).
    assert bool((trace.out_writes == 1).all())
    # Each K and V element of each context read once per head tile, nothing else read.
    assert torch.equal(trace.key_reads, expected_reads(key_cache, table, lens, trace.head_tiles))
    assert torch.equal(trace.value_reads, expected_reads(value_cache, table, lens, trace.head_tiles))


@pytest.mark.parametrize("threads,stage_bytes", [(32, 24576), (256, 24576), (128, 16384), (64, 49152)])
def test_build_variants_compute_the_same(threads, stage_bytes):
    """Warps per CTA and the stage ring's depth change who copies and computes which tile, not
    the result."""
    qd, kvd, d, group, bs, lens, kvh, splits, layout = CASES[1]
    gen = torch.Generator().manual_seed(7)
    kv_cache, table, seq_lens = random_cuda_paged_cache(lens, kvh, d, bs, kvd, layout, generator=gen)
    key_cache, value_cache = split_cuda_kv_cache(kv_cache, d)
    query = (torch.randn(len(lens), kvh * group, d, generator=gen) * 2).to(qd)
    ref = cuda_layout_decode_reference(query, key_cache, value_cache, table, seq_lens, d**-0.5)
    out, trace = emulate_decode(
        query, key_cache, value_cache, table, seq_lens, d**-0.5, splits, threads=threads, stage_bytes=stage_bytes
    )
    assert trace.geometry.warps == threads // 32
    assert compare_to_reference(out, ref)["ok"]
    assert torch.equal(trace.key_reads, expected_reads(key_cache, table, lens, 1))


def test_split_counts_agree():
    """The same batch through 1, 2, 5 and the most splits gives the same output to an ulp."""
    case = (torch.bfloat16, torch.bfloat16, 64, 4, 16, [1, 100, 333], 1, 1, "LBNHC")
    base, ref, _, _ = run_case(case, seed=3)
    for splits in (2, 5, MAX_SPLITS):
        out, _, _, _ = run_case(case[:7] + (splits, case[8]), seed=3)
        assert compare_to_reference(out, ref)["ok"], splits
        assert float((out.double() - base.double()).abs().max()) <= 2 * float(ref.abs().max()) * 2.0**-8


def test_a_broken_fragment_layout_is_caught(monkeypatch):
    """The check has teeth: P^T left untransposed (no movmatrix) fails the reference."""
    monkeypatch.setattr(cuda_emulation, "movmatrix_trans", lambda x: x)
    out, ref, _, _ = run_case(CASES[0])
    assert not compare_to_reference(out, ref)["ok"]


def test_reading_a_stage_before_it_lands_is_caught(monkeypatch):
    """Waiting for one group fewer than the kernel does reads in-flight (NaN) shared memory."""
    wait = cuda_emulation._Warp.wait
    monkeypatch.setattr(cuda_emulation._Warp, "wait", lambda self, allowed: wait(self, allowed + 1))
    out, ref, _, _ = run_case(CASES[0])
    assert not compare_to_reference(out, ref)["ok"]


def test_split_chooser():
    # One wave of CTAs already (batch 64 x 8 KV heads on 132 SMs x 2): no split.
    assert choose_splits(64, 32, 8, 4096, 132, 2) == 1
    # Batch 1 at 16K: enough splits to fill the GPU's CTA slots to within 10%.
    s = choose_splits(1, 32, 8, 16384, 132, 2)
    assert 0.9 * 264 <= 8 * s <= 264
    # A short context is split no finer than the smallest partition.
    assert choose_splits(1, 32, 8, 300, 132, 2) == 3
    assert choose_splits(1, 32, 8, 100, 132, 2) == 1
    # Never more than the workspace layout allows; groups above 16 count their head tiles.
    assert 0.9 * MAX_SPLITS <= choose_splits(1, 1, 1, 10**7, 1000, 4) <= MAX_SPLITS
    assert head_tiles(24) == 2 and choose_splits(1, 24, 1, 4096, 4, 1) < choose_splits(1, 8, 1, 4096, 4, 1)
    # Every sequence's parts are whole tiles and cover it.
    for n in (0, 1, 15, 16, 17, 1000, 4097):
        for splits in (1, 2, 3, 7, 64):
            per = split_tokens(n, splits)
            assert per % 16 == 0 and per * splits >= n


def test_geometry_fits_every_target():
    for d in (64, 128, 256):
        for group in (1, 8, 16):
            for kv_bytes in (1, 2):
                geom = kernel_geometry(d, group, kv_bytes)
                assert 2 <= geom.stages <= 4
                assert geom.heads_per_cta * (d + 4) * 4 <= geom.warp_bytes  # the combine area
                assert geom.cta_bytes + geom.static_bytes <= 163 * 1024  # sm_80's per-CTA limit
    assert kernel_geometry(128, 4).stages == 3 and kernel_geometry(128, 4).cta_bytes == 100352
    assert kernel_geometry(256, 16).q_in_smem and not kernel_geometry(256, 8).q_in_smem


# ---- against the compiled library ------------------------------------------------------------


@pytest.fixture(scope="module")
def library():
    from llmconsole.kernels.cuda_lib import CudaKernelLibrary

    result = compile_cuda(CudaBuildOptions(only_head_size=128), archs=("sm_90",), kind="shared")
    return CudaKernelLibrary(result.path)


@needs_nvcc
def test_geometry_mirrors_the_library(library):
    for d in (64, 128, 256):
        for group in (1, 4, 8, 9, 16, 24):
            for fp8 in (False, True):
                mirror = kernel_geometry(d, group, 1 if fp8 else 2).library_values()
                assert library.geometry(d, group, fp8) == mirror, (d, group, fp8)


@needs_nvcc
def test_split_chooser_mirrors_the_library(library):
    for num_seqs in (1, 2, 3, 8, 25, 32, 64, 200):
        for heads, kv_heads in ((32, 8), (8, 1), (64, 4), (24, 1), (12, 12)):
            for ctx in (1, 100, 129, 1024, 4096, 16384, 131072):
                for sms, ctas in ((132, 2), (108, 1), (132, 3), (16, 4)):
                    want = choose_splits(num_seqs, heads, kv_heads, ctx, sms, ctas)
                    got = library.choose_splits(num_seqs, heads, kv_heads, ctx, sms, ctas)
                    assert got == want, (num_seqs, heads, kv_heads, ctx, sms, ctas)


@needs_nvcc
def test_workspace_size_mirrors_the_library(library):
    for args in ((1, 32, 128, 1), (4, 32, 128, 3), (64, 8, 256, 256)):
        assert library.workspace_bytes(*args) == cuda_emulation.workspace_bytes(*args)


def test_layouts_cover_vllm():
    """Every KVCacheLayout of the installed vLLM has a name here (when vLLM imports)."""
    try:
        from vllm.v1.kv_cache_layout import KVCacheLayout
    except Exception as exc:  # vLLM missing or unimportable: nothing to compare with
        pytest.skip(f"vllm.v1.kv_cache_layout unavailable: {exc}")
    assert {layout.name for layout in KVCacheLayout} <= set(CUDA_LAYOUTS)
