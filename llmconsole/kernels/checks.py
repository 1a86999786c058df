"""The argument contract both decode kernels share (CPU and CUDA), checked in Python so a
mistake is reported by argument name before any compiled code runs."""

from __future__ import annotations

import torch

SUPPORTED_DTYPES = (torch.float32, torch.bfloat16)


def check_decode_args(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    out: torch.Tensor | None,
    device_type: str,
) -> None:
    """Raise TypeError/ValueError naming the argument that does not fit the kernels' contract."""
    if query.dim() != 3:
        raise ValueError(f"query must be [num_seqs, num_heads, head_size], got shape {tuple(query.shape)}")
    if kv_cache.dim() != 4:
        raise ValueError(
            f"kv_cache must be [num_blocks, num_kv_heads, block_size, 2 * head_size], got shape {tuple(kv_cache.shape)}"
        )
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
        raise TypeError(
            "block_tables must be int32 [num_seqs, max_blocks_per_seq], got "
            f"{block_tables.dtype} {tuple(block_tables.shape)}"
        )
    if context_lens.dtype != torch.int32 or context_lens.shape != (num_seqs,):
        raise TypeError(
            f"context_lens must be int32 [num_seqs={num_seqs}], got {context_lens.dtype} {tuple(context_lens.shape)}"
        )
    for name, t in (
        ("query", query),
        ("kv_cache", kv_cache),
        ("block_tables", block_tables),
        ("context_lens", context_lens),
    ):
        if t.device.type != device_type:
            raise ValueError(f"{name} must be on {device_type}, got {t.device}")
    if out is not None:
        if out.shape != query.shape or out.dtype != query.dtype or out.stride(2) != 1:
            raise ValueError(
                f"out must be {query.dtype} {tuple(query.shape)} contiguous in the "
                f"head dimension, got {out.dtype} {tuple(out.shape)}"
            )


CUDA_DTYPES = (torch.bfloat16, torch.float16)
CUDA_FP8_DTYPES = (torch.float8_e4m3fn, torch.uint8)  # uint8: e4m3 bytes, as vLLM allocates fp8
CUDA_HEAD_SIZES = (64, 128, 256)


def check_cuda_decode_args(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor | None,
) -> None:
    """The CUDA kernel's contract on vLLM's CUDA layout (see cuda_lib): raise TypeError or
    ValueError naming the argument that does not fit it."""
    if query.dim() != 3:
        raise ValueError(f"query must be [num_seqs, num_heads, head_size], got shape {tuple(query.shape)}")
    if query.dtype not in CUDA_DTYPES:
        raise TypeError(f"query dtype must be bfloat16 or float16, got {query.dtype}")
    num_seqs, num_heads, head_size = query.shape
    for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        if cache.dim() != 4 or cache.shape[3] != head_size:
            raise ValueError(
                f"{name} must be [num_blocks, block_size, num_kv_heads, head_size={head_size}] "
                f"(kv_cache.transpose(1, 2).split(head_size, -1)), got shape {tuple(cache.shape)}"
            )
        if cache.dtype != query.dtype and cache.dtype not in CUDA_FP8_DTYPES:
            raise TypeError(f"{name} dtype must be the query's ({query.dtype}) or fp8 e4m3, got {cache.dtype}")
        if cache.stride(3) != 1:
            raise ValueError(f"{name} must be contiguous in the head dimension")
        align = 16 // cache.element_size()
        if any(s % align for s in cache.stride()[:3]) or cache.data_ptr() % 16:
            raise ValueError(
                f"{name} rows must be 16-byte aligned: strides {cache.stride()} must be multiples of {align} elements"
            )
    if key_cache.shape != value_cache.shape or key_cache.dtype != value_cache.dtype:
        raise ValueError(
            f"key_cache {key_cache.dtype} {tuple(key_cache.shape)} and value_cache "
            f"{value_cache.dtype} {tuple(value_cache.shape)} must match"
        )
    _, block_size, num_kv_heads, _ = key_cache.shape
    if head_size not in CUDA_HEAD_SIZES:
        raise ValueError(f"head_size must be one of {CUDA_HEAD_SIZES}, got {head_size}")
    if block_size % 16 or block_size == 0:
        raise ValueError(f"block_size must be a positive multiple of 16, got {block_size}")
    if num_kv_heads == 0 or num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    if query.stride(2) != 1 or query.stride(0) % 8 or query.stride(1) % 8 or query.data_ptr() % 16:
        raise ValueError(
            "query must be contiguous in the head dimension, 16-byte aligned, with "
            f"strides in multiples of 8 elements, got {query.stride()}"
        )
    if (
        block_tables.dtype != torch.int32
        or block_tables.dim() != 2
        or block_tables.shape[0] < num_seqs
        or block_tables.stride(1) != 1
    ):
        raise TypeError(
            "block_tables must be int32 [num_seqs, max_blocks_per_seq] with contiguous rows, "
            f"got {block_tables.dtype} {tuple(block_tables.shape)}"
        )
    if seq_lens.dtype != torch.int32 or seq_lens.dim() != 1 or seq_lens.shape[0] < num_seqs or seq_lens.stride(0) != 1:
        raise TypeError(f"seq_lens must be int32 [num_seqs={num_seqs}], got {seq_lens.dtype} {tuple(seq_lens.shape)}")
    if out is not None:
        if out.shape != query.shape or out.dtype != query.dtype or out.stride(2) != 1 or out.device != query.device:
            raise ValueError(
                f"out must be {query.dtype} {tuple(query.shape)} on {query.device}, contiguous "
                f"in the head dimension, got {out.dtype} {tuple(out.shape)} on {out.device}"
            )
    for name, t in (
        ("query", query),
        ("key_cache", key_cache),
        ("value_cache", value_cache),
        ("block_tables", block_tables),
        ("seq_lens", seq_lens),
    ):
        if t.device.type != "cuda" or t.device != query.device:
            raise ValueError(f"{name} must be on the query's CUDA device, got {t.device}")
