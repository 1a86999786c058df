"""vLLM's CPU KV-cache layout, in plain PyTorch.

The cache is declared [num_blocks, num_kv_heads, block_size, 2 * head_size], but vLLM's CPU
backend (ISAs "vec" and "vec16", used on AVX2 hosts) fills each (block, kv_head) slab as
K transposed, [head_size, block_size], followed by V, [block_size, head_size]; this is what
`cpu_attn_reshape_and_cache` writes (checked against it in tests/test_kernel_cpu.py). The
helpers here let tests and benchmarks build caches without vLLM and read them back.
"""

from __future__ import annotations

import torch


def split_slabs(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Views (k_t, v): k_t [num_blocks, num_kv_heads, head_size, block_size] and
    v [num_blocks, num_kv_heads, block_size, head_size] over the same storage."""
    num_blocks, num_kv_heads, block_size, two_h = kv_cache.shape
    head_size = two_h // 2
    slabs = kv_cache.view(num_blocks, num_kv_heads, 2, block_size * head_size)
    k_t = slabs[:, :, 0].view(num_blocks, num_kv_heads, head_size, block_size)
    v = slabs[:, :, 1].view(num_blocks, num_kv_heads, block_size, head_size)
    return k_t, v


def vllm_cache_views(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The (key_cache, value_cache) pair vLLM's CPU ops take: the cache viewed as
    [num_blocks, num_kv_heads, 2 * block_size, head_size] and cut in two along dim 2."""
    num_blocks, num_kv_heads, block_size, two_h = kv_cache.shape
    view = kv_cache.view(num_blocks, num_kv_heads, 2 * block_size, two_h // 2)
    key_cache, value_cache = view.chunk(2, dim=2)
    return key_cache, value_cache


def write_kv(kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store key/value [num_tokens, num_kv_heads, head_size] at flat slots
    (block * block_size + offset), as vLLM's reshape-and-cache does; negative slots are skipped."""
    block_size = kv_cache.shape[2]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    blocks, offsets = slots // block_size, slots % block_size
    k_t, v = split_slabs(kv_cache)
    # Advanced indexing on (block, :, :, offset) puts the token axis first: [T, kv_heads, H].
    k_t[blocks, :, :, offsets] = key[keep].to(kv_cache.dtype)
    v[blocks, :, offsets, :] = value[keep].to(kv_cache.dtype)


def gather_kv(kv_cache: torch.Tensor, block_table_row: torch.Tensor,
              context_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's keys and values in token order: two [context_len, num_kv_heads, head_size]."""
    block_size = kv_cache.shape[2]
    num_used = -(-context_len // block_size)
    blocks = block_table_row[:num_used].long()
    k_t, v = split_slabs(kv_cache)
    keys = k_t[blocks].permute(0, 3, 1, 2).reshape(-1, *k_t.shape[1:3])[:context_len]
    values = v[blocks].permute(0, 2, 1, 3).reshape(-1, v.shape[1], v.shape[3])[:context_len]
    return keys, values


def random_paged_cache(num_seqs: int, context_lens: list[int], num_kv_heads: int,
                       head_size: int, block_size: int, dtype: torch.dtype,
                       generator: torch.Generator | None = None,
                       spare_blocks: int = 3) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A filled cache with shuffled block ids, its int32 block table and int32 context lengths.

    Unused cache slots and table entries hold NaN and out-of-range ids, so a kernel that reads
    past a context shows it in the output rather than getting lucky.
    """
    blocks_per_seq = [-(-n // block_size) for n in context_lens]
    max_blocks = max(max(blocks_per_seq, default=0), 1) + 1
    num_blocks = sum(blocks_per_seq) + spare_blocks
    cache = torch.randn(num_blocks, num_kv_heads, block_size, 2 * head_size,
                        generator=generator).to(dtype)
    order = torch.randperm(num_blocks, generator=generator).to(torch.int32)
    table = torch.full((num_seqs, max_blocks), num_blocks + 1000, dtype=torch.int32)
    k_t, v = split_slabs(cache)
    used = 0
    for s, (n, nb) in enumerate(zip(context_lens, blocks_per_seq, strict=True)):
        table[s, :nb] = order[used:used + nb]
        used += nb
        if nb and n % block_size:
            last = int(table[s, nb - 1])
            k_t[last, :, :, n % block_size:] = float("nan")
            v[last, :, n % block_size:, :] = float("nan")
    for spare in order[used:]:
        cache[int(spare)] = float("nan")
    lens = torch.tensor(context_lens, dtype=torch.int32)
    return cache, table, lens
