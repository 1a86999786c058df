"""The decode computation written the slow, obvious way, in float64: what the kernels must match.

Each sequence's keys and values are gathered through its block table, each query head attends
with the kv head its group shares (grouped-query attention), and the softmax covers exactly
the context's tokens, so stale or poisoned slots past the end cannot leak in.
"""

from __future__ import annotations

import torch

from llmconsole.kernels.kv_layout import gather_kv


def paged_attention_decode_reference(query: torch.Tensor, kv_cache: torch.Tensor,
                                     block_tables: torch.Tensor, context_lens: torch.Tensor,
                                     scale: float) -> torch.Tensor:
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
        keys = keys.double().repeat_interleave(group, dim=1)      # [n, num_heads, H]
        values = values.double().repeat_interleave(group, dim=1)
        q = query[s].double()                                     # [num_heads, H]
        logits = torch.einsum("hd,nhd->hn", q, keys) * scale
        probs = torch.softmax(logits, dim=-1)
        out[s] = torch.einsum("hn,nhd->hd", probs, values)
    return out
