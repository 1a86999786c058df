"""Where the tuner's ranges and first trial come from: the planner where it has the model's
shape, else the engine's own limits; each knob says which, so the operator sees why.

The planner (plan/planner.py, plan/kv_math.py) knows what the KV cache holds: for the workload's lengths,
how many requests fit at once. Past that, requests that grow into new blocks preempt one another,
so the batch-size range stops at twice that (and at vLLM's 256) and the first trial starts at it
(or lower, where the prompt-length rule or the workload's own concurrency says so). max_model_len
runs from what the workload needs to what the model and the KV pool can serve. The KV size runs
from a quarter to twice the running pool, but never below one request of the longest
max_model_len the space may run (vLLM refuses to start such a config) and the load's requests,
nor above the memory the engine may take on this host. Without a shape (a hub name not cached,
no config.json) the ranges come from the running config and vLLM's limits.

Every value the first trial runs is computed here (`TuneSpace.first`, by the same
`start_config` the search asks with), so a dry run, the console's question and the study's
trial 0 cannot disagree.

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
# vLLM's token budget when none is given (engine/arg_utils.py, the OpenAI server on CPU; and
# SchedulerConfig's own default): what an engine without the field runs.
VLLM_DEFAULT_BATCHED_TOKENS = 2048
# A KV size the tune may try takes at most this share of the host memory free now (beside the
# running pool, which a restart gives back): the rest is for the engine's weights, other engines
# and the host itself.
KV_SHARE_OF_FREE_MEMORY = 0.5


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
    max_model_len: int = 0  # the running config's (or the model's default)
    free_memory_bytes: int | None = None  # host memory free now, for the KV sizes' ceiling


@dataclass(frozen=True)
class TuneSpace:
    knobs: tuple[Knob, ...]
    sources: dict[str, str]  # knob -> where its values come from
    start: dict[str, Any]  # the first trial's values (before snapping to the lattice)
    start_why: dict[str, str]
    kv: KvFacts | None = None
    running: dict[str, Any] = field(default_factory=dict)  # each knob's value in the running config

    @property
    def first(self) -> dict[str, Any]:
        """What trial 0 runs: the start on each knob's lattice, by the function the search asks with."""
        from llmconsole.engine.tune.search import start_config

        return start_config(self.knobs, self.start)

    def first_text(self) -> str:
        """Trial 0, each value with why it was chosen and what the engine runs now."""
        parts = []
        for k, v in self.first.items():
            notes = [self.start_why[k]] if k in self.start_why else []
            now = self.running.get(k)
            notes.append(f"runs {now} now" if now is not None else "unset now")
            parts.append(f"{k}={v} ({'; '.join(notes)})")
        return "first trial: " + ", ".join(parts)

    def describe(self) -> list[str]:
        lines = [f"{k.describe()}  ({self.sources.get(k.name, 'given')})" for k in self.knobs]
        lines.append(self.first_text())
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
        plan.capacity.max_model_len,
        _free_memory_bytes(),
    )


