"""llmconsole's CUDA decode kernel on vLLM's CUDA KV cache: the one place an engine calls the
kernel's library (cuda_lib.py), so that a change of the kernel's API is followed here.

vLLM's CUDA backends (FlashAttention, Triton) hand each layer a logical
[num_blocks, num_kv_heads, block_size, 2 * head_size] view, K then V along the last axis, whose
strides follow the KV layout vLLM resolved for the engine (LBNHC unless VLLM_KV_CACHE_LAYOUT
says otherwise; vllm/v1/kv_cache_layout.py). The kernel reads that cache where it lies: the key
and value views are taken as FlashAttention takes them (`kv_cache.transpose(1, 2).split(...)`,
each [num_blocks, block_size, num_kv_heads, head_size]) and the kernel follows their strides, so
nothing is copied and every KV byte is read once, by the kernel.
"""

from __future__ import annotations

import threading
from typing import Protocol

import torch


class DecodeKernel(Protocol):
    """The kernel's call (CudaKernelLibrary.paged_attention_decode): decode attention of `query`
    [rows, heads, head_size] over vLLM's key and value cache views, written into `out`. Tests
    pass the float64 reference (reference.cuda_layout_decode_reference) in its place."""

    def __call__(
        self,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
        *,
        max_seq_len: int | None = None,
        out: torch.Tensor | None = None,
        k_scale: float | torch.Tensor | None = None,
        v_scale: float | torch.Tensor | None = None,
    ) -> torch.Tensor: ...


# What the kernel is built for (paged_attention.cu): the caches' dtypes by the query's, head sizes.
_KV_DTYPES = (torch.float8_e4m3fn, torch.uint8)  # an fp8 cache, as vLLM allocates it, with scales
_QUERY_DTYPES = (torch.bfloat16, torch.float16)
_HEAD_SIZES = (64, 128, 256)


def layout_refusal(
    query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor
) -> str | None:
    """Why the kernel cannot take these decode rows (a fallback reason, counted), or None."""
    if query.dtype not in _QUERY_DTYPES:
        return f"query dtype {query.dtype}"
    if kv_cache.dtype != query.dtype and kv_cache.dtype not in _KV_DTYPES:
        return f"KV cache dtype {kv_cache.dtype} with {query.dtype} queries"
    if kv_cache.dim() != 4 or kv_cache.shape[3] != 2 * query.shape[2]:
        return f"KV cache view {tuple(kv_cache.shape)} (not K and V of one head size)"
    head_size, block_size = query.shape[2], kv_cache.shape[2]
    if head_size not in _HEAD_SIZES:
        return f"head size {head_size}"
    if block_size % 16:
        return f"block size {block_size}"
    if query.shape[1] % kv_cache.shape[1]:
        return f"{query.shape[1]} query heads over {kv_cache.shape[1]} KV heads"
    if block_table.dtype != torch.int32 or seq_lens.dtype != torch.int32:
        return f"{block_table.dtype} block tables / {seq_lens.dtype} lengths"
    return None


def kv_views(kv_cache: torch.Tensor, head_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The key and value views of vLLM's logical cache, as its FlashAttention backend takes them."""
    kv = kv_cache.transpose(1, 2)
    return kv[..., :head_size], kv[..., head_size:]


def decode_rows(
    kernel: DecodeKernel,
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    max_seq_len: int,
    k_scale: float | torch.Tensor | None = None,
    v_scale: float | torch.Tensor | None = None,
) -> None:
    """Decode attention of `query` [rows, heads, head_size] (one query token per row, the last of
    its context) over vLLM's CUDA KV view, into `out`; `max_seq_len` bounds every row's context.
    An fp8 cache's per-tensor scales (the layer's _k_scale/_v_scale) pass through."""
    key_cache, value_cache = kv_views(kv_cache, query.shape[2])
    kernel(
        query,
        key_cache,
        value_cache,
        block_table,
        seq_lens,
        scale,
        max_seq_len=max_seq_len,
        out=out,
        k_scale=k_scale,
        v_scale=v_scale,
    )


_lock = threading.Lock()


def load_kernel(device: torch.device) -> tuple[DecodeKernel, str]:
    """Build (once per source and options, cached on disk) and load the kernel's library for
    `device`'s GPU: (its decode call, the library's path). Raises CudaBuildError or OSError."""
    from llmconsole.kernels.cuda_build import CudaBuildOptions, compile_cuda
    from llmconsole.kernels.cuda_lib import CudaKernelLibrary

    with _lock:
        major, minor = torch.cuda.get_device_capability(device)
        result = compile_cuda(CudaBuildOptions(), archs=(f"sm_{major}{minor}",), kind="shared")
        return CudaKernelLibrary(result.path).paged_attention_decode, result.path
