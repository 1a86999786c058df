"""Immutable views of what the daemon reported, and the one place that turns values into text.

The daemon's status is read once per poll through the wire's models (llmconsole/wire), whatever
wire version the daemon speaks, into frozen views. Reading never raises on a missing or odd value:
the value takes its default (mostly None), and None prints as "N/A" everywhere. Nothing here reads
a clock, so a recorded status stream renders the same on every run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from llmconsole.console.tui.views.host import ConsoleStatus, FleetEngine
from llmconsole.console.tui.views.host import GpuView as GpuView  # the host's views, re-exported
from llmconsole.console.tui.views.host import HostSection as HostSection
from llmconsole.console.tui.views.host import HostView as HostView
from llmconsole.engine.metrics.percentile import percentile_text
from llmconsole.engine.status import EngineState
from llmconsole.wire import UNVERSIONED, version_note
from llmconsole.wire.status import ControllerState, EngineInfo, EngineMetrics, StartupInfo

NA = "N/A"

RUNNING_STATES = frozenset(s for s in EngineState if s.running)
STARTABLE_STATES = frozenset({EngineState.STOPPED, EngineState.FAILED, EngineState.INVALID})
STOPPABLE_STATES = frozenset({EngineState.STARTING, EngineState.READY, EngineState.UNHEALTHY, EngineState.CRASHED})
RESTARTABLE_STATES = STOPPABLE_STATES | {EngineState.FAILED}


# --- text -----------------------------------------------------------------------------------


def na(value: Any, fmt: str = "{}") -> str:
    return NA if value is None else fmt.format(value)


def fmt_ms(seconds: float | None) -> str:
    if seconds is None:
        return NA
    ms = seconds * 1000.0
    return f"{ms:.1f} ms" if ms < 10 else f"{ms:.0f} ms"


def fmt_rate(tok_s: float | None) -> str:
    if tok_s is None:
        return NA
    return f"{tok_s:.1f}" if tok_s < 100 else f"{tok_s:.0f}"


def fmt_pct(fraction: float | None) -> str:
    return NA if fraction is None else f"{100.0 * fraction:.0f}%"


def fmt_bytes(n: float | None) -> str:
    if n is None:
        return NA
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def fmt_count(n: float | None) -> str:
    return NA if n is None else f"{n:.0f}"


def fmt_uptime(seconds: float | None) -> str:
    """Uptime as the daemon measured it: the console never reads its own clock for it."""
    if seconds is None:
        return NA
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86400}d{(s % 86400) // 3600:02d}h"


# --- views ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ControllerView:
    """The engine group's batch window at the gateway and its controller's newest steps."""

    window: int | None = None
    frozen: bool = False
    signal: str | None = None
    target_ms: float | None = None
    min_window: int | None = None
    max_window: int | None = None
    in_flight: int | None = None
    queued: int | None = None
    # The controller's newest steps, oldest first: (at_s wall clock, window, target ms, measured ms).
    steps: tuple[tuple[float, int, float | None, float | None], ...] = ()
    recent_ok: int | None = None  # of the group's newest requests, those that succeeded,
    recent_streamed: int | None = None  # and of them those streamed (a TTFT comes only from streams)
    action: str | None = None  # what the newest step did (step, hold-idle, frozen, ...)

    @classmethod
    def from_wire(cls, c: ControllerState | None) -> ControllerView | None:
        if c is None:
            return None
        steps = tuple(
            (t.at_s, t.window, t.target_ms, t.measured_ms)
            for t in c.trace
            if t.at_s is not None and t.window is not None
        )
        return cls(
            window=c.window,
            frozen=c.frozen,
            signal=c.signal or None,
            target_ms=c.target_ms,
            min_window=c.min_window,
            max_window=c.max_window,
            in_flight=c.in_flight,
            queued=c.queued,
            steps=steps,
            recent_ok=c.recent_ok,
            recent_streamed=c.recent_streamed,
            action=(c.trace[-1].action or None) if c.trace else None,
        )

    @classmethod
    def parse(cls, d: object) -> ControllerView | None:
        """An engine's `controller` as JSON (a test's, a recording's); anything but an object is none."""
        return cls.from_wire(ControllerState.model_validate(d)) if isinstance(d, dict) else None

    @property
    def windows(self) -> tuple[int, ...]:
        return tuple(s[1] for s in self.steps)

    @property
    def measured_now_ms(self) -> float | None:
        """The newest step's measurement: None when the signal has no samples now (never an old value)."""
        return self.steps[-1][3] if self.steps else None


