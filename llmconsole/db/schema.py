"""The tables, as SQLModel classes: the store's queries are written against these.

The DDL that creates them lives in migrations.py (frozen per schema version); a test keeps the
two in agreement. Times named `*_at` are Unix epoch seconds; `at_s` is the same clock on rows
that come in series. JSON columns end in `_json`. These rows stay inside the store: callers
get the immutable records of records.py.
"""

from __future__ import annotations

import re

from sqlmodel import Field, SQLModel


class SessionRow(SQLModel, table=True):
    """An operator attaching a console (TUI or CLI) to the daemon, until they detach."""

    __tablename__ = "sessions"
    id: int | None = Field(default=None, primary_key=True)
    attached_at: float
    detached_at: float | None = None
    user: str
    host: str
    client: str  # "tui", "cli", ...


class ConfigVersionRow(SQLModel, table=True):
    """One engine config, stored once however often it runs (keyed by EngineSpec.config_id)."""

    __tablename__ = "config_versions"
    config_id: str = Field(primary_key=True)
    spec_json: str  # EngineSpec.public_dict(), secrets scrubbed
    first_seen_at: float
    label: str | None = None  # since schema v2


class EngineRunRow(SQLModel, table=True):
    """One engine process, from launch to exit, and the verdict on its config."""

    __tablename__ = "engine_runs"
    id: int | None = Field(default=None, primary_key=True)
    engine: str
    config_id: str = Field(foreign_key="config_versions.config_id")
    session_id: int | None = Field(default=None, foreign_key="sessions.id")
    pid: int | None = None
    port: int | None = None
    started_at: float
    ready_at: float | None = None
    exited_at: float | None = None
    exit_code: int | None = None
    exit_reason: str | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    outcome: str = "pending"  # pending | known_good | known_bad


class ActionRow(SQLModel, table=True):
    """Something an operator or the daemon did: the audit log that rollbacks are chosen from."""

    __tablename__ = "actions"
    id: int | None = Field(default=None, primary_key=True)
    at: float
    actor: str  # a user name, or "automatic"
    session_id: int | None = Field(default=None, foreign_key="sessions.id")
    engine: str | None = None
    kind: str  # start, stop, restart, rollback, mode, ...
    from_config_id: str | None = Field(default=None, foreign_key="config_versions.config_id")
    to_config_id: str | None = Field(default=None, foreign_key="config_versions.config_id")
    outcome: str = "pending"
    automatic: bool = False
    detail_json: str = "{}"


class AlertRow(SQLModel, table=True):
    """One alert episode: fired at `at`, resolved at `resolved_at` (state says which it is in)."""

    __tablename__ = "alerts"
    id: int | None = Field(default=None, primary_key=True)
    at: float
    engine: str | None = None
    rule: str
    severity: str
    state: str = "firing"  # firing | resolved
    resolved_at: float | None = None
    detail_json: str = "{}"


class MetricSampleRow(SQLModel, table=True):
    """One engine's gauges at one time; `resolution_s` says how much time the row stands for."""

    __tablename__ = "metric_samples"
    engine: str = Field(primary_key=True)
    at_s: float = Field(primary_key=True)
    resolution_s: float
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
    # Since schema v3: the histogram bucket each percentile above fell in (NULL: not recorded;
    # an upper NULL beside a lower: past the last finite bound).
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


class WindowTraceRow(SQLModel, table=True):
    """One tick of the batch-window PID controller of an engine group."""

    __tablename__ = "window_trace"
    group_name: str = Field(primary_key=True)
    at_s: float = Field(primary_key=True)
    target: float | None = None
    measured: float | None = None
    error: float | None = None
    p: float | None = None
    i: float | None = None
    d: float | None = None
    window: float | None = None


class SweepRow(SQLModel, table=True):
    __tablename__ = "sweeps"
    id: int | None = Field(default=None, primary_key=True)
    engine: str
    config_id: str | None = Field(default=None, foreign_key="config_versions.config_id")
    created_at: float
    finished_at: float | None = None
    grid_json: str
    load_json: str
    slo_json: str
    status: str = "pending"  # pending | running | done | failed | cancelled


class SweepPointRow(SQLModel, table=True):
    __tablename__ = "sweep_points"
    id: int | None = Field(default=None, primary_key=True)
    sweep_id: int = Field(foreign_key="sweeps.id")
    at: float
    params_json: str
    repeat: int = 0
    config_id: str | None = None
    throughput_req_s: float | None = None
    throughput_tok_s: float | None = None
    p50_ttft_s: float | None = None
    p99_ttft_s: float | None = None
    p50_itl_s: float | None = None
    p99_itl_s: float | None = None
    p50_tpot_s: float | None = None
    p99_tpot_s: float | None = None
    p50_e2e_s: float | None = None
    p99_e2e_s: float | None = None
    peak_kv_usage: float | None = None
    preemptions: int | None = None
    memory_bytes: int | None = None
    compute_util: float | None = None
    bandwidth_util: float | None = None
    status: str = "ok"  # ok | failed | slo_missed
    flags_json: str = "[]"


TABLES = (
    SessionRow,
    ConfigVersionRow,
    EngineRunRow,
    ActionRow,
    AlertRow,
    MetricSampleRow,
    WindowTraceRow,
    SweepRow,
    SweepPointRow,
)

# The gauges of a metric sample, in column order; shared by inserts, compaction and exports.
METRIC_FIELDS: tuple[str, ...] = tuple(
    name for name in MetricSampleRow.model_fields if name not in ("engine", "at_s", "resolution_s")
)
# The percentiles read from vLLM's histograms (p50_ttft_s, ...): each has a bucket, whose bounds
# are the columns `bound_fields` names.
PERCENTILE_FIELDS: tuple[str, ...] = tuple(name for name in METRIC_FIELDS if re.fullmatch(r"p\d+_[a-z0-9]+_s", name))


def bound_fields(field: str) -> tuple[str, str]:
    """The lower and upper bound columns of a percentile field: p99_ttft_s -> p99_ttft_lower_s, ..."""
    stem = field.removesuffix("_s")
    return f"{stem}_lower_s", f"{stem}_upper_s"


BOUND_FIELDS: frozenset[str] = frozenset(b for f in PERCENTILE_FIELDS for b in bound_fields(f))
WINDOW_FIELDS: tuple[str, ...] = ("target", "measured", "error", "p", "i", "d", "window")
SWEEP_FIGURES: tuple[str, ...] = tuple(
    name
    for name in SweepPointRow.model_fields
    if name not in ("id", "sweep_id", "at", "params_json", "repeat", "config_id", "status", "flags_json")
)
