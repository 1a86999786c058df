"""llmconsole's CUDA decode kernel on vLLM's CUDA KV cache: the one place an engine calls the
kernel's library (cuda_lib.py), so that a change of the kernel's API or layout is followed here.

vLLM's CUDA backends (FlashAttention, Triton) hand each layer a logical
[num_blocks, num_kv_heads, block_size, 2 * head_size] view, K then V along the last axis, whose
strides follow the KV layout vLLM resolved for the engine (LBNHC unless VLLM_KV_CACHE_LAYOUT
says otherwise: per block, token-major, the heads inside; vllm/v1/kv_cache_layout.py). The
kernel's library as built today reads vLLM's CPU layout instead (per block and KV head: K
transposed, then V; kv_layout.py). Until the kernel reads the CUDA layout itself, `repack`
copies the blocks the decode rows use into the layout it reads, with a block table renumbered
onto the copy. That is correct on any strides, but it costs a read and a write of those rows'
KV per layer and step on top of the kernel's own read: with it the custom kernel cannot beat
vLLM's on a GPU, and a GPU engine on it is for checking, not for speed.
"""

from __future__ import annotations

import threading
from typing import Protocol

import torch

from llmconsole.kernels.checks import SUPPORTED_DTYPES


class DecodeKernel(Protocol):
    """The kernel's call (CudaKernelLibrary.paged_attention_decode): decode attention of
    `query` [rows, heads, head_size] over a cache in the layout kv_layout.py describes, written
    into `out`. Tests pass the float64 reference in its place."""

    def __call__(self, query: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                 context_lens: torch.Tensor, scale: float, *, max_context_len: int | None = None,
                 out: torch.Tensor | None = None) -> torch.Tensor: ...


def layout_refusal(query: torch.Tensor, kv_cache: torch.Tensor, block_table: torch.Tensor,
                   seq_lens: torch.Tensor) -> str | None:
    """Why the kernel cannot take these decode rows (a fallback reason, counted), or None."""
    if query.dtype not in SUPPORTED_DTYPES or kv_cache.dtype != query.dtype:
        return f"dtype {query.dtype} with KV cache {kv_cache.dtype}"
    if kv_cache.dim() != 4 or kv_cache.shape[3] != 2 * query.shape[2]:
        return f"KV cache view {tuple(kv_cache.shape)} (not K and V of one head size)"
    head_size, block_size = query.shape[2], kv_cache.shape[2]
    if head_size % 16 or head_size > 512:
        return f"head size {head_size}"
    if block_size % 16:
        return f"block size {block_size}"
    if query.shape[1] % kv_cache.shape[1]:
        return f"{query.shape[1]} query heads over {kv_cache.shape[1]} KV heads"
    if block_table.dtype != torch.int32 or seq_lens.dtype != torch.int32:
        return f"{block_table.dtype} block tables / {seq_lens.dtype} lengths"
    return None


def repack(kv_cache: torch.Tensor, block_table: torch.Tensor,
           max_seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The blocks `block_table` [rows, max_blocks] uses for contexts up to `max_seq_len`, copied
    from vLLM's CUDA view into the kernel's layout, and the table renumbered onto the copy
    (row r's j-th block is block r * used + j of it)."""
    num_blocks, num_kv_heads, block_size, two_h = kv_cache.shape
    head_size = two_h // 2
    rows = block_table.shape[0]
    used = max(1, min(block_table.shape[1], -(-max_seq_len // block_size)))
    # Entries past a row's own blocks may hold anything; the kernel never reads those blocks.
    ids = block_table[:, :used].reshape(-1).long().clamp(0, num_blocks - 1)
    blocks = kv_cache.index_select(0, ids)                    # [rows * used, heads, block, 2h]
    n = blocks.shape[0]
    k_t = blocks[..., :head_size].transpose(2, 3).reshape(n, num_kv_heads, head_size * block_size)
    v = blocks[..., head_size:].reshape(n, num_kv_heads, block_size * head_size)
    packed = torch.cat((k_t, v), dim=2).view(n, num_kv_heads, block_size, two_h)
    table = torch.arange(n, dtype=torch.int32, device=kv_cache.device).view(rows, used)
    return packed, table


def decode_rows(kernel: DecodeKernel, query: torch.Tensor, kv_cache: torch.Tensor,
                block_table: torch.Tensor, seq_lens: torch.Tensor, scale: float, out: torch.Tensor,
                max_seq_len: int) -> None:
    """Decode attention of `query` [rows, heads, head_size] (one query token per row, the last of
    its context) over vLLM's CUDA KV view, into `out`; `max_seq_len` bounds every row's context."""
    packed, table = repack(kv_cache, block_table, max_seq_len)
    kernel(query, packed, table, seq_lens, scale, max_context_len=max_seq_len, out=out)


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
