"""Where the tuner's ranges and first trial come from: the planner where it has the model's
shape, else the engine's own limits; each knob says which, so the operator sees why.

The planner (plan/planner.py, plan/kv_math.py) knows what the KV cache holds: for the workload's lengths,
how many requests fit at once. Past that, requests that grow into new blocks preempt one another,
so the batch-size range stops at twice that and the first trial starts at it (or lower, where the
prompt-length rule or the workload's own concurrency says so). max_model_len runs from what the
workload needs to what the model and the KV pool can serve; the KV size from a quarter to twice
the workload's concurrency in requests of its length. Without a shape (a hub name not cached,
no config.json) the ranges come from the running config and vLLM's limits.

A knob given with values keeps them ("given"); a knob named without values (`--knob
max_num_seqs`) gets its range here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from llmconsole.engine.plan.kv_math import KvLayout, cdiv, kv_bytes_for
from llmconsole.engine.tune.space import Knob, default_space

VLLM_MAX_NUM_SEQS = 256  # vLLM's default, and the top of a range the planner cannot bound


@dataclass(frozen=True)
class EngineFacts:
    """What the ranges are derived from: the engine's model, device and public config, and the
    gateway's window bounds when known."""

    model: str
    device: str = "cpu"  # cpu | cuda
    spec: dict[str, Any] = field(default_factory=dict)
    window: dict[str, int] | None = None  # {"min_window": .., "max_window": ..}
    custom_kernel_refusal: str | None = None  # why the runtime cannot run kernel=custom; None: it can


@dataclass(frozen=True)
class KvFacts:
    """The planner's exact KV figures for the running config and the workload's lengths."""

    kv_cache_bytes: int
    block_size: int
    kv_bytes_per_token: int
    workload_tokens: int
    requests_at_once: int  # requests of the workload's length the pool holds
    max_model_len_that_fits: int
    model_max_len: int | None
    recommended_seqs: int
    rule: str


@dataclass(frozen=True)
class TuneSpace:
    knobs: tuple[Knob, ...]
    sources: dict[str, str]  # knob -> where its values come from
    start: dict[str, Any]  # the first trial's values (before snapping to the lattice)
    start_why: dict[str, str]
    kv: KvFacts | None = None

    def describe(self) -> list[str]:
        lines = [f"{k.describe()}  ({self.sources.get(k.name, 'given')})" for k in self.knobs]
        lines.append(
            "first trial: "
            + ", ".join(
                f"{k}={v} ({self.start_why[k]})" if k in self.start_why else f"{k}={v}" for k, v in self.start.items()
            )
        )
        return lines


