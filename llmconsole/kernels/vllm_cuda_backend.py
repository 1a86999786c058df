"""vLLM's CUDA attention backends with llmconsole's CUDA kernel doing the decode rows.

Imported only inside vLLM processes of CUDA engines started with the custom kernel: the plugin
(vllm_plugin.py) registers these classes in place of FLASH_ATTN and TRITON_ATTN, the backends
vLLM 0.32 picks for plain decoder models on NVIDIA GPUs up to Hopper (on SM100 it prefers
FlashInfer, which is not replaced: such an engine runs vLLM's attention, its log never says the
kernel loaded, and status shows stock). Each class subclasses the backend it replaces and keeps
its name, its KV-cache layout and writes, and its metadata (extended); forward() changes:

- a step's leading one-token requests (decode rows: the builder asks vLLM's model runner to put
  them first) run in the kernel (cuda_decode.py), on the KV cache vLLM wrote;
- the other rows of a mixed step run through the replaced backend's own forward, with metadata
  its own builder built for just those rows (counted as split calls);
- whatever the kernel does not cover (prefill-only steps, sliding windows, ALiBi, soft-capping,
  sinks, quantized KV, fp16, per-request causal masks, multimodal prefix ranges, decode context
  parallelism, a library that did not build or launch) runs the replaced backend for the whole
  call, each reason logged once and counted like the CPU backend's (usage.py).

CUDA graphs: the builder reports no CUDA-graph support, so vLLM runs attention outside its graphs
(piecewise graphs, or none with --enforce-eager): the kernel sizes its grid and workspace from
each step's longest context, which a replayed graph would freeze.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import torch
from vllm.v1.attention.backend import (
    AttentionCGSupport,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
)
from vllm.v1.attention.backends.flash_attn import (
    FlashAttentionBackend,
    FlashAttentionImpl,
    FlashAttentionMetadata,
    FlashAttentionMetadataBuilder,
)
from vllm.v1.attention.backends.triton_attn import (
    TritonAttentionBackend,
    TritonAttentionImpl,
    TritonAttentionMetadata,
    TritonAttentionMetadataBuilder,
)
from vllm.v1.attention.backends.utils import split_decodes_and_prefills

from llmconsole.kernels.cuda_decode import DecodeKernel, decode_rows, layout_refusal, load_kernel
from llmconsole.kernels.cuda_lib import CudaKernelError
from llmconsole.kernels.usage import LOADED_TAG, LOG_PREFIX, UNAVAILABLE_TAG, UsageCounter

# Under vLLM's logger so the lines get vLLM's format and land in the engine log.
log = logging.getLogger("vllm.llmconsole_kernel")
USAGE = UsageCounter(log)

# KV-cache dtypes the kernel reads as they are ("auto": the model's dtype).
_PLAIN_KV_DTYPES = ("auto", "bfloat16", "float16", "float32", "float", "half")

_kernel: DecodeKernel | None = None
_kernel_error: str | None = None
_kernel_checked = False


def kernel() -> DecodeKernel | None:
    """The kernel's decode call, built and loaded once per process for its GPU; None (and the
    reason logged once, in the words status shows) when it cannot be."""
    global _kernel, _kernel_checked, _kernel_error
    if not _kernel_checked:
        _kernel_checked = True
        try:
            _kernel, path = load_kernel(torch.device("cuda", torch.cuda.current_device()))
            log.info("%s %s %s", LOG_PREFIX, LOADED_TAG, path)
        except Exception as exc:  # nvcc missing or failing, no loadable library: vLLM's attention runs
            _kernel_error = f"{type(exc).__name__}: {exc}"
            log.error("%s %s %s", LOG_PREFIX, UNAVAILABLE_TAG, _kernel_error)
    return _kernel


def _disable(reason: str) -> None:
    """The kernel failed at run time: every later call of this process runs vLLM's attention."""
    global _kernel, _kernel_error
    _kernel, _kernel_error = None, reason
    log.error("%s %s %s", LOG_PREFIX, UNAVAILABLE_TAG, reason)


# --- a step's rows: the kernel's and the replaced backend's -------------------------------------


@dataclass(frozen=True)
class DecodeSplit:
    """How one step's rows divide. decode_rows: the leading one-token requests, the kernel's;
    rest: the replaced backend's metadata for the other requests (None: there are none);
    refused: why no row of this step may go to the kernel (the whole step is the backend's)."""

    decode_rows: int = 0
    rest: Any = None
    refused: str | None = None


