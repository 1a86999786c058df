"""vLLM's CUDA KV-cache views, built with torch alone so the GPU checks run where no vLLM is
installed; tests/unit/test_kernel_cuda_backend.py checks them against vLLM's own
create_kv_cache_views.

Each layer's cache is a logical [num_blocks, num_kv_heads, block_size, 2 * head_size] view (K
then V along the last axis) whose memory order is the resolved KVCacheLayout's: LBNHC (vLLM's
default for FlashAttention and Triton: per block, token-major, the heads inside) or LBHNC (HND).
The backends read it as key_cache, value_cache = cache.transpose(1, 2).split(head_size, -1),
each [num_blocks, block_size, num_kv_heads, head_size], and that is how these helpers write it.
"""

from __future__ import annotations

import torch

# Memory order of the logical [B, H, N, C] axes for each layout.
LAYOUT_ORDER = {"LBNHC": (0, 2, 1, 3), "LBHNC": (0, 1, 2, 3)}


def cuda_kv_cache(
    num_blocks: int,
    num_kv_heads: int,
    block_size: int,
    head_size: int,
    dtype: torch.dtype,
    layout: str = "LBNHC",
    device: str | torch.device = "cpu",
    fill: float = float("nan"),
) -> torch.Tensor:
    """A per-layer cache view as vLLM's CUDA backends get it, every slot holding `fill`."""
    order = LAYOUT_ORDER[layout]
    logical = (num_blocks, num_kv_heads, block_size, 2 * head_size)
    raw = torch.full([logical[i] for i in order], fill, dtype=dtype, device=device)
    return raw.permute([order.index(i) for i in range(4)])


def kv_views(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(key_cache, value_cache), each [num_blocks, block_size, num_kv_heads, head_size]."""
    key_cache, value_cache = cache.transpose(1, 2).split(cache.shape[3] // 2, dim=-1)
    return key_cache, value_cache


def write_kv(cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, slots: torch.Tensor) -> None:
    """Store key/value [tokens, num_kv_heads, head_size] at flat slots (block * block_size +
    offset), as vLLM's reshape_and_cache_flash does."""
    block_size = cache.shape[2]
    key_cache, value_cache = kv_views(cache)
    blocks, offsets = slots.long() // block_size, slots.long() % block_size
    key_cache[blocks, offsets] = key.to(cache.dtype)
    value_cache[blocks, offsets] = value.to(cache.dtype)


def gather_kv(cache: torch.Tensor, table_row: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's keys and values in token order: two [n, num_kv_heads, head_size]."""
    block_size = cache.shape[2]
    key_cache, value_cache = kv_views(cache)
    pos = torch.arange(n, device=cache.device)
    blocks = table_row.to(cache.device)[pos // block_size].long()
    return key_cache[blocks, pos % block_size], value_cache[blocks, pos % block_size]


def paged_batch(
    rows: list[tuple[int, int]],
    num_kv_heads: int,
    group: int,
    head_size: int,
    block_size: int,
    dtype: torch.dtype,
    layout: str,
    gen: torch.Generator,
    spare_blocks: int = 3,
    device: str | torch.device = "cpu",
):
    """A step as vLLM's CUDA backends see it. rows: (context length, query length) per request,
    query tokens being the last of each context. Returns (cache, block_table, seq_lens,
    query_start_loc, slot_mapping, query): every context's K/V already written (vLLM writes the
    step's own tokens before attention), shuffled block ids, unused slots NaN, table entries
    past each row's blocks pointing at a block of another row."""
    blocks_per_row = [-(-ctx // block_size) for ctx, _ in rows]
    num_blocks = sum(blocks_per_row) + spare_blocks
    cache = cuda_kv_cache(num_blocks, num_kv_heads, block_size, head_size, dtype, layout, device)
    order = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    width = max(blocks_per_row) + 1
    table = torch.empty(len(rows), width, dtype=torch.int32)
    slots, used = [], 0
    for r, ((ctx, q), nb) in enumerate(zip(rows, blocks_per_row, strict=True)):
        table[r, :nb] = order[used : used + nb]
        table[r, nb:] = order[(used + nb) % num_blocks]  # stale ids past the row's own blocks
        used += nb
        pos = torch.arange(ctx)
        row_slots = table[r, pos // block_size].long() * block_size + pos % block_size
        key = torch.randn(ctx, num_kv_heads, head_size, generator=gen)
        value = torch.randn(ctx, num_kv_heads, head_size, generator=gen)
        write_kv(cache, key.to(device), value.to(device), row_slots.to(device))
        slots.append(row_slots[ctx - q :])
    seq_lens = torch.tensor([ctx for ctx, _ in rows], dtype=torch.int32)
    qsl = torch.tensor([0, *torch.tensor([q for _, q in rows]).cumsum(0).tolist()], dtype=torch.int32)
    query = (torch.randn(int(qsl[-1]), num_kv_heads * group, head_size, generator=gen) * 2).to(dtype)
    return cache, table, seq_lens, qsl, torch.cat(slots), query


def causal_attention_reference(
    query: torch.Tensor,
    cache: torch.Tensor,
    table: torch.Tensor,
    seq_lens: torch.Tensor,
    qsl: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """What vLLM's backends compute for a step, in float64 on the CPU: each request's query
    tokens (the last of its context) attend causally to its context, GQA heads sharing KV."""
    out = torch.zeros(query.shape, dtype=torch.float64)
    group = query.shape[1] // cache.shape[1]
    for r in range(len(seq_lens)):
        n, a, b = int(seq_lens[r]), int(qsl[r]), int(qsl[r + 1])
        keys, values = gather_kv(cache, table[r], n)
        keys = keys.double().cpu().repeat_interleave(group, dim=1)
        values = values.double().cpu().repeat_interleave(group, dim=1)
        q = query[a:b].double().cpu()
        logits = torch.einsum("thd,nhd->thn", q, keys) * scale
        pos = torch.arange(n - (b - a), n)  # each query token's position
        future = torch.arange(n)[None, :] > pos[:, None]  # [query tokens, context]
        logits = logits.masked_fill(future[:, None, :], float("-inf"))
        out[a:b] = torch.einsum("thn,nhd->thd", torch.softmax(logits, dim=-1), values)
    return out
