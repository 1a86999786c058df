"""An engine's status, the host's gauges and the daemon's facts: GET /v1/status, GET /v1/daemon,
and the answer of an engine start, stop or restart."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from llmconsole.wire.base import WireModel
from llmconsole.wire.version import UNVERSIONED

Bounds = list[float | None]  # a percentile's bucket [lower_s, upper_s]; upper None past the last bound


class RankMetrics(WireModel):
    """One data-parallel rank of an engine (engine/metrics/ranks.py RankFigures)."""

    rank: str = "?"  # the engine's /metrics label `engine`
    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None  # a fraction 0..1
    peers_waiting: float | None = None  # the mean of the other ranks'
    peers_kv_cache_usage: float | None = None
    gaps: list[str] = Field(default_factory=list)  # far above its peers now: "queue", "kv"
    gap_for_s: float | None = None  # for how long
    lagging: bool = False  # the gap held long enough to mark the rank
    note: str | None = None  # why it lags, as a person reads it


class EngineMetrics(WireModel):
    """The engine's windowed figures (engine/metrics/window.py WindowedMetrics)."""

    taken_at_s: float | None = None
    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None  # a fraction 0..1
    preemptions_total: float | None = None
    preemptions_per_s: float | None = None
    prompt_tok_s: float | None = None
    generation_tok_s: float | None = None
    request_per_s: float | None = None
    requests_in_window: float | None = None
    p50_ttft_s: float | None = None
    p90_ttft_s: float | None = None
    p99_ttft_s: float | None = None
    p50_itl_s: float | None = None
    p90_itl_s: float | None = None
    p99_itl_s: float | None = None
    p50_tpot_s: float | None = None
    p90_tpot_s: float | None = None
    p99_tpot_s: float | None = None
    p50_e2e_s: float | None = None
    p90_e2e_s: float | None = None
    p99_e2e_s: float | None = None
    p50_queue_s: float | None = None
    p90_queue_s: float | None = None
    p99_queue_s: float | None = None
    num_gpu_blocks: int | None = None
    block_size: int | None = None
    rate_window_s: float | None = None
    percentile_window_s: float | None = None
    # Each percentile's bucket (what the figures can tell apart); absent from a version 1 answer
    # of an older daemon, where a percentile is then its bare figure.
    percentile_bounds: dict[str, Bounds] = Field(default_factory=dict)
    stale: bool = False
    scrape_errors: int = 0
    last_error: str | None = None
    # A data-parallel engine's ranks (two or more), beside the merged figures above.
    ranks: list[RankMetrics] = Field(default_factory=list)

    def figure(self, key: str) -> float | None:
        """A numeric field by name (`p99_ttft_s`); None for an unknown name or no figure."""
        value = getattr(self, key, None) if key in type(self).model_fields else None
        return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class ProcessInfo(WireModel):
    """The engine's process tree, summed (engine/host.py ProcessSample)."""

    pid: int | None = None
    rss_bytes: int | None = None
    cpu_pct: float | None = None
    num_processes: int | None = None


class ControllerStep(WireModel):
    """One step of the window controller (engine/gateway/measures.py TraceSample)."""

    at_s: float | None = None
    target_ms: float | None = None
    measured_ms: float | None = None
    error: float | None = None
    p: float | None = None
    i: float | None = None
    d: float | None = None
    output: float | None = None
    window: int | None = None
    samples: int | None = None
    action: str | None = None


class GroupMember(WireModel):
    """One engine of a gateway group as the group routes to it."""

    url: str | None = None
    ready: bool = False
    held: bool = False
    outstanding: int | None = None
    requests: int | None = None
    resent: int | None = None
    remote: bool = False
    health: dict[str, Any] | None = None  # another host's engine: what the checks found


class ControllerState(WireModel):
    """An engine group's admission window, its PID controller and its counters
    (engine/gateway/group.py state_json): an engine's `controller` in its status."""

    group: str | None = None
    window: int | None = None
    frozen: bool = False
    signal: str | None = None
    target_ms: float | None = None
    min_window: int | None = None
    max_window: int | None = None
    start_window: int | None = None
    kp: float | None = None
    ki: float | None = None
    kd: float | None = None
    deadband: float | None = None
    trace: list[ControllerStep] = Field(default_factory=list)
    recent_ok: int | None = None  # of the group's newest requests, those that succeeded,
    recent_streamed: int | None = None  # and of them those streamed (a TTFT comes only from streams)
    controlled: bool | None = None
    in_flight: int | None = None
    queued: int | None = None
    open: bool | None = None
    max_queue: int | None = None
    queue_timeout_s: float | None = None
    admitted_total: int | None = None
    rejected_full_total: int | None = None
    timed_out_total: int | None = None
    max_in_flight_seen: int | None = None
    engines: dict[str, GroupMember] = Field(default_factory=dict)


