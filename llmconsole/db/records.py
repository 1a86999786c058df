"""What the store hands back: immutable records, safe to pass between threads and to keep.

JSON columns stay JSON text inside a record (`detail_json`); the matching property (`detail`)
parses a fresh copy on every call, so no caller can change what another one sees.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from llmconsole.db.schema import bound_fields
from llmconsole.engine.metrics.percentile import Percentile


def _object(text: str) -> dict[str, Any]:
    """A JSON column's text as the object the store wrote there (always an object)."""
    value: dict[str, Any] = json.loads(text)
    return value


@dataclass(frozen=True, slots=True)
class OperatorSession:
    id: int
    attached_at: float
    detached_at: float | None
    user: str
    host: str
    client: str


@dataclass(frozen=True, slots=True)
class ConfigVersion:
    config_id: str
    spec_json: str
    first_seen_at: float
    label: str | None = None

    @property
    def spec(self) -> dict[str, Any]:
        return _object(self.spec_json)


@dataclass(frozen=True, slots=True)
class EngineRun:
    id: int
    engine: str
    config_id: str
    session_id: int | None
    pid: int | None
    port: int | None
    started_at: float
    ready_at: float | None
    exited_at: float | None
    exit_code: int | None
    exit_reason: str | None
    kv_cache_tokens: int | None
    max_concurrency: float | None
    outcome: str


@dataclass(frozen=True, slots=True)
class ConfigHistory:
    """A config as one engine used it: its runs' verdicts and when it was first and last used."""

    config_id: str
    spec_json: str
    first_seen_at: float
    label: str | None
    run_ids: tuple[int, ...]  # oldest first
    outcomes: tuple[str, ...]  # the runs' outcomes, in the same order
    first_used_at: float
    last_used_at: float  # exit of its latest run, or its start while it runs
    in_use: bool  # a run of it has not exited

    @property
    def spec(self) -> dict[str, Any]:
        return _object(self.spec_json)

    @property
    def verdict(self) -> str:
        """The latest decided outcome (known_good / known_bad), or pending if none was decided."""
        return next((o for o in reversed(self.outcomes) if o != "pending"), "pending")


@dataclass(frozen=True, slots=True)
class Action:
    id: int
    at: float
    actor: str
    session_id: int | None
    engine: str | None
    kind: str
    from_config_id: str | None
    to_config_id: str | None
    outcome: str
    automatic: bool
    detail_json: str

    @property
    def detail(self) -> dict[str, Any]:
        return _object(self.detail_json)


@dataclass(frozen=True, slots=True)
class Alert:
    id: int
    at: float
    engine: str | None
    rule: str
    severity: str
    state: str
    resolved_at: float | None
    detail_json: str

    @property
    def detail(self) -> dict[str, Any]:
        return _object(self.detail_json)


@dataclass(frozen=True, slots=True)
class MetricSample:
    """One engine's gauges at `at_s`; None is a value: the gauge was not available."""

    engine: str
    at_s: float
    resolution_s: float = 1.0
    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None
    prompt_tok_s: float | None = None
    generation_tok_s: float | None = None
    p50_ttft_s: float | None = None
    p99_ttft_s: float | None = None
    p50_itl_s: float | None = None
    p99_itl_s: float | None = None
    p50_tpot_s: float | None = None
    p99_tpot_s: float | None = None
    p50_e2e_s: float | None = None
    p99_e2e_s: float | None = None
    gpu_memory_bytes: int | None = None
    host_memory_bytes: int | None = None
    # The histogram bucket each percentile fell in: what the figure can tell apart. Both None:
    # not recorded (a sample from before schema v3, or no figure); an upper None beside a lower
    # bound: past the last finite bound. A downsampled row's bounds hold its kept value.
    p50_ttft_lower_s: float | None = None
    p50_ttft_upper_s: float | None = None
    p99_ttft_lower_s: float | None = None
    p99_ttft_upper_s: float | None = None
    p50_itl_lower_s: float | None = None
    p50_itl_upper_s: float | None = None
    p99_itl_lower_s: float | None = None
    p99_itl_upper_s: float | None = None
    p50_tpot_lower_s: float | None = None
    p50_tpot_upper_s: float | None = None
    p99_tpot_lower_s: float | None = None
    p99_tpot_upper_s: float | None = None
    p50_e2e_lower_s: float | None = None
    p50_e2e_upper_s: float | None = None
    p99_e2e_lower_s: float | None = None
    p99_e2e_upper_s: float | None = None

    def percentile(self, field: str) -> Percentile | None:
        """`p99_ttft_s` with its bucket; None where the sample has no such figure. A sample
        whose bounds were not recorded gives a Percentile whose bounds are the figure itself
        (percentile.py's convention for a figure without bounds; `bounds_recorded` says which)."""
        value: float | None = getattr(self, field)
        if value is None:
            return None
        lower_name, upper_name = bound_fields(field)
        lower: float | None = getattr(self, lower_name)
        upper: float | None = getattr(self, upper_name)
        q = int(field.split("_")[0][1:]) / 100
        if lower is None:
            return Percentile(q, value, value, value)
        return Percentile(q, value, lower, math.inf if upper is None else upper)

    def bounds_recorded(self, field: str) -> bool:
        """Whether the percentile `field` was stored with its bucket (not so before schema v3)."""
        return getattr(self, field) is not None and getattr(self, bound_fields(field)[0]) is not None


@dataclass(frozen=True, slots=True)
class WindowSample:
    """One tick of a batch-window controller: what it aimed at, saw, and set."""

    group_name: str
    at_s: float
    target: float | None = None
    measured: float | None = None
    error: float | None = None
    p: float | None = None
    i: float | None = None
    d: float | None = None
    window: float | None = None


@dataclass(frozen=True, slots=True)
class Sweep:
    id: int
    engine: str
    config_id: str | None
    created_at: float
    finished_at: float | None
    grid_json: str
    load_json: str
    slo_json: str
    status: str

    @property
    def grid(self) -> dict[str, Any]:
        return _object(self.grid_json)

    @property
    def load(self) -> dict[str, Any]:
        return _object(self.load_json)

    @property
    def slo(self) -> dict[str, Any]:
        return _object(self.slo_json)


@dataclass(frozen=True, slots=True)
class SweepPoint:
    id: int
    sweep_id: int
    at: float
    params_json: str
    repeat: int
    config_id: str | None
    throughput_req_s: float | None
    throughput_tok_s: float | None
    p50_ttft_s: float | None
    p99_ttft_s: float | None
    p50_itl_s: float | None
    p99_itl_s: float | None
    p50_tpot_s: float | None
    p99_tpot_s: float | None
    p50_e2e_s: float | None
    p99_e2e_s: float | None
    peak_kv_usage: float | None
    preemptions: int | None
    memory_bytes: int | None
    compute_util: float | None
    bandwidth_util: float | None
    status: str
    flags: tuple[str, ...]

    @property
    def params(self) -> dict[str, Any]:
        return _object(self.params_json)


@dataclass(frozen=True, slots=True)
class CompactionResult:
    raw_rows_downsampled: int  # full-resolution rows folded into coarser ones
    downsampled_rows_written: int
    samples_expired: int  # rows of any resolution past keep_samples_s
    trace_rows_expired: int