@dataclass(frozen=True)
class StartupView:
    """How far a starting engine is, as the daemon read it from its log."""

    phase: str
    step: int
    steps: int
    elapsed_s: float | None
    expected_s: float | None  # how long its last start took; None for a first start

    @classmethod
    def from_wire(cls, d: StartupInfo | None) -> StartupView | None:
        if d is None or not d.phase:
            return None
        return cls(d.phase, d.step, d.steps or 1, d.elapsed_s, d.expected_s)


@dataclass(frozen=True)
class EngineView:
    name: str
    state: str
    model: str
    config_id: str
    restarts: int | None = None
    crash_looping: bool = False
    uptime_s: float | None = None
    url: str | None = None
    pid: int | None = None
    kernel: str = "stock"  # what the engine reports it runs; "-" while it has not said
    kernel_note: str | None = None  # why that differs from the spec's kernel
    last_error: str | None = None
    last_exit_code: int | None = None
    next_restart_in_s: float | None = None
    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    max_concurrency_len: int | None = None
    metrics: EngineMetrics | None = None
    rss_bytes: float | None = None
    cpu_pct: float | None = None
    spec: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    gateway_url: str | None = None
    controller: ControllerView | None = None
    mode: str | None = None  # memory mode (performance|balanced|aggressive), None if set by hand
    mode_auto: bool = False
    started_at_s: float | None = None  # wall clock of the current run's launch, and of its ready
    ready_at_s: float | None = None
    startup: StartupView | None = None
    host: str | None = None  # its host, in a console over several (the name is then ENGINE@HOST)

    @classmethod
    def from_wire(cls, e: EngineInfo, host: str | None = None) -> EngineView:
        spec = e.spec
        model = e.served_model_name or e.model
        proc = e.process
        spec_kernel = spec.get("kernel")
        # A daemon that reports kernels says "-" until the engine has said; an older one never
        # does, and then the spec's wish is all there is.
        kernel = e.kernel or ("-" if "kernel" in e.model_fields_set else None)
        return cls(
            name=e.name or "?",
            state=e.state or "unknown",
            model=Path(model).name if model else NA,
            config_id=e.config_id or NA,
            restarts=e.restarts,
            crash_looping=e.crash_looping,
            uptime_s=e.uptime_s,
            url=e.url or None,
            pid=e.pid,
            kernel=kernel or (spec_kernel if isinstance(spec_kernel, str) and spec_kernel else "stock"),
            kernel_note=e.kernel_note or None,
            last_error=e.last_error or None,
            last_exit_code=e.last_exit_code,
            next_restart_in_s=e.next_restart_in_s,
            kv_cache_tokens=e.kv_cache_tokens,
            max_concurrency=e.max_concurrency,
            max_concurrency_len=e.max_concurrency_len,
            metrics=e.metrics,
            rss_bytes=None if proc is None or proc.rss_bytes is None else float(proc.rss_bytes),
            cpu_pct=None if proc is None else proc.cpu_pct,
            spec=MappingProxyType(dict(spec)),
            gateway_url=e.gateway_url or None,
            controller=ControllerView.from_wire(e.controller),
            mode=e.mode or None,
            mode_auto=e.mode_auto,
            started_at_s=e.started_at_s,
            ready_at_s=e.ready_at_s,
            startup=StartupView.from_wire(e.startup),
            host=host or None,
        )

    @classmethod
    def parse(cls, d: object) -> EngineView:
        """One engine's status as JSON (a test's, a recording's), through the wire's model."""
        e = FleetEngine.model_validate(d if isinstance(d, dict) else {})
        return cls.from_wire(e, e.host)

    def metric(self, key: str) -> float | None:
        return self.metrics.figure(key) if self.metrics is not None else None

    def percentile_text(self, key: str, na: str = NA, compact: bool = False) -> str:
        """What a person reads for a percentile: its bucket, or the bare figure of an older daemon."""
        if self.metrics is None:
            return na
        return percentile_text(self.metrics.model_dump(), key, na, compact=compact)

    @property
    def metrics_taken_at_s(self) -> float | None:
        return self.metric("taken_at_s")

    @property
    def metrics_stale(self) -> bool:
        return self.metrics is not None and self.metrics.stale

    @property
    def last_start_s(self) -> float | None:
        """How long the current run took to become ready (a sweep's or a switch's restart costs that)."""
        if self.started_at_s is None or self.ready_at_s is None:
            return None
        return max(0.0, self.ready_at_s - self.started_at_s)

    @property
    def state_text(self) -> str:
        return self.state + (" (crash loop)" if self.crash_looping else "")

    @property
    def running(self) -> bool:
        return self.state in RUNNING_STATES

    def can(self, verb: str) -> bool:
        allowed = {"start": STARTABLE_STATES, "stop": STOPPABLE_STATES, "restart": RESTARTABLE_STATES}
        return self.state in allowed.get(verb, frozenset())


