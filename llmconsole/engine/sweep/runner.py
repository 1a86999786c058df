"""The mini sweep runner: restart the engine on each server point, load it at each level,
repeat, apply the stop rules, and put the engine back the way it was.

The engine is driven through an injected `EngineController` (the daemon in the CLI and the
console; anything else in tests), so the core never imports the console. Whatever happens (a
config that fails to start, an error, Ctrl-C), the original config is restored before `run`
returns or raises. Progress goes out as immutable `SweepProgress` events.
"""

from __future__ import annotations

import asyncio
import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from llmconsole.engine.audit import AuditStore
from llmconsole.engine.load.generator import LoadSummary, run_load
from llmconsole.engine.load.workload import load_tokenizer, plan_requests
from llmconsole.engine.metrics.latency import Slo
from llmconsole.engine.sweep.plan import LoadLevel, PointResult, SweepPlan, SweepProgress
from llmconsole.engine.sweep.probe import ProbeFigures, ResourceSample, RunProbe

_LAT_KEYS = ("ttft", "tpot", "itl", "e2e")


@dataclass(frozen=True)
class EngineTarget:
    """Where a (re)started engine serves, and on what config."""

    url: str
    served_model_name: str
    model: str  # the model directory or hub name: its tokenizer builds the prompts
    config_id: str
    spec: dict[str, Any]  # the public config (no secrets)


class EngineStartFailed(RuntimeError):
    """The engine did not become ready on a point's config; the message is vLLM's reason."""


class EngineController(Protocol):
    async def current(self) -> EngineTarget: ...

    async def apply(self, overrides: dict[str, Any]) -> EngineTarget:
        """Restart the engine on its original spec with `overrides`, return once ready."""

    async def restore(self, original: EngineTarget) -> EngineTarget:
        """Restart the engine on the original spec, return once ready."""

    async def resources(self) -> ResourceSample: ...


class GatewayDoor(Protocol):
    async def gateway_url(self) -> str:
        """The engine's door at the gateway (a sweep `through_gateway` sends its load there)."""


@dataclass(frozen=True)
class SweepResult:
    plan: SweepPlan
    points: tuple[PointResult, ...]
    original: EngineTarget
    status: str  # done | failed | cancelled
    started_at_s: float
    finished_at_s: float
    restored: bool
    restore_error: str | None = None
    error: str | None = None
    sweep_id: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


ProgressFn = Callable[[SweepProgress], None]


