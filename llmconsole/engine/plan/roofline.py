"""A roofline step-time model: what a config should do, as an estimate, before it runs.

A step moves the weights (and, in decode, every running request's KV) through memory once and
does 2 FLOPs per active parameter per token (plus attention's score and value products). Its
time is the larger of bytes over bandwidth and FLOPs over peak, each derated by an efficiency,
plus tensor-parallel all-reduces over the interconnect.

The efficiencies are fitted to Vidur's measured profile of Llama-2-7B's non-attention layers
on an A100-80GB (Agrawal et al., "Vidur: A Large-Scale Simulation Framework for LLM
Inference", MLSys 2024): about 9.3 ms per step for up to 64 tokens (memory bound) and about
33 ms at 512 tokens (compute bound). `REFERENCE_POINTS` holds them; `fit_efficiencies()`
derives the constants from them. No published measured figures are known to us for the other
devices, so their estimates reuse the A100's efficiencies: treat them as rough.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from llmconsole.engine.plan.devices import DeviceProfile
from llmconsole.engine.plan.model_shape import ModelShape, shape_from_config

# Llama-2-7B's config (meta-llama/Llama-2-7b-hf), so the check needs no download.
LLAMA2_7B_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 32,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
    "torch_dtype": "float16",
}

# (tokens in the step, measured ms for all 32 layers' non-attention operators), A100-80GB, fp16.
REFERENCE_DEVICE = "A100-80GB"
REFERENCE_POINTS = ((64, 9.3), (512, 33.0))

# Per-collective launch and synchronisation cost of an all-reduce (NCCL, within a node).
_ALLREDUCE_LATENCY_S = 10e-6


@dataclass(frozen=True)
class Efficiency:
    memory: float  # achieved / peak bandwidth
    compute: float  # achieved / peak FLOP/s


def _linear_params(shape: ModelShape) -> int:
    """Parameters of the decoder layers' matrices (what Vidur's non-attention profile times)."""
    return shape.num_layers * (
        shape.attention_params_per_layer + shape.num_experts_per_token * shape.mlp_params_per_expert
    )


def fit_efficiencies(device: DeviceProfile, shape: ModelShape | None = None) -> Efficiency:
    """Solve the two efficiencies from the two reference points (memory- and compute-bound)."""
    shape = shape or shape_from_config(LLAMA2_7B_CONFIG)
    params = _linear_params(shape)
    (small_tokens, small_ms), (large_tokens, large_ms) = REFERENCE_POINTS
    memory_s = params * 2 / device.memory_bandwidth_bytes_s
    compute_s = 2 * params * large_tokens / device.fp16_flop_s
    return Efficiency(memory=memory_s / (small_ms / 1e3), compute=compute_s / (large_ms / 1e3))


# Fitted with fit_efficiencies(gpu_profile("A100-80GB")); a test keeps the two in step.
FITTED = Efficiency(memory=0.683, compute=0.644)


def non_attention_step_s(
    device: DeviceProfile, shape: ModelShape, num_tokens: int, eff: Efficiency = FITTED, dtype_bytes: int = 2
) -> float:
    """Vidur's quantity: the decoder layers' matrix work for one step of `num_tokens` tokens."""
    params = _linear_params(shape)
    memory_s = params * dtype_bytes / (device.memory_bandwidth_bytes_s * eff.memory)
    compute_s = 2 * params * num_tokens / (device.fp16_flop_s * eff.compute)
    return max(memory_s, compute_s)


@dataclass(frozen=True)
class StepModel:
    device: DeviceProfile
    shape: ModelShape
    tensor_parallel_size: int = 1
    dtype_bytes: int = 2
    kv_bytes_per_token: int = 0  # per rank
    dtype_name: str = "float16"
    eff: Efficiency = FITTED
    # Fixed cost of a step outside the matrices (scheduling, sampling, Python), and its growth per
    # running sequence. Zero for GPUs (no measured figure; CUDA graphs keep it small); for the
    # CPU host see devices.CPU_STEP_OVERHEAD_S. Dominant for small models.
    step_overhead_s: float = 0.0
    seq_overhead_s: float = 0.0

    @property
    def _weights_read_bytes(self) -> float:
        # The input embedding is a lookup, not a stream: only the matrices are read each step.
        read_params = self.shape.param_count - self.shape.vocab_size * self.shape.hidden_size
        return read_params * self.dtype_bytes / self.tensor_parallel_size

    def _allreduce_s(self, num_tokens: int) -> float:
        tp = self.tensor_parallel_size
        if tp == 1 or not self.device.interconnect_bytes_s:
            return 0.0
        size = num_tokens * self.shape.hidden_size * self.dtype_bytes
        per_reduce = 2 * (tp - 1) / tp * size / self.device.interconnect_bytes_s + _ALLREDUCE_LATENCY_S
        return 2 * self.shape.num_layers * per_reduce  # after attention and after the MLP

    def _time_s(self, bytes_moved: float, flops: float, num_tokens: int, num_seqs: int = 1) -> float:
        peak = self.device.peak_flop_s(self.dtype_name)
        memory_s = bytes_moved / (self.device.memory_bandwidth_bytes_s * self.eff.memory)
        compute_s = flops / (peak * self.eff.compute)
        overhead_s = self.step_overhead_s + self.seq_overhead_s * num_seqs
        return max(memory_s, compute_s) + self._allreduce_s(num_tokens) + overhead_s

    def _attn_flops_per_token(self, context_tokens: float) -> float:
        # Scores (QK^T) and the weighted sum of values: 2 FLOPs per multiply-add each.
        s = self.shape
        return 4 * s.num_layers * s.num_attention_heads * s.head_dim * context_tokens / self.tensor_parallel_size

    def prefill_s(self, prompt_tokens: int) -> float:
        """One request's prompt in one step (causal attention: on average half the prompt)."""
        flops = (
            2 * self.shape.active_params_per_token / self.tensor_parallel_size * prompt_tokens
            + self._attn_flops_per_token(prompt_tokens / 2) * prompt_tokens
        )
        bytes_moved = self._weights_read_bytes + prompt_tokens * self.kv_bytes_per_token
        return self._time_s(bytes_moved, flops, prompt_tokens)

    def decode_step_s(self, batch: int, context_tokens: float) -> float:
        """One decode step for `batch` requests, each attending to `context_tokens` of KV."""
        flops = batch * (
            2 * self.shape.active_params_per_token / self.tensor_parallel_size
            + self._attn_flops_per_token(context_tokens)
        )
        bytes_moved = self._weights_read_bytes + batch * context_tokens * self.kv_bytes_per_token
        return self._time_s(bytes_moved, flops, batch, batch)


@dataclass(frozen=True)
class OperatingPoint:
    """The estimate at one batch size (requests decoding together)."""

    batch: int
    ttft_s: float
    itl_s: float  # time between output tokens, prefill stalls amortised in
    e2e_s: float
    output_tok_s: float
    requests_s: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def operating_point(model: StepModel, batch: int, prompt_tokens: int, output_tokens: int) -> OperatingPoint:
    """Continuous batching in steady state: `batch` requests decode together; each finished one
    is replaced by a new prompt whose prefill stalls the batch for one prefill step."""
    prefill = model.prefill_s(prompt_tokens)
    step = model.decode_step_s(batch, prompt_tokens + output_tokens / 2)
    cycle = output_tokens * step + batch * prefill  # time for `batch` requests to pass through
    itl = cycle / output_tokens
    return OperatingPoint(
        batch=batch,
        ttft_s=prefill,
        itl_s=itl,
        e2e_s=prefill + output_tokens * itl,
        output_tok_s=batch * output_tokens / cycle,
        requests_s=batch / cycle,
    )


def curve(
    model: StepModel, prompt_tokens: int, output_tokens: int, batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
) -> list[OperatingPoint]:
    return [operating_point(model, b, prompt_tokens, output_tokens) for b in batches]
