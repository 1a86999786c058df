"""vLLM's CPU attention backend with llmconsole's kernel doing the decode steps.

Imported only inside vLLM processes of engines started with the custom kernel (the plugin in
vllm_plugin.py registers this class in place of CPU_ATTN). It subclasses vLLM's own backend,
so metadata, KV-cache writes and everything the kernel does not cover stay vLLM's: a batch
that holds only decode tokens (one query token per sequence) on the "vec"/"vec16" KV layout,
bf16 or fp32, goes to torch.ops.llmconsole.paged_attention_decode; a batch mixing decode and
prefill rows is split (mixed_batch.py), the decode rows to the kernel and the prefill rows to
vLLM's op; anything else (prefill-only batches, sliding windows, ALiBi, soft-capping, sinks,
fp8 KV, other dtypes or layouts) calls vLLM's op for the whole batch. Each fallback reason is
logged once and counted, and so are split batches (see usage.py).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

import torch
from vllm import envs
from vllm.v1.attention.backend import AttentionLayer, AttentionType
from vllm.v1.attention.backends.cpu_attn import (
    CPUAttentionBackend,
    CPUAttentionBackendImpl,
    CPUAttentionMetadata,
    CPUAttentionMetadataBuilder,
)

from llmconsole.kernels.build import KernelBuildError, load_cpu_kernel
from llmconsole.kernels.checks import SUPPORTED_DTYPES
from llmconsole.kernels.cpu_isa import KERNEL_LAYOUT_ISAS, kernel_isa
from llmconsole.kernels.mixed_batch import PrefillPart, plan_prefill_part, run_mixed
from llmconsole.kernels.usage import LOADED_TAG, LOG_PREFIX, UNAVAILABLE_TAG, UsageCounter

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.kv_cache_interface import AttentionSpec

# Under vLLM's logger so the line gets vLLM's format and lands in the engine log.
log = logging.getLogger("vllm.llmconsole_kernel")
USAGE = UsageCounter(log)


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
            log.info("%s %s %s", LOG_PREFIX, LOADED_TAG, status.library_path)
        except KernelBuildError as exc:
            _kernel_error = str(exc)
            log.error("%s %s %s", LOG_PREFIX, UNAVAILABLE_TAG, exc)
    return _kernel_error is None


@dataclass
class MixedCpuAttentionMetadata(CPUAttentionMetadata):
    """vLLM's metadata plus, for a step mixing decode and prefill rows, its prefill half."""

    prefill_part: PrefillPart | None = None


class LlmconsoleCpuAttentionMetadataBuilder(CPUAttentionMetadataBuilder):
    # Asks vLLM's model runner to put one-token (decode) requests at the front of every batch,
    # so a mixed batch splits at one index (see mixed_batch.py).
    reorder_batch_threshold = 1

    def __init__(
        self, kv_cache_spec: AttentionSpec, layer_names: list[str], vllm_config: VllmConfig, device: torch.device
    ) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        # On an AMX host vLLM would lay the KV cache out for its AMX path, which the kernel does
        # not read: this engine writes (and falls back on) the "vec" layout instead, so that the
        # kernel serves its decode steps there too.
        isa = kernel_isa(self.isa)
        if isa != self.isa:
            log.info("%s KV layout %r instead of vLLM's %r, the layout the kernel reads", LOG_PREFIX, isa, self.isa)
            self.isa = isa
            self._set_isa_to_layers(layer_names)

    def build(
        self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata, fast_build: bool = False
    ) -> CPUAttentionMetadata:
        meta = super().build(common_prefix_len, common_attn_metadata, fast_build)
        if (
            meta.max_query_len == 1
            or self.is_cross_attention
            or self.is_encoder_only_attention
            or meta.dynamic_causal is not None
            or meta.causal is not True
        ):
            return meta
        part = plan_prefill_part(
            meta.query_start_loc,
            meta.seq_lens,
            meta.block_table,
            common_attn_metadata.num_reqs,
            num_heads=self.num_heads,
            # vLLM resolves ModelConfig.dtype ("auto", "half", ...) to a torch.dtype before any
            # builder exists, but its type still admits the strings.
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            dtype=self.dtype,  # type: ignore[arg-type]
            isa=self.isa,
            sliding_window=self.window_size,
            kv_cache_dtype=self.kv_cache_dtype,
            enable_kv_split=envs.VLLM_CPU_ATTN_SPLIT_KV,
        )
        if part is None:
            return meta
        return MixedCpuAttentionMetadata(
            **{f.name: getattr(meta, f.name) for f in fields(CPUAttentionMetadata)}, prefill_part=part
        )