def _free_memory_bytes() -> int | None:
    """The host memory free now (psutil); None where it cannot be read."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except Exception:  # a host figure missing is a range without a ceiling, not a failed tune
        return None


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
        knob, why = _range(k.name, spec, kv, need, concurrency, _top_model_len(knobs, spec, kv, need))
        out.append(knob)
        sources[k.name] = why
    out, sources = _seqs_within_token_budget(out, sources, spec, {k.name for k in knobs if k.open})
    start, start_why = _start(out, spec, kv, concurrency, facts.window)
    running = {k.name: _running(k.name, spec, facts.window) for k in out}
    return TuneSpace(tuple(out), sources, start, start_why, kv, running)


def _running(name: str, spec: dict[str, Any], window: dict[str, int] | None) -> Any:
    if name in ("gateway_min_window", "gateway_max_window"):
        return (window or {}).get(name.removeprefix("gateway_"))
    if name == "kernel":
        return spec.get("kernel") or "stock"
    return spec.get(name)


def _top_model_len(knobs: Sequence[Knob], spec: dict[str, Any], kv: KvFacts | None, need: int) -> int:
    """The longest max_model_len the space may run: every KV size tried must serve one request
    of it, or vLLM refuses to start."""
    for k in knobs:
        if k.name == "max_model_len" and not k.open:
            return max(k.choices) if k.choices else k.bounds[1]
        if k.name == "max_model_len" and kv is not None:
            return max(need, min(x for x in (kv.max_model_len_that_fits, kv.model_max_len) if x) or need)
    run = spec.get("max_model_len") or (kv.max_model_len if kv is not None else None)
    return max(need, int(run or need))


def _seqs_within_token_budget(
    knobs: list[Knob], sources: dict[str, str], spec: dict[str, Any], derived: set[str]
) -> tuple[list[Knob], dict[str, str]]:
    """vLLM refuses a token budget below max_num_seqs: a derived batch-size range stops at the
    smallest budget the space may run."""
    if "max_num_seqs" not in derived:
        return knobs, sources
    mbt = next((k for k in knobs if k.name == "max_num_batched_tokens"), None)
    if mbt is not None:
        least = min(mbt.choices) if mbt.choices else mbt.bounds[0]
    else:
        least = int(spec.get("max_num_batched_tokens") or VLLM_DEFAULT_BATCHED_TOKENS)
    out = []
    for k in knobs:
        if k.name == "max_num_seqs" and not k.choices and k.bounds[1] > least:
            k = Knob(k.name, low=min(k.bounds[0], least), high=least)
            sources = {**sources, k.name: sources[k.name] + f"; at most the smallest token budget ({least})"}
        out.append(k)
    return out, sources


def _range(
    name: str, spec: dict[str, Any], kv: KvFacts | None, need: int, concurrency: int | None, top_len: int
) -> tuple[Knob, str]:
    seqs = int(spec.get("max_num_seqs") or VLLM_MAX_NUM_SEQS)
    if name == "max_num_seqs":
        if kv is not None and kv.requests_at_once >= 1:
            twice = 2 * kv.requests_at_once
            high = max(2, min(VLLM_MAX_NUM_SEQS, twice))
            cap = f", capped at vLLM's {VLLM_MAX_NUM_SEQS}" if twice > VLLM_MAX_NUM_SEQS else ""
            return Knob(name, low=1, high=high), (
                f"planner: the running KV cache ({kv.kv_cache_bytes:,} bytes) holds {kv.requests_at_once} requests of "
                f"{need} tokens at once; up to twice that{cap}"
            )
        k = default_space(spec, concurrency or seqs)[0]
        return (
            k,
            f"engine limits: up to twice the running max_num_seqs or the load's concurrency (vLLM's cap {VLLM_MAX_NUM_SEQS})",
        )
    if name == "max_num_batched_tokens":
        run = spec.get("max_num_batched_tokens")
        base = int(run) if run else VLLM_DEFAULT_BATCHED_TOKENS
        sizes = tuple(sorted({max(64, base // 4), max(64, base // 2), base, base * 2}))
        what = (
            f"the running token budget ({base})"
            if run
            else f"vLLM's default token budget ({base}, the engine sets none)"
        )
        return Knob(name, choices=sizes), f"engine limits: a quarter to twice {what}"
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
            return _kv_range(kv, top_len)
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


def _kv_range(kv: KvFacts, top_len: int) -> tuple[Knob, str]:
    """A quarter to twice the running pool, each size raised to the least that starts (one
    request of the longest max_model_len the space may run, and the null block) and kept under
    what the host can give. A pool smaller than the load's requests only preempts: the search
    measures that; one that cannot hold a single request does not start at all."""
    layout = _layout(kv)
    floor = kv_bytes_for(layout, top_len, 1)
    ceiling = None
    if kv.free_memory_bytes is not None:
        ceiling = max(floor, kv.kv_cache_bytes + int(kv.free_memory_bytes * KV_SHARE_OF_FREE_MEMORY))
    bpb = layout.bytes_per_block
    sizes = set()
    for share in (0.25, 0.5, 1.0, 2.0):
        size = max(floor, int(kv.kv_cache_bytes * share) // bpb * bpb)
        sizes.add(min(size, ceiling) if ceiling is not None else size)
    why = (
        f"planner: a quarter to twice the running KV cache ({kv.kv_cache_bytes:,} bytes), at least "
        f"{floor:,} bytes (one request of max_model_len {top_len})"
    )
    if ceiling is not None:
        why += f", at most {ceiling:,} bytes (the running pool and {KV_SHARE_OF_FREE_MEMORY:.0%} of the host's free memory)"
    return Knob("kv_cache_memory_bytes", choices=tuple(sorted(sizes))), why


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
        if k.name == "max_num_batched_tokens" and not spec.get(k.name):
            start[k.name], why[k.name] = VLLM_DEFAULT_BATCHED_TOKENS, "vLLM's default"
            continue
        if k.name == "kernel" and not spec.get(k.name):
            start[k.name] = "stock"
            continue
        start[k.name] = spec.get(k.name)
    return start, why