def _split_refusal(common: CommonAttentionMetadata) -> str | None:
    if isinstance(common.causal, torch.Tensor):
        return "per-request causal masks"
    if common.causal is not True:
        return "non-causal attention"
    if common.mm_req_doc_ranges is not None:
        return "multimodal prefix ranges"
    if common.rswa_prefix_lens is not None:
        return "reference sliding-window attention"
    if common.dcp_local_seq_lens is not None:
        return "decode context parallelism"
    if common.encoder_seq_lens is not None:
        return "cross-attention"
    return None


def rest_of_batch(common: CommonAttentionMetadata, num_decodes: int, num_decode_tokens: int) -> CommonAttentionMetadata:
    """The step's metadata for requests [num_decodes, num_reqs) alone: what the replaced backend's
    builder gets to build the other rows' metadata, as if they were a batch of their own."""
    reqs, toks = slice(num_decodes, common.num_reqs), slice(num_decode_tokens, common.num_actual_tokens)
    starts = slice(num_decodes, common.num_reqs + 1)

    def cut(t: Any, part: slice) -> Any:
        return None if t is None else t[part]

    return common.replace(
        query_start_loc=common.query_start_loc[starts] - num_decode_tokens,
        query_start_loc_cpu=common.query_start_loc_cpu[starts] - num_decode_tokens,
        seq_lens=common.seq_lens[reqs],
        num_reqs=common.num_reqs - num_decodes,
        num_actual_tokens=common.num_actual_tokens - num_decode_tokens,
        block_table_tensor=common.block_table_tensor[reqs],
        slot_mapping=common.slot_mapping[toks],
        seq_lens_cpu_upper_bound=cut(common.seq_lens_cpu_upper_bound, reqs),
        positions=cut(common.positions, toks),
        is_prefilling=cut(common.is_prefilling, reqs),
        req_idx=cut(common.req_idx, reqs),
        _num_computed_tokens_cache=None,
        _token_to_req_indices_cache=None,
    )


def plan_split(common: CommonAttentionMetadata, build_rest: Callable[[CommonAttentionMetadata], Any]) -> DecodeSplit:
    """Divide a step (vLLM's own decode/prefill boundary of a reordered batch); build_rest makes
    the replaced backend's metadata for the rows after the decode rows."""
    refused = _split_refusal(common)
    if refused is not None:
        return DecodeSplit(refused=refused)
    num_decodes, _, num_decode_tokens, _ = split_decodes_and_prefills(common, decode_threshold=1)
    if num_decodes == 0:
        return DecodeSplit(refused="prefill")
    if num_decodes == common.num_reqs:
        return DecodeSplit(decode_rows=num_decodes)
    return DecodeSplit(decode_rows=num_decodes, rest=build_rest(rest_of_batch(common, num_decodes, num_decode_tokens)))


class DecodeSplitBuilder(AttentionMetadataBuilder[Any]):
    """The metadata builder of a replaced backend, plus each step's DecodeSplit (in the
    metadata's `decode_split`). Mixed in before the replaced builder."""

    # No CUDA graphs for attention (see the module's docstring); decodes first in every batch.
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.NEVER
    reorder_batch_threshold: int | None = 1
    # The split holds the step's own block tables: metadata is rebuilt, never patched in place.
    supports_update_block_table: bool = False
    split_metadata_cls: ClassVar[type[Any]]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.supports_draft_decode_metadata_update = False

    def build(
        self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata, fast_build: bool = False
    ) -> Any:
        # super() is the replaced backend's builder: this class is only ever mixed in before one.
        meta = super().build(common_prefix_len, common_attn_metadata, fast_build)  # type: ignore[safe-super]
        split = plan_split(
            common_attn_metadata,
            lambda rest: super(DecodeSplitBuilder, self).build(  # type: ignore[safe-super]
                common_prefix_len, rest, fast_build
            ),
        )
        return self.split_metadata_cls(**{f.name: getattr(meta, f.name) for f in fields(meta)}, decode_split=split)