class LlmconsoleCpuAttentionImpl(CPUAttentionBackendImpl):
    # Whatever vLLM's CPU attention impl takes: its parameters change between releases.
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Reasons that hold for this layer whatever the batch; decided once.
        self._static_fallback = self._layer_fallback_reason()
        if self._static_fallback is None:
            _kernel_ready()
        else:
            USAGE.layer_kept(self._static_fallback)

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

    def _batch_fallback_reason(
        self, layer: AttentionLayer, query: torch.Tensor, kv_cache: torch.Tensor, meta: CPUAttentionMetadata
    ) -> str | None:
        if self._static_fallback is not None:
            return self._static_fallback
        if meta.dynamic_causal is not None:
            return "dynamic causal masks"
        if meta.max_query_len != 1 and getattr(meta, "prefill_part", None) is None:
            # No leading decode rows to split off (the builder found none, or the step's
            # causal mode is one the split does not handle).
            return "prefill"
        if query.dtype not in SUPPORTED_DTYPES or kv_cache.dtype != query.dtype:
            return f"dtype {query.dtype} with KV cache {kv_cache.dtype}"
        isa = getattr(layer, "isa", None)
        if isa not in KERNEL_LAYOUT_ISAS:
            return f"KV layout of ISA {isa!r}"
        if not kv_cache.is_contiguous():
            return "a non-contiguous KV cache"
        if meta.block_table.dtype != torch.int32 or meta.seq_lens.dtype != torch.int32:
            return f"{meta.block_table.dtype} block tables / {meta.seq_lens.dtype} lengths"
        n = meta.num_actual_tokens
        if meta.max_query_len == 1 and (meta.seq_lens.shape[0] < n or meta.block_table.shape[0] < n):
            return "batches with fewer sequences than tokens"
        if not _kernel_ready():
            return "kernel unavailable (build failed)"
        return None

    def forward(
        self,
        layer: AttentionLayer,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: CPUAttentionMetadata | None,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if attn_metadata is None or output_scale is not None or output_block_scale is not None:
            return super().forward(
                layer, query, key, value, kv_cache, attn_metadata, output, output_scale, output_block_scale
            )
        n = attn_metadata.num_actual_tokens
        reason = self._batch_fallback_reason(layer, query, kv_cache, attn_metadata)
        if reason is not None:
            USAGE.fallback(reason, n)
            return super().forward(
                layer, query, key, value, kv_cache, attn_metadata, output, output_scale, output_block_scale
            )
        num_heads, head_size = self.num_heads, self.head_size
        part = getattr(attn_metadata, "prefill_part", None)
        if attn_metadata.max_query_len != 1 and part is not None:
            run_mixed(
                query.view(-1, num_heads, head_size),
                kv_cache,
                output.view(-1, num_heads, head_size),
                attn_metadata.seq_lens,
                attn_metadata.block_table,
                n,
                part,
                self.scale,
                k_scale=layer._k_scale_float,
                v_scale=layer._v_scale_float,
                kv_cache_dtype=self.kv_cache_dtype,
            )
            USAGE.split(part.num_decodes, n - part.num_decodes)
            return output
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

    @staticmethod
    def get_builder_cls() -> type[LlmconsoleCpuAttentionMetadataBuilder]:
        return LlmconsoleCpuAttentionMetadataBuilder
