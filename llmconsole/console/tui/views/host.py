"""The host as the daemon reported it: memory, CPU and each GPU (read through the wire's models, as
views/status.py reads the rest), and, in a console over several hosts, each host's section: its figures,
whether it answers and which wire its daemon speaks."""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import Field

from llmconsole.wire import version_note
from llmconsole.wire.base import WireModel
from llmconsole.wire.status import DaemonFacts, EngineInfo, GpuInfo, HostInfo, StatusAnswer


@dataclass(frozen=True)
class GpuView:
    index: int | None
    name: str | None
    memory_used_bytes: float | None
    memory_total_bytes: float | None
    utilization_gpu_pct: float | None

    @classmethod
    def from_wire(cls, g: GpuInfo) -> GpuView:
        return cls(g.index, g.name or None, g.memory_used_bytes, g.memory_total_bytes, g.utilization_gpu_pct)


@dataclass(frozen=True)
class HostView:
    cpu_pct: float | None = None
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    gpus: tuple[GpuView, ...] = ()
    nvml_error: str | None = None

    @classmethod
    def from_wire(cls, h: HostInfo) -> HostView:
        return cls(
            cpu_pct=h.cpu_pct,
            memory_used_bytes=h.memory_used_bytes,
            memory_total_bytes=h.memory_total_bytes,
            gpus=tuple(GpuView.from_wire(g) for g in h.gpus),
            nvml_error=h.nvml_error or None,
        )

    @property
    def memory_fraction(self) -> float | None:
        if self.memory_used_bytes is None or not self.memory_total_bytes:
            return None
        return self.memory_used_bytes / self.memory_total_bytes

    @property
    def gpu_memory(self) -> tuple[float | None, float | None]:
        """(used, total) bytes over every GPU that reports both."""
        pairs = [
            (g.memory_used_bytes, g.memory_total_bytes)
            for g in self.gpus
            if g.memory_used_bytes is not None and g.memory_total_bytes
        ]
        if not pairs:
            return None, None
        return sum(p[0] for p in pairs), sum(p[1] for p in pairs)

    @property
    def gpu_utilization_pct(self) -> float | None:
        vals = [g.utilization_gpu_pct for g in self.gpus if g.utilization_gpu_pct is not None]
        return sum(vals) / len(vals) if vals else None


SLOW_S = 3.0  # a host whose poll has been unanswered this long is shown as slow, with its last figures


class HostSectionFrame(WireModel):
    """A host's section as a console over several hosts merges it (tui/sources/merge.py): not a daemon's
    answer, but read with the wire's tolerance, as a recording of it may come from an older
    console."""

    name: str = "?"
    label: str | None = None
    local: bool = False
    reachable: bool = True
    error: str | None = None
    retry_in_s: float | None = None
    age_s: float | None = None
    waiting_s: float | None = None
    seen: bool = False
    daemon: DaemonFacts | None = None
    wire_version: int | None = None  # the wire its daemon spoke in its newest answer
    engines: int = 0
    host: HostInfo = Field(default_factory=HostInfo)


class FleetEngine(EngineInfo):
    """An engine in a console over several hosts: named ENGINE@HOST, with its host beside."""

    host: str | None = None


class ConsoleStatus(StatusAnswer):
    """What the console polls: a daemon's status answer, or, in a console over several hosts, the
    merged one (tui/sources/merge.py) with each host's section."""

    engines: list[FleetEngine] = Field(default_factory=list)  # type: ignore[assignment]
    hosts: list[HostSectionFrame] = Field(default_factory=list)


@dataclass(frozen=True)
class HostSection:
    """One host of a console over several (tui/sources/merge.py merges their answers): its figures as its
    daemon last reported them, and how it fares now."""

    name: str
    label: str
    local: bool = False
    reachable: bool = True
    error: str | None = None  # why the newest poll brought no status: ssh's reason, no daemon, ...
    retry_in_s: float | None = None  # backing off: the next attempt in so many seconds
    age_s: float | None = None  # since its last status came
    waiting_s: float | None = None  # a poll of it has been unanswered this long
    seen: bool = False  # it answered at least once: its engines are listed as last seen
    version: str | None = None
    engines: int = 0
    host: HostView = field(default_factory=HostView)
    wire_version: int | None = None  # the wire its daemon speaks; None before it answered

    @classmethod
    def from_wire(cls, d: HostSectionFrame) -> HostSection:
        return cls(
            name=d.name or "?",
            label=d.label or d.name or "?",
            local=d.local,
            reachable=d.reachable,
            error=d.error or None,
            retry_in_s=d.retry_in_s,
            age_s=d.age_s,
            waiting_s=d.waiting_s,
            seen=d.seen,
            version=(d.daemon.version or None) if d.daemon is not None else None,
            engines=d.engines,
            host=HostView.from_wire(d.host),
            wire_version=d.wire_version,
        )

    @property
    def wire_note(self) -> str | None:
        """Its daemon speaks another wire than this console (a line for the host's view), or None."""
        if self.wire_version is None:
            return None
        return version_note(self.name, self.wire_version, self.version)

    @property
    def current(self) -> bool:
        """Its figures are from the newest poll (not an old answer of a host now down or slow)."""
        return self.seen and self.error is None and not self.slow

    @property
    def slow(self) -> bool:
        return self.waiting_s is not None and self.waiting_s >= SLOW_S

    @property
    def state(self) -> str:
        if not self.reachable:
            return "unreachable"
        if self.error is not None:
            return "no daemon" if "no llmconsole daemon" in self.error else "not answering"
        if self.slow:
            return "slow"
        return "up" if self.seen else "connecting"
