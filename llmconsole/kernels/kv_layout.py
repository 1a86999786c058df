"""vLLM's CPU KV-cache layout, in plain PyTorch.

The cache is declared [num_blocks, num_kv_heads, block_size, 2 * head_size], but vLLM's CPU
backend (ISAs "vec" and "vec16", used on AVX2 hosts) fills each (block, kv_head) slab as
K transposed, [head_size, block_size], followed by V, [block_size, head_size]; this is what
`cpu_attn_reshape_and_cache` writes (checked against it in tests/unit/test_kernel_cpu.py). The
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


def write_kv(kv_cache: torch.Tensor, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor) -> None:
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


def gather_kv(
    kv_cache: torch.Tensor, block_table_row: torch.Tensor, context_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's keys and values in token order: two [context_len, num_kv_heads, head_size]."""
    block_size = kv_cache.shape[2]
    num_used = -(-context_len // block_size)
    blocks = block_table_row[:num_used].long()
    k_t, v = split_slabs(kv_cache)
    keys = k_t[blocks].permute(0, 3, 1, 2).reshape(-1, *k_t.shape[1:3])[:context_len]
    values = v[blocks].permute(0, 2, 1, 3).reshape(-1, v.shape[1], v.shape[3])[:context_len]
    return keys, values


def random_paged_cache(
    num_seqs: int,
    context_lens: list[int],
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    dtype: torch.dtype,
    generator: torch.Generator | None = None,
    spare_blocks: int = 3,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A filled cache with shuffled block ids, its int32 block table and int32 context lengths.

    Unused cache slots and table entries hold NaN and out-of-range ids, so a kernel that reads
    past a context shows it in the output rather than getting lucky.
    """
    blocks_per_seq = [-(-n // block_size) for n in context_lens]
    max_blocks = max(max(blocks_per_seq, default=0), 1) + 1
    num_blocks = sum(blocks_per_seq) + spare_blocks
    cache = torch.randn(num_blocks, num_kv_heads, block_size, 2 * head_size, generator=generator).to(dtype)
    order = torch.randperm(num_blocks, generator=generator).to(torch.int32)
    table = torch.full((num_seqs, max_blocks), num_blocks + 1000, dtype=torch.int32)
    k_t, v = split_slabs(cache)
    used = 0
    for s, (n, nb) in enumerate(zip(context_lens, blocks_per_seq, strict=True)):
        table[s, :nb] = order[used : used + nb]
        used += nb
        if nb and n % block_size:
            last = int(table[s, nb - 1])
            k_t[last, :, :, n % block_size :] = float("nan")
            v[last, :, n % block_size :, :] = float("nan")
    for spare in order[used:]:
        cache[int(spare)] = float("nan")
    lens = torch.tensor(context_lens, dtype=torch.int32)
    return cache, table, lens


# ---- vLLM's CUDA layout ---------------------------------------------------------------------
#
# vLLM's CUDA attention backends (FlashAttention, Triton) get one tensor per layer, logically
# [num_blocks, num_kv_heads, block_size, 2 * head_size] with K then V along the last axis, and
# view it as key_cache, value_cache = kv_cache.transpose(1, 2).split(head_size, dim=-1), each
# [num_blocks, block_size, num_kv_heads, head_size]. The physical order of the axes of the
# whole cache, [layers, blocks, heads, tokens, content] logically, is resolved at run time
# (vllm.v1.kv_cache_layout.KVCacheLayout; LBNHC, FlashInfer's "NHD", by default), so the
# per-layer views have strides rather than one shape: the CUDA kernel takes them as given.

CUDA_LAYOUTS = ("LBNHC", "LBHNC", "BLNHC", "BLHNC", "LHBNC", "BHLNC")
_LOGICAL_AXES = "LBHNC"


def cuda_kv_cache(
    num_blocks: int,
    num_kv_heads: int,
    block_size: int,
    head_size: int,
    dtype: torch.dtype,
    layout: str = "LBNHC",
    num_layers: int = 1,
    layer: int = 0,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """One layer's cache as vLLM's CUDA backends receive it: a [num_blocks, num_kv_heads,
    block_size, 2 * head_size] view, physically ordered by `layout` (a KVCacheLayout name) inside
    a buffer holding `num_layers` layers. The buffer starts as NaN, other layers included."""
    if sorted(layout) != sorted(_LOGICAL_AXES) or layout not in CUDA_LAYOUTS:
        raise ValueError(f"layout must be one of {CUDA_LAYOUTS}, got {layout!r}")
    sizes = {"L": num_layers, "B": num_blocks, "H": num_kv_heads, "N": block_size, "C": 2 * head_size}
    raw = torch.empty([sizes[axis] for axis in layout], dtype=dtype, device=device)
    raw.fill_(float("nan"))
    return raw.permute([layout.index(axis) for axis in _LOGICAL_AXES])[layer]


def split_cuda_kv_cache(kv_cache: torch.Tensor, head_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(key_cache, value_cache), each [num_blocks, block_size, num_kv_heads, head_size]: the
    views vLLM's FlashAttention and Triton backends pass to their kernels (and to this one's)."""
    by_token = kv_cache.transpose(1, 2)
    return by_token[..., :head_size], by_token[..., head_size:]


def gather_cuda_kv(
    key_cache: torch.Tensor, value_cache: torch.Tensor, block_table_row: torch.Tensor, context_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """One sequence's keys and values in token order: two [context_len, num_kv_heads, head_size]."""
    _, block_size, num_kv_heads, head_size = key_cache.shape
    blocks = block_table_row[: -(-context_len // block_size)].long().to(key_cache.device)
    keys = key_cache[blocks].reshape(-1, num_kv_heads, head_size)[:context_len]
    values = value_cache[blocks].reshape(-1, num_kv_heads, head_size)[:context_len]
    return keys, values


def random_cuda_paged_cache(
    context_lens: list[int],
    num_kv_heads: int,
    head_size: int,
    block_size: int,
    dtype: torch.dtype,
    layout: str = "LBNHC",
    generator: torch.Generator | None = None,
    spare_blocks: int = 3,
    num_layers: int = 2,
    layer: int = 1,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A filled CUDA-layout cache (see cuda_kv_cache), its int32 block table and int32 context
    lengths, on the CPU. Block ids are shuffled; the slots past each context in its last block,
    the spare blocks, the other layers of the buffer and the table entries past each sequence's
    blocks hold NaN or out-of-range ids, so a kernel that reads anything outside a context shows
    it in the output. An fp8 dtype gets values rounded from N(0, 1)."""
    blocks_per_seq = [-(-n // block_size) for n in context_lens]
    max_blocks = max(max(blocks_per_seq, default=0), 1) + 1
    num_blocks = sum(blocks_per_seq) + spare_blocks
    kv_cache = cuda_kv_cache(num_blocks, num_kv_heads, block_size, head_size, dtype, layout, num_layers, layer)
    kv_cache.copy_(torch.randn(kv_cache.shape, generator=generator).to(dtype))
    order = torch.randperm(num_blocks, generator=generator).to(torch.int32)
    table = torch.full((len(context_lens), max_blocks), num_blocks + 1000, dtype=torch.int32)
    used = 0
    for s, (n, nb) in enumerate(zip(context_lens, blocks_per_seq, strict=True)):
        table[s, :nb] = order[used : used + nb]
        used += nb
        if nb and n % block_size:
            kv_cache[int(table[s, nb - 1]), :, n % block_size :, :] = float("nan")
    for spare in order[used:]:
        kv_cache[int(spare)] = float("nan")
    lens = torch.tensor(context_lens, dtype=torch.int32)
    return kv_cache, table, lens


def move_keeping_layout(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """`t` on `device` with the same strides and storage offset, its whole storage copied (a
    plain .to() would compact a strided view, losing the layout under test)."""
    elems = t.untyped_storage().nbytes() // t.element_size()
    flat = torch.as_strided(t, (elems,), (1,), 0).to(device)
    return torch.as_strided(flat, t.shape, t.stride(), t.storage_offset())
