"""The CPU decode kernel as a Python call: shapes and dtypes checked here, with messages that
name the offending argument, before torch.ops.llmconsole.paged_attention_decode runs."""

from __future__ import annotations

import torch

from llmconsole.kernels.build import load_cpu_kernel
from llmconsole.kernels.checks import check_decode_args


def paged_attention_decode(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    *,
    out: torch.Tensor | None = None,
    partition_size: int = 0,
) -> torch.Tensor:
    """Attention of one query token per sequence over its paged context.

    query [num_seqs, num_heads, head_size]; kv_cache in vLLM's CPU layout (see kv_layout);
    block_tables int32 [num_seqs, max_blocks]; context_lens int32 [num_seqs]. partition_size
    (tokens, rounded up to whole blocks) forces the split-KV path; 0 lets the kernel choose.
    Returns out (allocated when not given), same shape and dtype as query.
    """
    check_decode_args(query, kv_cache, block_tables, context_lens, out, device_type="cpu")
    load_cpu_kernel()
    if out is None:
        out = torch.empty_like(query, memory_format=torch.contiguous_format)
    torch.ops.llmconsole.paged_attention_decode(
        out, query, kv_cache, block_tables.contiguous(), context_lens.contiguous(), float(scale), int(partition_size)
    )
    return out


def partition_tokens(context_lens: torch.Tensor, num_kv_heads: int, block_size: int, partition_size: int = 0) -> int:
    """Tokens per partition the kernel would use; a context longer than this takes the
    split-KV path. Depends on the thread count (torch.get_num_threads())."""
    load_cpu_kernel()
    return int(
        torch.ops.llmconsole.paged_attention_decode_partition_tokens(
            context_lens.to(torch.int32).contiguous(), int(num_kv_heads), int(block_size), int(partition_size)
        )
    )