def _median(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return statistics.median(vals) if vals else None


def _spread(xs: Sequence[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    if len(vals) < 2:
        return None
    m = statistics.median(vals)
    return (max(vals) - min(vals)) / m if m else None


def _latencies(s: LoadSummary) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for k in _LAT_KEYS:
        st = s.latency(k)
        out.update(
            {
                f"mean_{k}": st.mean_ms,
                f"p50_{k}": st.median_ms,
                f"p90_{k}": st.p90_ms,
                f"p99_{k}": st.p99_ms,
                f"p100_{k}": st.max_ms,
            }
        )
    return out


def slo_misses(slo: Slo, latency_ms: dict[str, float | None]) -> list[str]:
    out = []
    for t in slo.targets:
        v = latency_ms.get(f"p{t.percentile:g}_{t.metric}")
        if v is None:
            out.append(f"{t.key}: not measured")
        elif v > t.limit_ms:
            out.append(f"{t.key} {v:.0f} > {t.limit_ms:g}")
    return out


def aggregate(
    plan: SweepPlan,
    index: int,
    server: dict[str, Any],
    load: LoadLevel,
    config_id: str | None,
    runs: list[tuple[LoadSummary, ProbeFigures]],
    note: str | None = None,
) -> PointResult:
    """Medians over the repeats of one point, its spread and flags, and its status by the rules."""
    sums = [s for s, _ in runs]
    probes = [p for _, p in runs]
    lat_runs = [_latencies(s) for s in sums]
    latency = {k: _median([r[k] for r in lat_runs]) for k in lat_runs[0]}
    thr = [s.request_throughput_req_s for s in sums]
    spread = {"throughput_req_s": _spread(thr), "p99_e2e_ms": _spread([r["p99_e2e"] for r in lat_runs])}
    flags = [
        f"wide spread: {k} varies {v:.0%} between repeats (limit {plan.spread_limit:.0%})"
        for k, v in spread.items()
        if v is not None and v > plan.spread_limit
    ]
    if note:
        flags.append(note)
    errors: dict[str, int] = {}
    for s in sums:
        for kind, n in s.errors_by_kind.items():
            errors[kind] = errors.get(kind, 0) + n
    error_rate = _median([s.error_rate for s in sums])
    misses = slo_misses(plan.slo, latency)
    status, reason = "ok", None
    if error_rate is not None and error_rate > plan.max_error_rate:
        kinds = ", ".join(f"{k}: {n}" for k, n in sorted(errors.items()))
        status, reason = "failed", f"error rate {error_rate:.0%} over the {plan.max_error_rate:.0%} limit ({kinds})"
    elif misses:
        status, reason = "slo_missed", "; ".join(misses)
    util_reason = next((p.util_na_reason for p in probes if p.util_na_reason), None)
    return PointResult(
        index=index,
        server=server,
        load=load,
        status=status,
        reason=reason,
        config_id=config_id,
        repeats=len(runs),
        throughput_req_s=_median(thr),
        throughput_tok_s=_median([s.output_throughput_tok_s for s in sums]),
        goodput_req_s=_median([s.goodput_req_s for s in sums]),
        slo_attainment=_median([s.slo_attainment for s in sums]),
        error_rate=error_rate,
        latency_ms=latency,
        spread=spread,
        flags=tuple(flags),
        peak_kv_usage=max((p.peak_kv_usage for p in probes if p.peak_kv_usage is not None), default=None),
        preemptions=_int(_median([p.preemptions for p in probes])),
        memory_bytes=_int(_median([p.memory_bytes for p in probes])),
        memory_source=next((p.memory_source for p in probes if p.memory_source), None),
        memory_na_reason=next((p.memory_na_reason for p in probes if p.memory_na_reason), None),
        compute_util=_median([p.compute_util for p in probes]),
        bandwidth_util=_median([p.bandwidth_util for p in probes]),
        util_na_reason=util_reason,
    )


def _int(x: float | None) -> int | None:
    return None if x is None else int(round(x))


def _seconds(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000.0


def saturation(plan: SweepPlan, prev: PointResult, now: PointResult) -> str | None:
    """Why `now` shows saturation against the lighter load before it, or None."""
    if not (prev.measured and now.measured):
        return None
    prev_thr, prev_p99, now_thr, now_p99 = prev.throughput_req_s, prev.p99_e2e_ms, now.throughput_req_s, now.p99_e2e_ms
    if not prev_thr or not prev_p99 or now_thr is None or now_p99 is None:
        return None
    gain = (now_thr - prev_thr) / prev_thr
    rise = (now_p99 - prev_p99) / prev_p99
    if gain < plan.saturation_gain and rise > plan.saturation_latency_rise:
        return f"saturated at {now.load.label}: throughput {gain:+.0%}, p99 end-to-end {rise:+.0%}"
    return None


class SweepRunner:
    """Runs one plan. `stop` (set from a Ctrl-C handler) ends it early; the engine is restored."""

    def __init__(
        self,
        plan: SweepPlan,
        controller: EngineController,
        *,
        on_progress: ProgressFn | None = None,
        stop: asyncio.Event | None = None,
        store: AuditStore | None = None,
        api_key: str | None = None,
    ):
        self.plan = plan
        self.ctl = controller
        self.on_progress = on_progress or (lambda ev: None)
        self.stop = stop or asyncio.Event()
        self.store = store  # where the sweep and its points are recorded, if anywhere
        self.api_key = api_key
        self.points: list[PointResult] = []
        self._t0 = time.monotonic()
        self._measured_s: list[float] = []
        self._sweep_id: int | None = None

    def _emit(
        self, event: str, index: int, params: dict[str, Any], message: str = "", result: PointResult | None = None
    ) -> None:
        total = self.plan.total_points
        eta = None
        done = len(self.points)
        if self._measured_s and done:
            eta = (time.monotonic() - self._t0) / done * (total - done)
        self.on_progress(
            SweepProgress(event, index, total, dict(params), time.monotonic() - self._t0, eta, message, result)
        )

    def _finish_point(self, p: PointResult) -> None:
        self.points.append(p)
        self._emit(
            "point_skipped" if p.status == "skipped" else "point_finished", p.index, p.params, p.reason or p.status, p
        )

    async def run(self) -> SweepResult:
        started = time.time()
        original = await self.ctl.current()
        self._open_store(original)
        current = original
        status, error = "done", None
        try:
            index = 0
            for server in self.plan.server_points():
                first = index + 1
                index += len(self.plan.loads)
                if self.stop.is_set():
                    self._skip_all(first, server, "interrupted")
                    continue
                if any(current.spec.get(k) != v for k, v in server.items()):
                    self._emit(
                        "engine_restarting",
                        first,
                        server,
                        "restarting the engine on " + ", ".join(f"{k}={v}" for k, v in server.items()),
                    )
                    try:
                        current = await self.ctl.apply(server)
                    except EngineStartFailed as e:
                        # The engine sits failed on that config: restoring is due however it ends.
                        current = dataclasses.replace(original, spec={}, config_id="(failed start)")
                        self._skip_all(first, server, f"the engine did not start on this config: {e}", "failed")
                        continue
                    self._record_config(current)
                await self._server_point(first, server, current)
            if self.stop.is_set():
                status = "cancelled"
        except asyncio.CancelledError:
            status = "cancelled"
            raise
        except Exception as e:
            status, error = "failed", f"{type(e).__name__}: {e}"
            raise
        finally:
            restored, restore_error = await self._restore(original, current)
            self._close_store(status)
            self.result = SweepResult(
                self.plan,
                tuple(self.points),
                original,
                status,
                started,
                time.time(),
                restored,
                restore_error,
                error,
                self._sweep_id,
            )
        return self.result

    async def _restore(self, original: EngineTarget, current: EngineTarget) -> tuple[bool, str | None]:
        if current.config_id == original.config_id:
            self._emit("restored", len(self.points), {}, "the engine already runs its original config")
            return True, None
        self._emit("engine_restarting", len(self.points), {}, "restoring the original config")
        try:
            await asyncio.shield(self.ctl.restore(original))
        except Exception as e:  # reported beside the results: the operator must know
            return False, f"{type(e).__name__}: {e}"
        self._emit("restored", len(self.points), {}, f"restored config {original.config_id}")
        return True, None

    def _skip_all(self, first: int, server: dict[str, Any], reason: str, status: str = "skipped") -> None:
        for k, lv in enumerate(self.plan.loads):
            self._finish_point(PointResult(first + k, server, lv, status, reason))
            self._record_point(self.points[-1], [])

    async def _load_url(self, target: EngineTarget) -> str:
        """The engine's own port, or its gateway door for a sweep asked to go through the window."""
        if not self.plan.through_gateway:
            return target.url
        if not hasattr(self.ctl, "gateway_url"):
            raise RuntimeError("this sweep's controller knows no gateway; run it without through_gateway")
        return await cast(GatewayDoor, self.ctl).gateway_url()  # checked just above

    async def _server_point(self, first: int, server: dict[str, Any], target: EngineTarget) -> None:
        tok = await asyncio.to_thread(load_tokenizer, target.model)
        url = await self._load_url(target)
        stop_reason: str | None = None
        prev: PointResult | None = None
        for k, lv in enumerate(self.plan.loads):
            index = first + k
            if stop_reason or self.stop.is_set():
                self._finish_point(PointResult(index, server, lv, "skipped", stop_reason or "interrupted"))
                self._record_point(self.points[-1], [])
                continue
            params = {**server, lv.kind: lv.value}
            self._emit("point_started", index, params, f"measuring {lv.label} x{self.plan.repeats}")
            began = time.monotonic()
            runs: list[tuple[LoadSummary, ProbeFigures]] = []
            note = None
            for r in range(self.plan.repeats):
                wl = lv.workload(self.plan, seed=r)
                planned = await asyncio.to_thread(plan_requests, wl, tok)
                async with RunProbe(target.url, self.ctl.resources) as probe:
                    res = await run_load(
                        url,
                        target.served_model_name,
                        wl,
                        plan=planned,
                        slo=self.plan.slo,
                        stop=self.stop,
                        api_key=self.api_key,
                    )
                if res.stopped_early == "interrupted":
                    note = f"interrupted after {r} of {self.plan.repeats} repeats"
                    break
                runs.append((res.summary, probe.figures()))
            if not runs:
                point = PointResult(index, server, lv, "skipped", "interrupted")
            else:
                point = aggregate(self.plan, index, server, lv, target.config_id, runs, note)
                self._measured_s.append(time.monotonic() - began)
                sat = saturation(self.plan, prev, point) if prev is not None else None
                if sat:
                    point = dataclasses.replace(point, flags=point.flags + ("saturated",))
                    stop_reason = f"skipped: {sat}"
                elif point.status == "slo_missed":
                    stop_reason = f"skipped: the SLO broke at {lv.label} ({point.reason})"
                elif point.status == "failed":
                    stop_reason = f"skipped: {point.reason} at {lv.label}"
                prev = point
            self._finish_point(point)
            self._record_point(point, [s for s, _ in runs])

    # --- history ----------------------------------------------------------------------------

    def _open_store(self, original: EngineTarget) -> None:
        if self.store is None:
            return
        self.store.record_config(original.config_id, original.spec)
        grid = {k: list(v) for k, v in self.plan.grid.items()}
        self._sweep_id = self.store.create_sweep(
            self.plan.engine,
            grid,
            {"levels": [lv.label for lv in self.plan.loads], **self.plan.describe()},
            self.plan.slo.as_dict(),
            config_id=original.config_id,
        )
        self.store.set_sweep_status(self._sweep_id, "running")

    def _record_config(self, target: EngineTarget) -> None:
        if self.store is not None:
            self.store.record_config(target.config_id, target.spec)

    def _record_point(self, p: PointResult, summaries: list[LoadSummary]) -> None:
        """One row per repeat (the medians live in results.json); a skipped point gets one empty row."""
        if self.store is None or self._sweep_id is None:
            return
        flags = list(p.flags) + ([p.reason] if p.reason else [])
        figures: dict[str, float | int | None] = dict(
            peak_kv_usage=p.peak_kv_usage,
            preemptions=p.preemptions,
            memory_bytes=p.memory_bytes,
            compute_util=p.compute_util,
            bandwidth_util=p.bandwidth_util,
        )
        if not summaries:
            self.store.add_sweep_point(
                self._sweep_id, p.params, repeat=0, status=p.status, flags=flags, config_id=p.config_id, **figures
            )
            return
        for r, s in enumerate(summaries):
            self.store.add_sweep_point(
                self._sweep_id,
                p.params,
                repeat=r,
                throughput_req_s=s.request_throughput_req_s,
                throughput_tok_s=s.output_throughput_tok_s,
                p50_ttft_s=_seconds(s.ttft.median_ms),
                p99_ttft_s=_seconds(s.ttft.p99_ms),
                p50_itl_s=_seconds(s.itl.median_ms),
                p99_itl_s=_seconds(s.itl.p99_ms),
                p50_tpot_s=_seconds(s.tpot.median_ms),
                p99_tpot_s=_seconds(s.tpot.p99_ms),
                p50_e2e_s=_seconds(s.e2e.median_ms),
                p99_e2e_s=_seconds(s.e2e.p99_ms),
                status=p.status,
                flags=flags,
                config_id=p.config_id,
                **figures,
            )

    def _close_store(self, status: str) -> None:
        if self.store is not None and self._sweep_id is not None:
            self.store.set_sweep_status(self._sweep_id, status)
