"""What a sweep watches beside the load: the engine's KV cache and preemptions, its memory and
utilization, sampled while a run is in flight.

KV usage and preemptions come from the engine's own /metrics. Memory and utilization come from
the controller (the daemon knows the engine's process tree and the GPUs): host RSS on CPU
engines, NVML on GPU hosts. A figure nobody can give is None with a reason, never a zero.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from llmconsole.engine.metrics.page import MetricsParseError, parse_metrics


@dataclass(frozen=True)
class ResourceSample:
    memory_bytes: int | None
    memory_source: str  # "host RSS of the engine's processes", "GPU memory (NVML)"
    compute_util: float | None = None  # 0..1
    bandwidth_util: float | None = None
    util_na_reason: str | None = None  # why the utilizations are None
    memory_na_reason: str | None = None


def resource_sample(engine: dict[str, Any], host: dict[str, Any]) -> ResourceSample:
    """What the engine uses now, from the daemon's status of it and of its host (as the control
    API reports them): GPU memory and utilization through NVML on a GPU engine, else the host RSS
    of the engine's processes, with the reason for every figure nobody can give."""
    gpus = host.get("gpus") or []
    if engine.get("device") not in (None, "cpu") and gpus:
        used = [g["memory_used_bytes"] for g in gpus if g.get("memory_used_bytes") is not None]
        comp = [g["utilization_gpu_pct"] for g in gpus if g.get("utilization_gpu_pct") is not None]
        bw = [g["utilization_memory_pct"] for g in gpus if g.get("utilization_memory_pct") is not None]
        return ResourceSample(
            sum(used) if used else None,
            "GPU memory in use (NVML, all GPUs)",
            sum(comp) / len(comp) / 100 if comp else None,
            sum(bw) / len(bw) / 100 if bw else None,
            None if comp else "NVML gave no utilization rates",
            None if used else "NVML gave no memory figures",
        )
    proc = engine.get("process") or {}
    why = host.get("nvml_error") or "no NVIDIA GPU"
    return ResourceSample(
        proc.get("rss_bytes"),
        "host RSS of the engine's processes",
        None,
        None,
        f"CPU engine: NVML reports compute and memory-bandwidth utilization only for GPUs ({why})",
        None if proc.get("rss_bytes") is not None else "the daemon has no process sample for the engine",
    )


@dataclass(frozen=True)
class ProbeFigures:
    peak_kv_usage: float | None
    preemptions: int | None
    memory_bytes: int | None  # the peak seen during the run
    memory_source: str | None
    compute_util: float | None  # the mean over the run
    bandwidth_util: float | None
    util_na_reason: str | None
    memory_na_reason: str | None


class RunProbe:
    """Samples /metrics and resources until stopped; `figures()` sums them up for one run."""

    def __init__(
        self,
        url: str,
        resources: Callable[[], Awaitable[ResourceSample]] | None,
        metrics_period_s: float = 0.5,
        resources_period_s: float = 1.0,
    ):
        self.url = url.rstrip("/") + "/metrics"
        self.resources = resources
        self.metrics_period_s = metrics_period_s
        self.resources_period_s = resources_period_s
        self.kv: list[float] = []
        self.preempt_first: float | None = None
        self.preempt_last: float | None = None
        self.samples: list[ResourceSample] = []
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> RunProbe:
        import aiohttp  # here, not at the top: the CLI imports this module with every command

        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))
        await self._scrape()  # the baseline for the preemption counter
        self._tasks = [asyncio.ensure_future(self._loop(self._scrape, self.metrics_period_s))]
        if self.resources is not None:
            self._tasks.append(asyncio.ensure_future(self._loop(self._sample, self.resources_period_s)))
        return self

    async def __aexit__(self, *exc: object) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        try:
            await asyncio.wait_for(self._scrape(), timeout=5)  # the counter after the last request
            if self.resources is not None and not self.samples:
                await self._sample()
        finally:
            await self._session.close()

    @staticmethod
    async def _loop(fn: Callable[[], Awaitable[None]], period_s: float) -> None:
        while True:
            began = time.monotonic()
            await fn()
            await asyncio.sleep(max(0.0, period_s - (time.monotonic() - began)))

    async def _scrape(self) -> None:
        import aiohttp

        try:
            async with self._session.get(self.url) as r:
                text = await r.text()
            m = parse_metrics(text, time.monotonic())
        except (TimeoutError, aiohttp.ClientError, MetricsParseError, OSError):
            return  # a missed scrape is a gap, not a failure of the run
        if m.kv_cache_usage is not None:
            self.kv.append(m.kv_cache_usage)
        if m.preemptions_total is not None:
            if self.preempt_first is None:
                self.preempt_first = m.preemptions_total
            self.preempt_last = m.preemptions_total

    async def _sample(self) -> None:
        if self.resources is None:
            return
        try:
            self.samples.append(await self.resources())
        except Exception:  # a missing value is a value: the figures say N/A
            pass

    def figures(self) -> ProbeFigures:
        s = self.samples
        mem = [x.memory_bytes for x in s if x.memory_bytes is not None]
        comp = [x.compute_util for x in s if x.compute_util is not None]
        bw = [x.bandwidth_util for x in s if x.bandwidth_util is not None]
        reason = next((x.util_na_reason for x in s if x.util_na_reason), None)
        mem_reason = next((x.memory_na_reason for x in s if x.memory_na_reason), None)
        if not s:
            reason = mem_reason = "no resource samples (the controller gave none)"
        preempt = None
        if self.preempt_first is not None and self.preempt_last is not None:
            preempt = max(0, int(round(self.preempt_last - self.preempt_first)))
        return ProbeFigures(
            peak_kv_usage=max(self.kv) if self.kv else None,
            preemptions=preempt,
            memory_bytes=max(mem) if mem else None,
            memory_source=s[0].memory_source if s else None,
            compute_util=statistics.fmean(comp) if comp else None,
            bandwidth_util=statistics.fmean(bw) if bw else None,
            util_na_reason=None if comp else reason,
            memory_na_reason=None if mem else mem_reason,
        )
