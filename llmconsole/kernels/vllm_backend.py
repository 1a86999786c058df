"""vLLM's CPU attention backend with llmconsole's kernel doing the decode steps.

Imported only inside vLLM processes of engines started with the custom kernel (the plugin in
vllm_plugin.py registers this class in place of CPU_ATTN). It subclasses vLLM's own backend,
so metadata, KV-cache writes and everything the kernel does not cover stay vLLM's: a batch
that holds only decode tokens (one query token per sequence) on the "vec"/"vec16" KV layout,
bf16 or fp32, goes to torch.ops.llmconsole.paged_attention_decode; anything else (prefill,
mixed batches, sliding windows, ALiBi, soft-capping, sinks, fp8 KV, other dtypes or layouts)
calls vLLM's op. Each fallback reason is logged once and counted (see usage.py).
"""

from __future__ import annotations

import logging

import torch
from vllm.v1.attention.backend import AttentionType
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend, CPUAttentionBackendImpl

from llmconsole.kernels.build import KernelBuildError, load_cpu_kernel
from llmconsole.kernels.checks import SUPPORTED_DTYPES
from llmconsole.kernels.usage import LOG_PREFIX, UsageCounter

# Under vLLM's logger so the line gets vLLM's format and lands in the engine log.
log = logging.getLogger("vllm.llmconsole_kernel")
USAGE = UsageCounter(log)

# vLLM's CPU ISAs that store K transposed then V in each (block, kv head) slab, the layout
# the kernel reads. AMX, NEON and the others lay blocks out differently.
_LAYOUT_ISAS = ("vec", "vec16")

_kernel_error: str | None = None
_kernel_checked = False


def _kernel_ready() -> bool:
    """Build/load the kernel once per process; a failure is logged once and makes every call
    fall back rather than failing the engine."""
    global _kernel_checked, _kernel_error
    if not _kernel_checked:
        _kernel_checked = True
        try:
            status = load_cpu_kernel()
            log.info("%s custom decode kernel loaded from %s", LOG_PREFIX, status.library_path)
        except KernelBuildError as exc:
            _kernel_error = str(exc)
            log.error("%s custom decode kernel unavailable, vLLM's attention runs instead: %s",
                      LOG_PREFIX, exc)
    return _kernel_error is None


class LlmconsoleCpuAttentionImpl(CPUAttentionBackendImpl):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # Reasons that hold for this layer whatever the batch; decided once.
        self._static_fallback = self._layer_fallback_reason()
        if self._static_fallback is None:
            _kernel_ready()

    def _layer_fallback_reason(self) -> str | None:
        if self.attn_type != AttentionType.DECODER:
            return f"{self.attn_type} attention"
        if self.alibi_slopes is not None:
            return "ALiBi"
        if self.sliding_window != -1:
            return "sliding-window attention"
        if self.logits_soft_cap:
            return "logit soft-capping"
        if self.sinks is not None:
            return "attention sinks"
        if self.is_fp8_kv_cache:
            return "fp8 KV cache"
        if self.head_size % 16:
            return f"head size {self.head_size}"
        return None

    def _batch_fallback_reason(self, layer, query: torch.Tensor, kv_cache: torch.Tensor,
                               meta) -> str | None:
        if self._static_fallback is not None:
            return self._static_fallback
        if meta.max_query_len != 1:
            return "prefill"  # or a batch mixing prefill and decode
        if meta.dynamic_causal is not None:
            return "dynamic causal masks"
        if query.dtype not in SUPPORTED_DTYPES or kv_cache.dtype != query.dtype:
            return f"dtype {query.dtype} with KV cache {kv_cache.dtype}"
        isa = getattr(layer, "isa", None)
        if isa not in _LAYOUT_ISAS:
            return f"KV layout of ISA {isa!r}"
        if not kv_cache.is_contiguous():
            return "a non-contiguous KV cache"
        if meta.block_table.dtype != torch.int32 or meta.seq_lens.dtype != torch.int32:
            return f"{meta.block_table.dtype} block tables / {meta.seq_lens.dtype} lengths"
        n = meta.num_actual_tokens
        if meta.seq_lens.shape[0] < n or meta.block_table.shape[0] < n:
            return "batches with fewer sequences than tokens"
        if not _kernel_ready():
            return "kernel unavailable (build failed)"
        return None

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output,
                output_scale=None, output_block_scale=None):
        if attn_metadata is None or output_scale is not None or output_block_scale is not None:
            return super().forward(layer, query, key, value, kv_cache, attn_metadata, output,
                                   output_scale, output_block_scale)
        reason = self._batch_fallback_reason(layer, query, kv_cache, attn_metadata)
        if reason is not None:
            USAGE.fallback(reason)
            return super().forward(layer, query, key, value, kv_cache, attn_metadata, output,
                                   output_scale, output_block_scale)
        n = attn_metadata.num_actual_tokens
        num_heads, head_size = self.num_heads, self.head_size
        torch.ops.llmconsole.paged_attention_decode(
            output[:n].view(n, num_heads, head_size),
            query[:n].view(n, num_heads, head_size),
            kv_cache,
            attn_metadata.block_table[:n],
            attn_metadata.seq_lens[:n],
            self.scale,
            0,
        )
        USAGE.decode(n)
        return output


class LlmconsoleCpuAttentionBackend(CPUAttentionBackend):
    """CPU_ATTN with llmconsole's decode kernel; the name stays CPU_ATTN so vLLM's checks
    that look for the CPU backend still match."""

    @staticmethod
    def get_impl_cls() -> type[LlmconsoleCpuAttentionImpl]:
        return LlmconsoleCpuAttentionImpl
