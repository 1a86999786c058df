"""The decode computation written the slow, obvious way, in float64: what the kernels must match.

Each sequence's keys and values are gathered through its block table, each query head attends
with the kv head its group shares (grouped-query attention), and the softmax covers exactly
the context's tokens, so stale or poisoned slots past the end cannot leak in.
"""

from __future__ import annotations

import torch

from llmconsole.kernels.kv_layout import gather_cuda_kv, gather_kv


def paged_attention_decode_reference(
    query: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float
) -> torch.Tensor:
    """query [num_seqs, num_heads, head_size] -> float64 [num_seqs, num_heads, head_size]."""
    num_seqs, num_heads, head_size = query.shape
    num_kv_heads = kv_cache.shape[1]
    group = num_heads // num_kv_heads
    out = torch.zeros(num_seqs, num_heads, head_size, dtype=torch.float64)
    for s in range(num_seqs):
        n = int(context_lens[s])
        if n == 0:
            continue
        keys, values = gather_kv(kv_cache, block_tables[s], n)
        keys = keys.double().repeat_interleave(group, dim=1)  # [n, num_heads, H]
        values = values.double().repeat_interleave(group, dim=1)
        q = query[s].double()  # [num_heads, H]
        logits = torch.einsum("hd,nhd->hn", q, keys) * scale
        probs = torch.softmax(logits, dim=-1)
        out[s] = torch.einsum("hn,nhd->hd", probs, values)
    return out


def cuda_layout_decode_reference(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """The same computation on vLLM's CUDA layout (kv_layout.split_cuda_kv_cache views), on the
    query's device: float64 [num_seqs, num_heads, head_size]. k_scale/v_scale multiply the
    cached values (an fp8 cache's per-tensor scales)."""
    num_seqs, num_heads, head_size = query.shape
    num_kv_heads = key_cache.shape[2]
    group = num_heads // num_kv_heads
    out = torch.zeros(num_seqs, num_heads, head_size, dtype=torch.float64, device=query.device)
    for s in range(num_seqs):
        n = int(seq_lens[s])
        if n == 0:
            continue
        keys, values = gather_cuda_kv(key_cache, value_cache, block_tables[s], n)
        keys = (keys.double() * k_scale).repeat_interleave(group, dim=1).to(query.device)
        values = (values.double() * v_scale).repeat_interleave(group, dim=1).to(query.device)
        q = query[s].double()
        logits = torch.einsum("hd,nhd->hn", q, keys) * scale
        probs = torch.softmax(logits, dim=-1)
        out[s] = torch.einsum("hn,nhd->hd", probs, values)
    return out


# |out - ref| <= rtol * |ref| + atol * max|ref| over the row: one ulp of the output type (whose
# rounding may fall either side of a result computed to ~1e-5 of the row's scale) and a margin
# for the kernel's own arithmetic. The CUDA kernel's P goes through its MMAs as a hi + lo pair, so
# it is held to this bound, not to one set by 16-bit weights.
CUDA_TOLERANCE = {torch.bfloat16: (2.0**-7, 5e-4), torch.float16: (2.0**-10, 2e-4)}


def compare_to_reference(out: torch.Tensor, ref: torch.Tensor) -> dict[str, object]:
    """Every element of `out` (the kernel's, in its own dtype) against the float64 reference:
    {"ok", "finite", "bad" (elements out of tolerance), "worst_err_of_row_max", "first_bad"
    ([seq, head, dim] or None)}."""
    rtol, atol = CUDA_TOLERANCE[out.dtype]
    got = out.double().to(ref.device)
    finite = bool(torch.isfinite(got).all())
    row_max = ref.abs().amax(dim=-1, keepdim=True)
    err = (got - ref).abs()
    bad = ~(err <= rtol * ref.abs() + atol * row_max)  # NaN counts as bad
    first = bad.nonzero()[0].tolist() if bool(bad.any()) else None
    worst = float((err / row_max.clamp_min(1e-30)).nan_to_num(float("inf")).max()) if err.numel() else 0.0
    return {
        "ok": finite and not bool(bad.any()),
        "finite": finite,
        "bad": int(bad.sum()),
        "worst_err_of_row_max": worst,
        "first_bad": first,
    }
