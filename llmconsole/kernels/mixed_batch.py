"""A batch that mixes decode and prefill rows, cut in two: decode rows for llmconsole's kernel,
prefill rows for vLLM's op.

Under continuous batching most steps carry a new request's prefill (or a chunk of it) next to
the running requests' decode tokens. vLLM's CPU op takes such a batch whole; the custom kernel
takes only rows with one query token. The cut is clean when the batch is ordered decodes
first, which vLLM's model runner does for any attention backend whose metadata builder sets
`reorder_batch_threshold = 1` (FlashInfer and the MLA backends rely on the same reorder):
requests 0..num_decodes-1 then hold query tokens 0..num_decodes-1, one each, and the prefill
requests are a contiguous tail. The tail is a batch of its own for vLLM's op: its
query_start_loc rebased to 0, its rows of seq_lens and block_table, and scheduler metadata
built for it (once per step, in the metadata builder; every layer of the step shares it).

Nothing here depends on the batch actually being reordered: the split takes only the leading
one-token requests, so an unordered batch sends fewer rows to the kernel, never wrong ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PrefillPart:
    """The vLLM-side half of a mixed batch. Tokens [num_decodes, num_tokens) of the step's
    query belong to it; requests [num_decodes, num_reqs) are its rows."""

    num_decodes: int
    num_reqs: int
    query_start_loc: torch.Tensor  # int32 [num_reqs - num_decodes + 1], starting at 0
    seq_lens: torch.Tensor  # int32 [num_reqs - num_decodes]
    block_table: torch.Tensor  # int32 [num_reqs - num_decodes, max_blocks]
    scheduler_metadata: torch.Tensor

    @property
    def num_prefill_tokens(self) -> int:
        return int(self.query_start_loc[-1])


def leading_decodes(query_start_loc: torch.Tensor, num_reqs: int) -> int:
    """How many requests at the front of the batch have exactly one query token.

    With one token each, request i's token is token i, so the count is the largest k with
    query_start_loc[i] == i for every i <= k."""
    starts = query_start_loc[: num_reqs + 1]
    off = (starts != torch.arange(starts.shape[0], dtype=starts.dtype)).nonzero()
    return num_reqs if off.shape[0] == 0 else int(off[0, 0]) - 1


def plan_prefill_part(
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    num_reqs: int,
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    isa: str,
    sliding_window: int,
    kv_cache_dtype: str,
    enable_kv_split: bool,
) -> PrefillPart | None:
    """The prefill half of a mixed batch, with vLLM's scheduler metadata for it; None when the
    batch has no leading decode rows (all prefill) or no prefill rows (all decode)."""
    from vllm import _custom_ops as ops

    num_decodes = leading_decodes(query_start_loc, num_reqs)
    if num_decodes == 0 or num_decodes == num_reqs:
        return None
    starts = (query_start_loc[num_decodes : num_reqs + 1] - num_decodes).contiguous()
    lens = seq_lens[num_decodes:num_reqs].contiguous()
    table = block_table[num_decodes:num_reqs]
    meta = ops.cpu_attn_get_scheduler_metadata(
        num_reqs=num_reqs - num_decodes,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        seq_lens=lens,
        dtype=dtype,
        query_start_loc=starts,
        causal=True,
        sliding_window_size=sliding_window,
        isa=isa,
        enable_kv_split=enable_kv_split,
        dynamic_causal=None,
        kv_cache_dtype=kv_cache_dtype,
    )
    return PrefillPart(
        num_decodes=num_decodes,
        num_reqs=num_reqs,
        query_start_loc=starts,
        seq_lens=lens,
        block_table=table,
        scheduler_metadata=meta,
    )


def run_mixed(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    output: torch.Tensor,
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    num_tokens: int,
    part: PrefillPart,
    scale: float,
    *,
    alibi_slopes: torch.Tensor | None = None,
    sliding_window: int = -1,
    softcap: float = 0.0,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    kv_cache_dtype: str = "auto",
) -> None:
    """Attention of a mixed batch into output [num_tokens, num_heads, head_size]: the leading
    decode rows by torch.ops.llmconsole.paged_attention_decode, the rest by vLLM's
    cpu_attention_with_kv_cache. kv_cache is vLLM's [num_blocks, kv_heads, block_size, 2*H]."""
    from vllm import _custom_ops as ops

    nd = part.num_decodes
    torch.ops.llmconsole.paged_attention_decode(
        output[:nd], query[:nd], kv_cache, block_table[:nd], seq_lens[:nd], float(scale), 0
    )
    num_blocks, num_kv_heads, block_size, _ = kv_cache.shape
    key_cache, value_cache = kv_cache.view(num_blocks, num_kv_heads, 2 * block_size, -1).chunk(2, dim=2)
    ops.cpu_attention_with_kv_cache(
        query=query[nd:num_tokens],
        key_cache=key_cache,
        value_cache=value_cache,
        output=output[nd:num_tokens],
        query_start_loc=part.query_start_loc,
        seq_lens=part.seq_lens,
        scale=scale,
        causal=True,
        alibi_slopes=alibi_slopes,
        sliding_window=sliding_window,
        block_table=part.block_table,
        softcap=softcap,
        scheduler_metadata=part.scheduler_metadata,
        s_aux=None,
        dynamic_causal=None,
        k_scale=k_scale,
        v_scale=v_scale,
        kv_cache_dtype=kv_cache_dtype,
    )
