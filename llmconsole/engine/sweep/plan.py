"""A mini sweep's plan and its results, as immutable values.

A plan is a grid over engine spec fields (each server point restarts the engine) crossed with
load levels (concurrency or rate; each is a load run on the same engine). Load levels run from
the lightest up, so the stop rules can skip what lies beyond a broken SLO or saturation.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from llmconsole.engine.load.workload import LengthDist, Workload
from llmconsole.engine.metrics.latency import Slo
from llmconsole.engine.sweep.tradeoff import KneeUnits

LoadKind = Literal["concurrency", "rate"]


@dataclass(frozen=True)
class LoadLevel:
    kind: LoadKind
    value: float

    @property
    def label(self) -> str:
        return f"{self.kind}={self.value:g}"

    def workload(self, plan: SweepPlan, seed: int) -> Workload:
        if self.kind == "concurrency":
            return Workload.closed(
                int(self.value),
                plan.num_requests,
                plan.input_len,
                plan.output_len,
                warmup_requests=plan.warmup_requests,
                max_duration_s=plan.max_run_s,
                seed=seed,
                ignore_eos=plan.ignore_eos,
            )
        return Workload.open(
            self.value,
            plan.num_requests,
            plan.input_len,
            plan.output_len,
            burstiness=plan.burstiness,
            warmup_requests=plan.warmup_requests,
            max_duration_s=plan.max_run_s,
            seed=seed,
            ignore_eos=plan.ignore_eos,
        )


def parse_grid(items: list[str], fields: set[str]) -> dict[str, tuple[Any, ...]]:
    """`--grid max_num_seqs=4,8,16` items into {field: values}; values parsed as JSON scalars.

    Raises ValueError for an unknown field, a repeated field or an empty value list.
    """
    grid: dict[str, tuple[Any, ...]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not values.strip():
            raise ValueError(f"grid item {item!r} is not FIELD=V1,V2,...")
        if key not in fields:
            raise ValueError(
                f"grid field {key!r} is not an engine spec field "
                f"(e.g. max_num_seqs, max_model_len, max_num_batched_tokens, kv_cache_memory_bytes)"
            )
        if key in grid:
            raise ValueError(f"grid field {key!r} is given twice")
        grid[key] = tuple(_scalar(v.strip()) for v in values.split(",") if v.strip())
    return grid


def _scalar(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text  # a bare word (kernel=custom, dtype=bfloat16)


def parse_loads(items: list[str]) -> tuple[LoadLevel, ...]:
    """`concurrency=4,16` or `rate=2,8` into load levels, lightest first."""
    levels: list[LoadLevel] = []
    kinds = set()
    for item in items:
        kind, sep, values = item.partition("=")
        kind = kind.strip()
        if kind not in ("concurrency", "rate") or not sep:
            raise ValueError(f"load {item!r} is not concurrency=N1,N2 or rate=R1,R2 (requests/s)")
        kinds.add(kind)
        for v in values.split(","):
            try:
                x = float(v)
            except ValueError:
                raise ValueError(f"load {item!r}: {v!r} is not a number") from None
            if not x > 0 or (kind == "concurrency" and x != int(x)):
                raise ValueError(
                    f"load {item!r}: {v!r} must be a positive {'whole ' if kind == 'concurrency' else ''}number"
                )
            levels.append(LoadLevel(kind, x))  # type: ignore[arg-type]
    if not levels:
        raise ValueError("give at least one load level, e.g. concurrency=4,16")
    if len(kinds) > 1:
        raise ValueError("sweep one kind of load at a time (concurrency or rate)")
    return tuple(sorted(set(levels), key=lambda lv: lv.value))


@dataclass(frozen=True)
class SweepPlan:
    engine: str
    grid: dict[str, tuple[Any, ...]]
    loads: tuple[LoadLevel, ...]
    slo: Slo = Slo()
    repeats: int = 3
    num_requests: int = 32
    input_len: LengthDist = LengthDist.fixed(64)
    output_len: LengthDist = LengthDist.fixed(64)
    burstiness: float = 1.0
    warmup_requests: int = 2
    ignore_eos: bool = True
    max_run_s: float | None = 300.0  # one load run's time bound
    max_error_rate: float = 0.05  # stop rule: more failed requests than this
    saturation_gain: float = 0.05  # stop rule: throughput rose less than this (relative) ...
    saturation_latency_rise: float = 0.20  # ... while p99 rose more than this
    spread_limit: float = 0.15  # flag a point whose repeats spread more than this
    knee_threshold: float = 2.5
    knee_units: KneeUnits = "relative"
    # The load goes to the engine's own port (a config's own figures) unless asked to pass the
    # engine's gateway door, where the batch window admits it and caps its concurrency.
    through_gateway: bool = False

    def __post_init__(self) -> None:
        if self.repeats < 1:
            raise ValueError("repeats must be at least 1")
        if any(len(v) == 0 for v in self.grid.values()):
            raise ValueError("every grid field needs at least one value")
        if not self.loads:
            raise ValueError("give at least one load level")

    def server_points(self) -> list[dict[str, Any]]:
        """Every combination of the grid's values, in the order given (the first field slowest)."""
        keys = list(self.grid)
        return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(self.grid[k] for k in keys))]

    @property
    def total_points(self) -> int:
        return len(self.server_points()) * len(self.loads)

    def describe(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "grid": {k: list(v) for k, v in self.grid.items()},
            "loads": [lv.label for lv in self.loads],
            "slo": self.slo.as_dict(),
            "repeats": self.repeats,
            "num_requests": self.num_requests,
            "input_len": self.input_len.describe(),
            "output_len": self.output_len.describe(),
            "warmup_requests": self.warmup_requests,
            "ignore_eos": self.ignore_eos,
            "max_error_rate": self.max_error_rate,
            "saturation_gain": self.saturation_gain,
            "saturation_latency_rise": self.saturation_latency_rise,
            "spread_limit": self.spread_limit,
            "knee_threshold": self.knee_threshold,
            "knee_units": self.knee_units,
            "through_gateway": self.through_gateway,
        }