@dataclass(frozen=True)
class Snapshot:
    """One status answer of the daemon, read through the wire's models."""

    daemon_pid: int | None = None
    daemon_version: str | None = None
    time_s: float | None = None  # the daemon's wall clock when it answered: charts' "now"
    host: HostView = field(default_factory=HostView)
    engines: tuple[EngineView, ...] = ()
    hosts: tuple[HostSection, ...] = ()  # a console over several hosts: each one; else none
    wire_version: int = UNVERSIONED  # the wire the daemon spoke (one host's console)

    @classmethod
    def from_wire(cls, d: ConsoleStatus) -> Snapshot:
        return cls(
            daemon_pid=d.daemon.pid,
            daemon_version=d.daemon.version or None,
            time_s=d.daemon.time_s,
            host=HostView.from_wire(d.host),
            engines=tuple(EngineView.from_wire(e, e.host) for e in d.engines),
            hosts=tuple(HostSection.from_wire(h) for h in d.hosts),
            wire_version=d.wire_version,
        )

    @classmethod
    def parse(cls, d: object) -> Snapshot:
        """A status as it came (a poll's, a recording's frame); anything but an object is empty."""
        return cls.from_wire(ConsoleStatus.model_validate(d if isinstance(d, dict) else {}))

    @property
    def wire_note(self) -> str | None:
        """The daemon speaks another wire than this console: one line that says so, else None.
        Over several hosts each host's section says its own."""
        if self.hosts:
            return None
        return version_note("the daemon", self.wire_version, self.daemon_version)

    def engine(self, name: str | None) -> EngineView | None:
        return next((e for e in self.engines if e.name == name), None)

    def section(self, host: str | None) -> HostSection | None:
        return next((h for h in self.hosts if h.name == host), None)

    def host_of(self, engine: EngineView | None) -> HostView:
        """The figures of the host `engine` runs on: its own host's in a console over several."""
        s = self.section(engine.host) if engine is not None else None
        return s.host if s is not None else self.host

    def unreachable(self, engine: EngineView | None) -> str | None:
        """Why commands cannot reach `engine`'s host now (its host does not answer), or None."""
        s = self.section(engine.host) if engine is not None else None
        if s is None or s.current:
            return None
        return f"host {s.name} is {s.state}" + (f": {s.error}" if s.error else "")

    @property
    def serving(self) -> tuple[EngineView, ...]:
        return tuple(e for e in self.engines if e.running or e.state == "crashed")


@dataclass(frozen=True)
class LogChunk:
    """A piece of an engine's log as the daemon returned it."""

    name: str
    text: str
    offset: int  # where the next read should start
    size: int
    from_offset: int | None  # None: this is the tail, not a continuation
