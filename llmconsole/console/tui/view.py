"""Immutable views of what the daemon reported, and the one place that turns values into text.

The daemon's status JSON is parsed once per poll into frozen views. Parsing never raises on a
missing or odd value: the value becomes None, and None prints as "N/A" everywhere. Nothing here
reads a clock, so a recorded status stream renders the same on every run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from llmconsole.console.tui.view_host import GpuView as GpuView  # the host's views, re-exported
from llmconsole.console.tui.view_host import HostSection as HostSection
from llmconsole.console.tui.view_host import HostView as HostView

NA = "N/A"

RUNNING_STATES = frozenset({"starting", "ready", "unhealthy", "stopping"})
STARTABLE_STATES = frozenset({"stopped", "failed", "invalid"})
STOPPABLE_STATES = frozenset({"starting", "ready", "unhealthy", "crashed"})
RESTARTABLE_STATES = frozenset({"starting", "ready", "unhealthy", "crashed", "failed"})


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _int(value: Any) -> int | None:
    n = _num(value)
    return None if n is None else int(n)


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _dict(value: Any) -> Mapping[str, Any]:
    return MappingProxyType(dict(value)) if isinstance(value, dict) else MappingProxyType({})


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
    def parse(cls, d: Any) -> ControllerView | None:
        if not isinstance(d, dict):
            return None
        trace = [t for t in d.get("trace") or () if isinstance(t, dict)]
        steps = tuple(
            (at, w, _num(t.get("target_ms")), _num(t.get("measured_ms")))
            for t in trace
            if (at := _num(t.get("at_s"))) is not None and (w := _int(t.get("window"))) is not None
        )
        return cls(
            window=_int(d.get("window")),
            frozen=d.get("frozen") is True,
            signal=_str(d.get("signal")),
            target_ms=_num(d.get("target_ms")),
            min_window=_int(d.get("min_window")),
            max_window=_int(d.get("max_window")),
            in_flight=_int(d.get("in_flight")),
            queued=_int(d.get("queued")),
            steps=steps,
            recent_ok=_int(d.get("recent_ok")),
            recent_streamed=_int(d.get("recent_streamed")),
            action=_str(trace[-1].get("action")) if trace else None,
        )

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
    def parse(cls, d: Any) -> StartupView | None:
        if not isinstance(d, dict) or not _str(d.get("phase")):
            return None
        return cls(
            str(d["phase"]),
            _int(d.get("step")) or 0,
            _int(d.get("steps")) or 1,
            _num(d.get("elapsed_s")),
            _num(d.get("expected_s")),
        )


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
    metrics: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
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
    def parse(cls, d: Any) -> EngineView:
        d = _dict(d)
        spec = _dict(d.get("spec"))
        model = _str(d.get("served_model_name")) or _str(d.get("model"))
        proc = _dict(d.get("process"))
        return cls(
            name=_str(d.get("name")) or "?",
            state=_str(d.get("state")) or "unknown",
            model=Path(model).name if model else NA,
            config_id=_str(d.get("config_id")) or NA,
            restarts=_int(d.get("restarts")),
            crash_looping=d.get("crash_looping") is True,
            uptime_s=_num(d.get("uptime_s")),
            url=_str(d.get("url")),
            pid=_int(d.get("pid")),
            kernel=_str(d.get("kernel")) or ("-" if "kernel" in d else _str(spec.get("kernel")) or "stock"),
            kernel_note=_str(d.get("kernel_note")),
            last_error=_str(d.get("last_error")),
            last_exit_code=_int(d.get("last_exit_code")),
            next_restart_in_s=_num(d.get("next_restart_in_s")),
            kv_cache_tokens=_int(d.get("kv_cache_tokens")),
            max_concurrency=_num(d.get("max_concurrency")),
            max_concurrency_len=_int(d.get("max_concurrency_len")),
            metrics=_dict(d.get("metrics")),
            rss_bytes=_num(proc.get("rss_bytes")),
            cpu_pct=_num(proc.get("cpu_pct")),
            spec=spec,
            gateway_url=_str(d.get("gateway_url")),
            controller=ControllerView.parse(d.get("controller")),
            mode=_str(d.get("mode")),
            mode_auto=d.get("mode_auto") is True,
            started_at_s=_num(d.get("started_at_s")),
            ready_at_s=_num(d.get("ready_at_s")),
            startup=StartupView.parse(d.get("startup")),
            host=_str(d.get("host")),
        )

    def metric(self, key: str) -> float | None:
        return _num(self.metrics.get(key))

    @property
    def metrics_taken_at_s(self) -> float | None:
        return self.metric("taken_at_s")

    @property
    def metrics_stale(self) -> bool:
        return self.metrics.get("stale") is True

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
    """One status answer of the daemon, parsed."""

    daemon_pid: int | None = None
    daemon_version: str | None = None
    time_s: float | None = None  # the daemon's wall clock when it answered: charts' "now"
    host: HostView = field(default_factory=HostView)
    engines: tuple[EngineView, ...] = ()
    hosts: tuple[HostSection, ...] = ()  # a console over several hosts: each one; else none

    @classmethod
    def parse(cls, d: Any) -> Snapshot:
        d = _dict(d)
        daemon = _dict(d.get("daemon"))
        engines, hosts = d.get("engines"), d.get("hosts")
        return cls(
            daemon_pid=_int(daemon.get("pid")),
            daemon_version=_str(daemon.get("version")),
            time_s=_num(daemon.get("time_s")),
            host=HostView.parse(d.get("host")),
            engines=tuple(EngineView.parse(e) for e in engines) if isinstance(engines, list) else (),
            hosts=tuple(HostSection.parse(h) for h in hosts) if isinstance(hosts, list) else (),
        )

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
