"""The host as the daemon reported it: memory, CPU and each GPU (parsed as view.py parses the rest),
and, in a console over several hosts, each host's section: its figures and whether it answers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _int(value: Any) -> int | None:
    n = _num(value)
    return None if n is None else int(n)


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _dict(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, dict) else {}


@dataclass(frozen=True)
class GpuView:
    index: int | None
    name: str | None
    memory_used_bytes: float | None
    memory_total_bytes: float | None
    utilization_gpu_pct: float | None

    @classmethod
    def parse(cls, d: Any) -> GpuView:
        d = _dict(d)
        return cls(
            _int(d.get("index")),
            _str(d.get("name")),
            _num(d.get("memory_used_bytes")),
            _num(d.get("memory_total_bytes")),
            _num(d.get("utilization_gpu_pct")),
        )


@dataclass(frozen=True)
class HostView:
    cpu_pct: float | None = None
    memory_used_bytes: float | None = None
    memory_total_bytes: float | None = None
    gpus: tuple[GpuView, ...] = ()
    nvml_error: str | None = None

    @classmethod
    def parse(cls, d: Any) -> HostView:
        d = _dict(d)
        gpus = d.get("gpus")
        return cls(
            cpu_pct=_num(d.get("cpu_pct")),
            memory_used_bytes=_num(d.get("memory_used_bytes")),
            memory_total_bytes=_num(d.get("memory_total_bytes")),
            gpus=tuple(GpuView.parse(g) for g in gpus) if isinstance(gpus, list) else (),
            nvml_error=_str(d.get("nvml_error")),
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


@dataclass(frozen=True)
class HostSection:
    """One host of a console over several (tui/fleet.py merges their answers): its figures as its
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

    @classmethod
    def parse(cls, d: Any) -> HostSection:
        d = _dict(d)
        daemon = _dict(d.get("daemon"))
        return cls(
            name=_str(d.get("name")) or "?",
            label=_str(d.get("label")) or _str(d.get("name")) or "?",
            local=d.get("local") is True,
            reachable=d.get("reachable") is not False,
            error=_str(d.get("error")),
            retry_in_s=_num(d.get("retry_in_s")),
            age_s=_num(d.get("age_s")),
            waiting_s=_num(d.get("waiting_s")),
            seen=d.get("seen") is True,
            version=_str(daemon.get("version")),
            engines=_int(d.get("engines")) or 0,
            host=HostView.parse(d.get("host")),
        )

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