@dataclass(frozen=True)
class PointResult:
    """One (server params, load) point: medians over its repeats, or why it has none."""

    index: int  # 1-based, in plan order
    server: dict[str, Any]
    load: LoadLevel
    status: str  # ok | slo_missed | failed | skipped
    reason: str | None = None  # why failed / skipped / which SLO targets were missed
    config_id: str | None = None
    repeats: int = 0
    throughput_req_s: float | None = None
    throughput_tok_s: float | None = None
    goodput_req_s: float | None = None
    slo_attainment: float | None = None
    error_rate: float | None = None
    latency_ms: dict[str, float | None] = field(default_factory=dict)  # p50_ttft, p99_e2e, ...
    spread: dict[str, float | None] = field(default_factory=dict)  # (max - min) / median
    flags: tuple[str, ...] = ()
    peak_kv_usage: float | None = None
    preemptions: int | None = None
    memory_bytes: int | None = None
    memory_source: str | None = None
    memory_na_reason: str | None = None
    compute_util: float | None = None
    bandwidth_util: float | None = None
    util_na_reason: str | None = None

    @property
    def params(self) -> dict[str, Any]:
        value = int(self.load.value) if self.load.kind == "concurrency" else self.load.value
        return {**self.server, self.load.kind: value}

    @property
    def label(self) -> str:
        return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.params.items())

    @property
    def measured(self) -> bool:
        return self.status in ("ok", "slo_missed") and self.throughput_req_s is not None

    @property
    def p99_e2e_ms(self) -> float | None:
        return self.latency_ms.get("p99_e2e")

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["load"] = {"kind": self.load.kind, "value": self.load.value}
        d["flags"] = list(self.flags)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> PointResult:
        """The inverse of to_json; keys it does not know (a report's `label`, `params`) are left out."""
        names = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in d.items() if k in names}
        fields["load"] = LoadLevel(d["load"]["kind"], float(d["load"]["value"]))
        fields["flags"] = tuple(d.get("flags") or ())
        return cls(**fields)


@dataclass(frozen=True)
class SweepProgress:
    """One step of a running sweep, for a progress line or view. Named as what happened."""

    event: str  # engine_restarting | point_started | point_finished | point_skipped | restored | finished
    index: int  # 1-based point index (0 before the first)
    total: int
    params: dict[str, Any]
    elapsed_s: float
    eta_s: float | None  # None until a point has been measured
    message: str = ""
    result: PointResult | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "event": self.event,
            "index": self.index,
            "total": self.total,
            "params": self.params,
            "elapsed_s": self.elapsed_s,
            "eta_s": self.eta_s,
            "message": self.message,
            "result": None if self.result is None else self.result.to_json(),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> SweepProgress:
        return cls(
            d["event"],
            int(d["index"]),
            int(d["total"]),
            dict(d["params"]),
            float(d["elapsed_s"]),
            d.get("eta_s"),
            d.get("message", ""),
            None if d.get("result") is None else PointResult.from_json(d["result"]),
        )
