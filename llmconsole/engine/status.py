"""Immutable snapshots of an engine's state, as the daemon reports them to the CLI and console."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from llmconsole.engine.host import ProcessSample
from llmconsole.engine.metrics.window import WindowedMetrics
from llmconsole.engine.startup_log import StartPhase


class EngineState(StrEnum):
    STARTING = "starting"  # launched, /health not yet 200
    READY = "ready"  # /health answers 200
    UNHEALTHY = "unhealthy"  # running, but /health failed at least once in a row
    CRASHED = "crashed"  # died unexpectedly; a restart is pending (backoff)
    STOPPING = "stopping"  # asked to stop: draining, then killed
    STOPPED = "stopped"  # stopped on request
    FAILED = "failed"  # given up: a fresh start failed, or the config is crash-looping
    INVALID = "invalid"  # its stored spec no longer validates (last_error says why): cannot start

    @property
    def running(self) -> bool:
        return self in (EngineState.STARTING, EngineState.READY, EngineState.UNHEALTHY, EngineState.STOPPING)


@dataclass(frozen=True)
class EngineStatus:
    name: str
    state: EngineState
    config_id: str
    model: str
    served_model_name: str
    device: str
    pid: int | None = None
    port: int | None = None
    url: str | None = None
    restarts: int = 0
    crash_looping: bool = False
    adopted: bool = False
    started_at_s: float | None = None  # wall clock (time.time) of the current run's launch
    ready_at_s: float | None = None
    uptime_s: float | None = None  # since ready
    last_exit_code: int | None = None
    last_error: str | None = None
    next_restart_in_s: float | None = None
    consecutive_failures: int = 0  # runs in a row that ended before they were stable
    backoff_s: float | None = None  # the delay before the pending restart (state crashed)
    gave_up_reason: str | None = None  # why supervision stopped restarting it (state failed)
    # The last config supervision gave up on and why (its last_error then): kept through the
    # rollback that follows, so whoever waited for that config reads the same failure whether it
    # looked before the rollback or after.
    failed_config_id: str | None = None
    failed_reason: str | None = None
    spec_error: str | None = None  # the stored spec no longer validates: it cannot be (re)started
    record_error: str | None = None  # the state file could not be written: this record is not saved
    # The port picked for it (none was asked for) was taken and it moved: from where, to where,
    # when, and who must be told (other hosts' groups keep the old URL).
    port_note: str | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    max_concurrency_len: int | None = None
    metrics: WindowedMetrics | None = None
    process: ProcessSample | None = None
    spec: dict[str, Any] = field(default_factory=dict)
    log_path: str | None = None
    gateway_url: str | None = None  # the engine group's door at the gateway: clients use it
    window: int | None = None  # the group's admission window now
    controller: dict[str, Any] | None = None  # the window controller's settings, state and trace
    mode: str | None = None  # memory mode read from the spec (performance|balanced|aggressive)
    mode_auto: bool = False  # the auto policy picks the mode
    # The decode attention the engine reports it runs (its own log: kernels/usage.py), never the
    # spec's wish: "custom", "stock", or None while it has not said. kernel_note says why it differs
    # from the spec's; kernel_usage holds the engine's latest counters of a custom kernel.
    kernel: str | None = None
    kernel_note: str | None = None
    kernel_usage: dict[str, Any] | None = None
    custom_kernel_refusal: str | None = None  # why `kernel: custom` cannot run on this runtime; None: it can
    # How far a start has come, as its log says (state starting only): read by the scraper as the
    # log grows. The control API shows it as "startup" (daemon/services/startup.py), not here.
    start_phase: StartPhase | None = None

    def aged(self, elapsed_s: float) -> EngineStatus:
        """This snapshot `elapsed_s` after it was taken: the fields that run with the clock moved
        on (uptime grows, the backoff counts down), the rest as published. The status board reads
        through this, so a supervisor publishes on change only, never to keep a clock current."""
        if elapsed_s <= 0 or (self.uptime_s is None and self.next_restart_in_s is None):
            return self
        return dataclasses.replace(
            self,
            uptime_s=None if self.uptime_s is None else self.uptime_s + elapsed_s,
            next_restart_in_s=None if self.next_restart_in_s is None else max(0.0, self.next_restart_in_s - elapsed_s),
        )

    def to_json(self) -> dict[str, Any]:
        """The status as JSON. The flat keys at the top are the stable CLI contract."""
        d = dataclasses.asdict(self)
        del d["start_phase"]
        d["state"] = str(self.state)
        m = self.metrics
        d.update(
            kv_cache_usage=m.kv_cache_usage if m else None,
            num_requests_running=m.running if m else None,
            num_requests_waiting=m.waiting if m else None,
            generation_tok_s=m.generation_tok_s if m else None,
            prompt_tok_s=m.prompt_tok_s if m else None,
            # histogram_quantile's interpolation inside the bucket (kept for older clients); the
            # bucket itself is beside it: what a person should read (metrics/percentile.py).
            p99_ttft_s=m.p99_ttft_s if m else None,
            p99_e2e_s=m.p99_e2e_s if m else None,
            p99_ttft_bounds_s=m.percentile_bounds.get("p99_ttft_s") if m else None,
            p99_e2e_bounds_s=m.percentile_bounds.get("p99_e2e_s") if m else None,
            p99_ttft_text=_pct_text(m, "p99_ttft_s"),
            p99_e2e_text=_pct_text(m, "p99_e2e_s"),
            metrics_stale=m.stale if m else None,
            kernel_requested=self.spec.get("kernel", "stock"),
        )
        return d


def _pct_text(m: WindowedMetrics | None, key: str) -> str | None:
    p = m.percentile(key) if m is not None else None
    return p.text() if p is not None and p.lower_s != p.upper_s else None
