"""The argument contract both decode kernels share (CPU and CUDA), checked in Python so a
mistake is reported by argument name before any compiled code runs."""

from __future__ import annotations

import torch

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16)


def check_decode_args(query: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                      context_lens: torch.Tensor, out: torch.Tensor | None,
                      device_type: str) -> None:
    """Raise TypeError/ValueError naming the argument that does not fit the kernels' contract."""
    if query.dim() != 3:
        raise ValueError(f"query must be [num_seqs, num_heads, head_size], got shape {tuple(query.shape)}")
    if kv_cache.dim() != 4:
        raise ValueError("kv_cache must be [num_blocks, num_kv_heads, block_size, 2 * head_size], "
                         f"got shape {tuple(kv_cache.shape)}")
    if query.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"query dtype must be float32 or bfloat16, got {query.dtype}")
    if kv_cache.dtype != query.dtype:
        raise TypeError(f"kv_cache dtype {kv_cache.dtype} must match query dtype {query.dtype}")
    num_seqs, num_heads, head_size = query.shape
    _, num_kv_heads, block_size, two_h = kv_cache.shape
    if head_size % 16 or not 16 <= head_size <= 512:
        raise ValueError(f"head_size must be a multiple of 16 in [16, 512], got {head_size}")
    if two_h != 2 * head_size:
        raise ValueError(f"kv_cache last dim must be 2 * head_size = {2 * head_size}, got {two_h}")
    if block_size % 16 or block_size == 0:
        raise ValueError(f"block_size must be a positive multiple of 16, got {block_size}")
    if num_kv_heads == 0 or num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    if not kv_cache.is_contiguous():
        raise ValueError("kv_cache must be contiguous")
    if query.stride(2) != 1:
        raise ValueError("query must be contiguous in the head dimension")
    if block_tables.dtype != torch.int32 or block_tables.dim() != 2 or block_tables.shape[0] != num_seqs:
        raise TypeError("block_tables must be int32 [num_seqs, max_blocks_per_seq], got "
                        f"{block_tables.dtype} {tuple(block_tables.shape)}")
    if context_lens.dtype != torch.int32 or context_lens.shape != (num_seqs,):
        raise TypeError(f"context_lens must be int32 [num_seqs={num_seqs}], got "
                        f"{context_lens.dtype} {tuple(context_lens.shape)}")
    for name, t in (("query", query), ("kv_cache", kv_cache), ("block_tables", block_tables),
                    ("context_lens", context_lens)):
        if t.device.type != device_type:
            raise ValueError(f"{name} must be on {device_type}, got {t.device}")
    if out is not None:
        if out.shape != query.shape or out.dtype != query.dtype or out.stride(2) != 1:
            raise ValueError(f"out must be {query.dtype} {tuple(query.shape)} contiguous in the "
                             f"head dimension, got {out.dtype} {tuple(out.shape)}")
