"""Recommended settings for a workload, and the anti-patterns worth a warning, each with its rule.

Every recommendation names the rule that produced it, so an operator can disagree with the rule
rather than with a number. The batch ranges are starting points that the PID window and sweeps
refine on the real engine.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from llmconsole.engine.plan.kv_math import KvCapacity, KvLayout, kv_bytes_for
from llmconsole.engine.plan.topology import Topology
from llmconsole.engine.spec import EngineSpec

Goal = Literal["real-time", "throughput"]

SHORT_PROMPT_TOKENS = 512  # below: short
LONG_PROMPT_TOKENS = 4096  # above: long
BATCH_CAP_WITHOUT_TARGET = 16
STATIC_KV_WASTE_FACTOR = 4  # a KV pool this many times what the batch can use is mostly idle


@dataclass(frozen=True)
class Workload:
    prompt_tokens: int = 256
    output_tokens: int = 128
    goal: Goal | None = None
    p99_target_s: float | None = None  # end-to-end latency target
    qps: float | None = None

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1 or self.output_tokens < 1:
            raise ValueError("prompt and output token counts must be at least 1")
        if self.goal not in (None, "real-time", "throughput"):
            raise ValueError(f"goal must be real-time or throughput, not {self.goal!r}")
        if self.p99_target_s is not None and self.p99_target_s <= 0:
            raise ValueError("the p99 target must be positive")
        if self.qps is not None and self.qps < 0:
            raise ValueError("qps must not be negative")


def parse_workload(text: str | None) -> Workload:
    """`prompt=300,output=128,goal=throughput,p99=2.5,qps=4` (any subset, any order)."""
    if not text:
        return Workload()
    keys = {
        "prompt": ("prompt_tokens", int),
        "output": ("output_tokens", int),
        "goal": ("goal", str),
        "p99": ("p99_target_s", float),
        "qps": ("qps", float),
    }
    fields: dict[str, Any] = {}
    for part in text.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep or key not in keys:
            raise ValueError(f"workload item {part!r} is not one of {', '.join(k + '=...' for k in keys)}")
        name, conv = keys[key]
        try:
            fields[name] = conv(value)
        except ValueError:
            kind = {int: "a whole number", float: "a number"}.get(conv, "text")
            raise ValueError(f"workload {key}={value!r} is not {kind}") from None
    return Workload(**fields)


@dataclass(frozen=True)
class Recommendation:
    setting: str  # an EngineSpec field
    value: Any
    rule: str  # the rule that produced it, in words
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Finding:
    """An anti-pattern in the config, with its fix."""

    check: str
    problem: str
    fix: str
    suggested: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def prompt_preset(prompt_tokens: int) -> tuple[str, tuple[int, int]]:
    if prompt_tokens < SHORT_PROMPT_TOKENS:
        return "short", (16, 32)
    if prompt_tokens <= LONG_PROMPT_TOKENS:
        return "medium", (8, 16)
    return "long", (1, 4)


GOAL_BATCH = {"real-time": (4, 8), "throughput": (12, 16)}


def recommend(
    w: Workload, *, model_dtype: str = "bfloat16", device_bf16: bool = True, kv_capacity: KvCapacity | None = None
) -> list[Recommendation]:
    preset, batch = prompt_preset(w.prompt_tokens)
    out: list[Recommendation] = []
    batch_rule = {
        "short": f"prompts under {SHORT_PROMPT_TOKENS} tokens: batch 16-32, full-precision KV",
        "medium": f"prompts of {SHORT_PROMPT_TOKENS}-{LONG_PROMPT_TOKENS} tokens: batch 8-16, fp16 KV, watch p99",
        "long": f"prompts over {LONG_PROMPT_TOKENS} tokens: batch 1-4 with chunked prefill",
    }[preset]
    if w.goal is not None:
        batch = GOAL_BATCH[w.goal]
        batch_rule = f"goal {w.goal}: batch {batch[0]}-{batch[1]} (the stated goal outranks the prompt-length preset)"
    seqs = batch[1]
    detail = f"range {batch[0]}-{batch[1]}; start at the top, let the window or a sweep move it"
    if kv_capacity is not None and int(kv_capacity.max_concurrency) < seqs:
        seqs = max(1, int(kv_capacity.max_concurrency))
        detail += f"; capped at {seqs}: the KV cache holds {kv_capacity.max_concurrency:.2f} full-length requests"
    out.append(Recommendation("max_num_seqs", seqs, batch_rule, detail))

    sixteen_bit = "float16" if model_dtype in ("float16", "float32") or not device_bf16 else "bfloat16"
    if preset == "short":
        out.append(
            Recommendation(
                "kv_cache_dtype",
                "auto",
                batch_rule if w.goal is None else f"prompts under {SHORT_PROMPT_TOKENS} tokens: full-precision KV",
                "KV is small next to the weights here; keep the model's precision",
            )
        )
    elif preset == "medium":
        out.append(
            Recommendation(
                "kv_cache_dtype",
                sixteen_bit,
                f"prompts of {SHORT_PROMPT_TOKENS}-{LONG_PROMPT_TOKENS} tokens: fp16 KV",
                "16-bit KV, no fp8: accuracy holds and the pool still carries the batch",
            )
        )
        out.append(
            Recommendation(
                "p99_watch",
                True,
                f"prompts of {SHORT_PROMPT_TOKENS}-{LONG_PROMPT_TOKENS} tokens: watch p99",
                "long prefills stall decodes; alert on p99 TTFT and ITL",
            )
        )
    else:
        out.append(
            Recommendation(
                "enable_chunked_prefill",
                True,
                f"prompts over {LONG_PROMPT_TOKENS} tokens: chunked prefill",
                "long prompts are split so decodes keep flowing between chunks",
            )
        )
    if not device_bf16 and model_dtype == "bfloat16":
        out.append(
            Recommendation(
                "dtype",
                "float16",
                "V100-class parts cannot run bfloat16",
                "the checkpoint is bfloat16; vLLM casts it to float16 here",
            )
        )
    return out


def check_batch_without_target(spec: EngineSpec, w: Workload) -> Finding | None:
    if spec.max_num_seqs is None or spec.max_num_seqs <= BATCH_CAP_WITHOUT_TARGET or w.p99_target_s is not None:
        return None
    return Finding(
        check="batch raised without a latency target",
        problem=f"max_num_seqs is {spec.max_num_seqs} and no p99 target is set: throughput rises while "
        "every request waits longer, and nothing says when to stop",
        fix=f"cap max_num_seqs at {BATCH_CAP_WITHOUT_TARGET} (a hard cap), or set a p99 target "
        "(--workload p99=S) and let the window find the batch",
        suggested={"max_num_seqs": BATCH_CAP_WITHOUT_TARGET},
    )


def check_static_kv_on_short_prompts(
    spec: EngineSpec, w: Workload, layout: KvLayout, capacity: KvCapacity | None
) -> Finding | None:
    static = spec.kv_cache_memory_bytes is not None or spec.gpu_memory_utilization is not None
    if not static or capacity is None or w.prompt_tokens >= SHORT_PROMPT_TOKENS:
        return None
    seqs = spec.max_num_seqs or 256
    needed = kv_bytes_for(layout, w.prompt_tokens + w.output_tokens, seqs)
    if capacity.kv_cache_bytes < STATIC_KV_WASTE_FACTOR * needed:
        return None
    sized = 2 * needed  # room for bursts and prefix-cache hits
    return Finding(
        check="static KV share on a short-prompt workload",
        problem=f"a fixed KV pool of {capacity.kv_cache_bytes:,} bytes, but {seqs} requests of "
        f"{w.prompt_tokens + w.output_tokens} tokens use at most {needed:,}: "
        f"{capacity.kv_cache_bytes - needed:,} bytes sit idle",
        fix=f"size KV to the workload: --kv-cache-memory-bytes {sized:,} (twice the batch's need) and give "
        "the rest to a larger batch or another engine",
        suggested={"kv_cache_memory_bytes": sized, "gpu_memory_utilization": None},
    )


def check_pcie_tensor_parallel(spec: EngineSpec, topology: Topology | None) -> Finding | None:
    tp = spec.tensor_parallel_size * spec.pipeline_parallel_size
    if topology is None or tp < 2 or topology.num_gpus < 2:
        return None
    first = tuple(range(min(tp, topology.num_gpus)))
    slow = topology.pcie_only_pairs(first)
    if not slow:
        return None
    pairs = ", ".join(f"GPU{link.a}-GPU{link.b} ({link.path})" for link in slow)
    group = topology.nvlink_group(tp)
    if group is not None:
        visible = ",".join(map(str, group))
        fix = f"place the engine on NVLink-joined GPUs {visible}: env CUDA_VISIBLE_DEVICES={visible}"
        suggested: dict[str, Any] = {"env": {"CUDA_VISIBLE_DEVICES": visible}}
    else:
        fix = (
            "no NVLink-joined group of that size here: use fewer, larger GPUs (one that holds the model "
            "needs no all-reduce), or pipeline parallelism, which sends far less between GPUs"
        )
        suggested = {"tensor_parallel_size": 1}
    return Finding(
        check="GPUs joined only by PCIe",
        problem=f"tensor parallelism over {tp} GPUs all-reduces twice per layer per step across {pairs}",
        fix=fix,
        suggested=suggested,
    )