def kv_facts(facts: EngineFacts, workload_tokens: int) -> KvFacts | None:
    """The planner's view of this engine's KV pool for the workload, or None where it has none
    (no local config.json, a KV pool vLLM sizes at start-up on a device without a profile)."""
    from llmconsole.engine.plan.devices import cpu_profile
    from llmconsole.engine.plan.planner import make_plan
    from llmconsole.engine.plan.recommend import Workload
    from llmconsole.engine.spec import EngineSpec

    if facts.device != "cpu":
        return None  # a GPU's KV pool is profiled at start-up: only an estimate, not a bound
    try:
        spec = EngineSpec(
            **{k: v for k, v in {**facts.spec, "model": facts.model}.items() if k in EngineSpec.model_fields}
        )
        plan = make_plan(
            spec,
            cpu_profile(),
            Workload(
                prompt_tokens=max(1, workload_tokens // 2), output_tokens=max(1, workload_tokens - workload_tokens // 2)
            ),
        )
    except Exception:  # a spec the planner cannot read is a plan without figures, not a failed tune
        return None
    if plan.capacity is None or plan.block_size is None or plan.kv_bytes_per_token is None or not plan.kv_exact:
        return None
    per_request = cdiv(workload_tokens, plan.block_size)
    at_once = max(0, (plan.capacity.num_blocks - 1) // per_request)
    rec = next((r for r in plan.recommendations if r.setting == "max_num_seqs"), None)
    return KvFacts(
        plan.capacity.kv_cache_bytes,
        plan.block_size,
        plan.kv_bytes_per_token,
        workload_tokens,
        at_once,
        plan.capacity.max_model_len_that_fits,
        plan.shape.default_max_model_len if plan.shape else None,
        int(rec.value) if rec else VLLM_MAX_NUM_SEQS,
        rec.rule if rec else "vLLM's default",
    )


def derive_space(
    knobs: Sequence[Knob], facts: EngineFacts, *, input_len: int, output_len: int, concurrency: int | None
) -> TuneSpace:
    """Ranges for the knobs named without values, and the first trial, from the planner where
    it can, else from the engine's limits. `concurrency` is the closed-loop load's (None for a
    rate): more seats than requests in flight buy nothing."""
    need = input_len + output_len
    spec = facts.spec
    kv = kv_facts(facts, need)
    out: list[Knob] = []
    sources: dict[str, str] = {}
    for k in knobs:
        if k.name == "kernel" and "custom" in k.choices and facts.custom_kernel_refusal:
            raise ValueError(f"knob {k.describe()}: {facts.custom_kernel_refusal}")
        if not k.open:
            out.append(k)
            sources[k.name] = "given"
            continue
        if k.name == "kernel" and facts.custom_kernel_refusal:
            out.append(Knob("kernel", choices=("stock",)))
            sources[k.name] = f"runtime: stock only ({facts.custom_kernel_refusal})"
            continue
        knob, why = _range(k.name, spec, kv, need, concurrency)
        out.append(knob)
        sources[k.name] = why
    start, start_why = _start(out, spec, kv, concurrency, facts.window)
    return TuneSpace(tuple(out), sources, start, start_why, kv)


def _range(name: str, spec: dict[str, Any], kv: KvFacts | None, need: int, concurrency: int | None) -> tuple[Knob, str]:
    seqs = int(spec.get("max_num_seqs") or VLLM_MAX_NUM_SEQS)
    if name == "max_num_seqs":
        if kv is not None and kv.requests_at_once >= 1:
            high = max(2, min(VLLM_MAX_NUM_SEQS, 2 * kv.requests_at_once))
            return Knob(name, low=1, high=high), (
                f"planner: the KV cache ({kv.kv_cache_bytes:,} bytes) holds {kv.requests_at_once} requests of "
                f"{need} tokens at once; up to twice that"
            )
        k = default_space(spec, concurrency or seqs)[0]
        return (
            k,
            f"engine limits: up to twice the running max_num_seqs or the load's concurrency (vLLM's cap {VLLM_MAX_NUM_SEQS})",
        )
    if name == "max_num_batched_tokens":
        k = default_space(spec, concurrency or seqs)[1]
        return k, "engine limits: a quarter to twice the running token budget (vLLM's default 2048)"
    if name == "max_model_len":
        if kv is not None:
            high = (
                min(x for x in (kv.max_model_len_that_fits, kv.model_max_len) if x)
                if kv.model_max_len
                else kv.max_model_len_that_fits
            )
            if high >= need:
                return Knob(name, low=need, high=high), (
                    f"planner: from the workload's {need} tokens to the longest the KV pool serves ({kv.max_model_len_that_fits})"
                    + (f" and the model allows ({kv.model_max_len})" if kv.model_max_len else "")
                )
        top = max(need, int(spec.get("max_model_len") or 4 * need))
        return Knob(name, low=need, high=top), "engine limits: from the workload's need to the running max_model_len"
    if name == "kv_cache_memory_bytes":
        if kv is not None:
            c = max(1, concurrency or kv.requests_at_once or 1)
            layout = _layout(kv)
            sizes = tuple(sorted({kv_bytes_for(layout, need, max(1, c * n // 4)) for n in (1, 2, 4, 8)}))
            return Knob(name, choices=sizes), (
                f"planner: KV for a quarter to twice the load's {c} requests of {need} tokens"
            )
        run = spec.get("kv_cache_memory_bytes")
        if run:
            return Knob(
                name, choices=(int(run) // 2, int(run), int(run) * 2)
            ), "engine limits: half to twice the running KV size"
        raise ValueError(
            "kv_cache_memory_bytes has no range: the engine runs without an explicit KV size and the "
            "planner has no figures for it; give values (kv_cache_memory_bytes=A,B,...)"
        )
    if name == "gpu_memory_utilization":
        return Knob(name, choices=(0.8, 0.85, 0.9, 0.95)), "engine limits: vLLM's usual 0.8-0.95"
    if name == "kernel":
        return Knob(name, choices=("stock", "custom")), "engine limits: both kernels"
    if name in ("gateway_min_window", "gateway_max_window"):
        top = max(2, seqs if seqs < VLLM_MAX_NUM_SEQS else 2 * (concurrency or 16))
        return Knob(name, low=1, high=top), (
            f"engine limits: 1 to max_num_seqs ({seqs}); a larger window only queues inside the engine"
        )
    raise ValueError(f"knob {name!r} has no range to derive; give its values")


def _layout(kv: KvFacts) -> KvLayout:
    return KvLayout(kv.block_size, kv.kv_bytes_per_token)


def _start(
    knobs: Sequence[Knob],
    spec: dict[str, Any],
    kv: KvFacts | None,
    concurrency: int | None,
    window: dict[str, int] | None,
) -> tuple[dict[str, Any], dict[str, str]]:
    start: dict[str, Any] = {}
    why: dict[str, str] = {}
    for k in knobs:
        if k.name == "max_num_seqs":
            caps = []
            if kv is not None:
                caps += [
                    (kv.recommended_seqs, f"planner: {kv.rule}"),
                    (
                        max(1, kv.requests_at_once),
                        f"the KV cache holds {kv.requests_at_once} requests of {kv.workload_tokens} tokens",
                    ),
                ]
            if concurrency:
                caps.append((concurrency, f"the load keeps {concurrency} requests in flight"))
            if caps:
                start[k.name], why[k.name] = min(caps, key=lambda c: c[0])
                continue
        if k.name in ("gateway_min_window", "gateway_max_window") and window:
            start[k.name] = window.get(k.name.removeprefix("gateway_"))
            continue
        start[k.name] = spec.get(k.name)
    return start, why
