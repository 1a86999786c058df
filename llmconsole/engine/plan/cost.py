"""Cost estimates: hardware price, 3-year TCO, and cost per million tokens at a target QPS.

Every price is configurable (defaults in `data/devices.json`, overridable per call): quotes differ
by an order of magnitude between buyers, so the figures are only as good as the prices given.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from llmconsole.engine.plan.devices import DeviceProfile, cost_defaults

_HOURS_PER_YEAR = 24 * 365


@dataclass(frozen=True)
class CostInputs:
    electricity_usd_per_kwh: float
    pue: float
    average_power_fraction: float  # of the device's rated power, averaged over the years
    host_overhead_fraction: float  # server, network, storage bought per GPU, as a share of its price
    ops_usd_per_gpu_year: float
    years: float

    @classmethod
    def defaults(cls, **overrides: float) -> CostInputs:
        values = {**cost_defaults(), **{k: v for k, v in overrides.items() if v is not None}}
        unknown = set(values) - set(cls.__dataclass_fields__)
        if unknown:
            raise ValueError(f"unknown cost setting(s): {', '.join(sorted(unknown))}")
        return cls(**{k: float(v) for k, v in values.items()})


@dataclass(frozen=True)
class CostEstimate:
    num_gpus: int  # per replica (tensor-parallel size)
    replicas: int  # to carry the target QPS
    hardware_usd: float  # all replicas
    tco_usd: float  # all replicas, over `years`
    years: float
    target_qps: float
    replica_requests_s: float
    usd_per_million_tokens: float | None  # prompt + output tokens; None when the target is zero

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def tco_per_gpu_usd(device: DeviceProfile, inputs: CostInputs) -> float:
    if device.price_usd is None or device.power_w is None:
        raise ValueError(f"{device.name} has no price or power figure; give them to estimate cost")
    hardware = device.price_usd * (1 + inputs.host_overhead_fraction)
    energy_kwh = device.power_w / 1000 * inputs.average_power_fraction * inputs.pue * _HOURS_PER_YEAR * inputs.years
    return hardware + energy_kwh * inputs.electricity_usd_per_kwh + inputs.ops_usd_per_gpu_year * inputs.years


def estimate_cost(
    device: DeviceProfile,
    num_gpus: int,
    replica_requests_s: float,
    target_qps: float,
    tokens_per_request: int,
    inputs: CostInputs,
) -> CostEstimate:
    replicas = max(1, math.ceil(target_qps / replica_requests_s)) if replica_requests_s > 0 else 0
    per_gpu = tco_per_gpu_usd(device, inputs)
    tco = per_gpu * num_gpus * replicas
    seconds = inputs.years * _HOURS_PER_YEAR * 3600
    tokens_s = target_qps * tokens_per_request
    per_million = tco / seconds / tokens_s * 1e6 if tokens_s > 0 else None
    return CostEstimate(
        num_gpus=num_gpus,
        replicas=replicas,
        hardware_usd=(device.price_usd or 0) * num_gpus * replicas,
        tco_usd=tco,
        years=inputs.years,
        target_qps=target_qps,
        replica_requests_s=replica_requests_s,
        usd_per_million_tokens=per_million,
    )
