"""The host as the daemon reported it: memory, CPU and each GPU (parsed as view.py parses the rest)."""

from __future__ import annotations

from dataclasses import dataclass
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