class StartupInfo(WireModel):
    """How far a starting engine is, as the daemon read it from its log."""

    phase: str | None = None
    step: int = 0
    steps: int = 1
    elapsed_s: float | None = None
    expected_s: float | None = None  # how long its last start took; None for a first start


class EngineInfo(WireModel):
    """One engine's status (engine/status.py EngineStatus), with the flat figures at the top that
    `status --json` has always had (the CLI's contract) and a starting engine's progress."""

    name: str = "?"
    # engine/status.py EngineState's value; kept as text, so a state this client does not know (a
    # newer daemon's) is shown as it is rather than refused.
    state: str = "unknown"
    config_id: str | None = None
    model: str | None = None
    served_model_name: str | None = None
    device: str | None = None
    pid: int | None = None
    port: int | None = None
    url: str | None = None
    restarts: int | None = None
    crash_looping: bool = False
    adopted: bool = False
    started_at_s: float | None = None
    ready_at_s: float | None = None
    uptime_s: float | None = None
    last_exit_code: int | None = None
    last_error: str | None = None
    next_restart_in_s: float | None = None
    consecutive_failures: int = 0
    backoff_s: float | None = None
    gave_up_reason: str | None = None
    # The last config given up on and why, until it is tried again (engine/status.py).
    failed_config_id: str | None = None
    failed_reason: str | None = None
    spec_error: str | None = None
    record_error: str | None = None
    port_note: str | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    max_concurrency_len: int | None = None
    metrics: EngineMetrics | None = None
    process: ProcessInfo | None = None
    spec: dict[str, Any] = Field(default_factory=dict)  # the engine's spec as EngineSpec dumps it
    log_path: str | None = None
    gateway_url: str | None = None
    window: int | None = None
    controller: ControllerState | None = None
    mode: str | None = None
    mode_auto: bool = False
    kernel: str | None = None
    kernel_note: str | None = None
    kernel_usage: dict[str, Any] | None = None
    custom_kernel_refusal: str | None = None
    nodes: int | None = None  # how many nodes the engine spans, where it says so
    startup: StartupInfo | None = None
    # The flat figures (from `metrics`), kept at the top for scripts reading `status --json`.
    kv_cache_usage: float | None = None
    num_requests_running: float | None = None
    num_requests_waiting: float | None = None
    generation_tok_s: float | None = None
    prompt_tok_s: float | None = None
    p99_ttft_s: float | None = None
    p99_e2e_s: float | None = None
    p99_ttft_bounds_s: Bounds | None = None
    p99_e2e_bounds_s: Bounds | None = None
    p99_ttft_text: str | None = None
    p99_e2e_text: str | None = None
    metrics_stale: bool | None = None
    kernel_requested: str | None = None


class GpuInfo(WireModel):
    index: int | None = None
    name: str | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    utilization_gpu_pct: float | None = None
    utilization_memory_pct: float | None = None
    power_w: float | None = None
    temperature_c: float | None = None


class HostInfo(WireModel):
    """The host's gauges (engine/host.py HostSample); without a GPU, `gpus` is empty and
    `nvml_error` says why."""

    cpu_pct: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    gpus: list[GpuInfo] = Field(default_factory=list)
    nvml_available: bool = False
    nvml_error: str | None = None


class DaemonFacts(WireModel):
    """The status answer's word on the daemon that gave it."""

    pid: int | None = None
    version: str | None = None  # llmconsole's version
    time_s: float | None = None  # its wall clock when it answered: the console's charts' "now"
    warnings: list[str] = Field(default_factory=list)


class StatusAnswer(WireModel):
    """GET /v1/status."""

    wire_version: int = UNVERSIONED
    daemon: DaemonFacts = Field(default_factory=DaemonFacts)
    host: HostInfo = Field(default_factory=HostInfo)
    engines: list[EngineInfo] = Field(default_factory=list)

    def engine(self, name: str) -> EngineInfo | None:
        return next((e for e in self.engines if e.name == name), None)


class DaemonInfo(WireModel):
    """GET /v1/daemon: the daemon itself, and the wire it speaks."""

    wire_version: int = UNVERSIONED
    pid: int | None = None
    version: str | None = None
    data_dir: str | None = None
    socket: str | None = None
    uptime_s: float | None = None
    engines: int = 0