class DecodeRowsImpl(AttentionImpl[Any]):
    """forward() of a replaced backend's impl with the decode rows in llmconsole's kernel.
    Mixed in before the replaced impl."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # super() is the replaced backend's impl: this class is only ever mixed in before one.
        super().__init__(*args, **kwargs)  # type: ignore[safe-super]
        # Reasons that hold for this layer whatever the batch; decided once.
        self._static_fallback = self._layer_fallback_reason()
        if self._static_fallback is None:
            kernel()
        else:
            USAGE.layer_kept(self._static_fallback)

    def _layer_fallback_reason(self) -> str | None:
        attn_type = getattr(self, "attn_type", AttentionType.DECODER)
        if attn_type != AttentionType.DECODER:
            return f"{attn_type} attention"
        if getattr(self, "alibi_slopes", None) is not None:
            return "ALiBi"
        if tuple(getattr(self, "sliding_window", (-1, -1))) != (-1, -1):
            return "sliding-window attention"
        if getattr(self, "chunk_lookback", -1) != -1:
            return "chunked local attention"
        if getattr(self, "logits_soft_cap", 0):
            return "logit soft-capping"
        if getattr(self, "sinks", None) is not None:
            return "attention sinks"
        if self.kv_cache_dtype not in _PLAIN_KV_DTYPES:
            return f"{self.kv_cache_dtype} KV cache"
        if self.dcp_world_size > 1:
            return "decode context parallelism"
        if self.head_size % 16 or self.head_size > 512:
            return f"head size {self.head_size}"
        return None

    def forward(
        self,
        layer: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: Any,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        split: DecodeSplit | None = getattr(attn_metadata, "decode_split", None)
        if split is None or output_scale is not None or output_block_scale is not None:
            # The profiling run (no metadata), or fused output quantization: the backend's own.
            return super().forward(  # type: ignore[safe-super]
                layer,
                query,
                key,
                value,
                kv_cache,
                attn_metadata,
                output,
                output_scale,
                output_block_scale,
            )
        n = attn_metadata.num_actual_tokens
        nd = split.decode_rows
        reason = (
            self._static_fallback
            or split.refused
            or layout_refusal(query, kv_cache, attn_metadata.block_table, attn_metadata.seq_lens)
        )
        call = kernel() if reason is None else None
        if call is None:
            USAGE.fallback(reason or "kernel unavailable", n)
            return super().forward(layer, query, key, value, kv_cache, attn_metadata, output)  # type: ignore[safe-super]
        try:
            fp8 = kv_cache.dtype != query.dtype  # an fp8 cache: the layer's per-tensor scales apply
            decode_rows(
                call,
                query[:nd],
                kv_cache,
                attn_metadata.block_table[:nd],
                attn_metadata.seq_lens[:nd],
                self.scale,
                output[:nd],
                attn_metadata.max_seq_len,
                k_scale=getattr(layer, "_k_scale", None) if fp8 else None,
                v_scale=getattr(layer, "_v_scale", None) if fp8 else None,
            )
        except (CudaKernelError, ValueError, TypeError) as exc:  # the launch's or the contract's own words
            _disable(f"{type(exc).__name__}: {exc}")
            USAGE.fallback("kernel launch failed", n)
            return super().forward(layer, query, key, value, kv_cache, attn_metadata, output)  # type: ignore[safe-super]
        if split.rest is None:
            if n > nd:
                output[nd:n].zero_()  # padding rows: nothing reads them, but never leave garbage
            USAGE.decode(nd)
            return output
        super().forward(layer, query[nd:], key[nd:], value[nd:], kv_cache, split.rest, output[nd:])  # type: ignore[safe-super]
        USAGE.split(nd, n - nd)
        return output


# --- FlashAttention ------------------------------------------------------------------------------


@dataclass
class LlmconsoleFlashAttentionMetadata(FlashAttentionMetadata):
    decode_split: DecodeSplit | None = None


class LlmconsoleFlashAttentionMetadataBuilder(DecodeSplitBuilder, FlashAttentionMetadataBuilder):
    split_metadata_cls = LlmconsoleFlashAttentionMetadata


class LlmconsoleFlashAttentionImpl(DecodeRowsImpl, FlashAttentionImpl):
    pass


class LlmconsoleFlashAttentionBackend(FlashAttentionBackend):
    """FLASH_ATTN with llmconsole's decode kernel; the name stays FLASH_ATTN so vLLM's checks
    that look for it still match."""

    @staticmethod
    def get_impl_cls() -> type[LlmconsoleFlashAttentionImpl]:
        return LlmconsoleFlashAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[LlmconsoleFlashAttentionMetadataBuilder]:
        return LlmconsoleFlashAttentionMetadataBuilder


# --- Triton --------------------------------------------------------------------------------------


@dataclass
class LlmconsoleTritonAttentionMetadata(TritonAttentionMetadata):
    decode_split: DecodeSplit | None = None


class LlmconsoleTritonAttentionMetadataBuilder(DecodeSplitBuilder, TritonAttentionMetadataBuilder):
    split_metadata_cls = LlmconsoleTritonAttentionMetadata


class LlmconsoleTritonAttentionImpl(DecodeRowsImpl, TritonAttentionImpl):
    pass


class LlmconsoleTritonAttentionBackend(TritonAttentionBackend):
    """TRITON_ATTN with llmconsole's decode kernel; the name stays TRITON_ATTN."""

    @staticmethod
    def get_impl_cls() -> type[LlmconsoleTritonAttentionImpl]:
        return LlmconsoleTritonAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[LlmconsoleTritonAttentionMetadataBuilder]:
        return LlmconsoleTritonAttentionMetadataBuilder
