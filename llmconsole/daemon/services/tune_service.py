"""The daemon's side of auto-tuning: applying a winner, watching it, and the optional schedule
(its HTTP routes: daemon/api/tune.py).

After any applied change the engine's gateway records are judged every few seconds against the
SLO and an error-rate limit (engine/tune/guard.py). A degradation that holds for a whole window
rolls the engine back to the config it ran before, as an automatic rollback action in the store
whose reason names the breach.

The schedule is off by default. When set, every interval it runs a short tune in the daemon on
the traffic shape the gateway saw lately (arrival rate and output lengths; prompt lengths are not
seen at the gateway, so they come from the schedule) and records the proposal; with "apply" it
applies a winner that beats the running config, guarded like any other apply.
"""

from __future__ import annotations

import asyncio
import json
import logging
import statistics
import time
from collections.abc import Coroutine
from typing import Any

from llmconsole.atomic import read_json_object, write_atomic
from llmconsole.daemon.context import DaemonContext
from llmconsole.daemon.services.fleet_controller import FleetController
from llmconsole.daemon.services.rollback import ActionLog, rollback
from llmconsole.engine.alerts.response_settings import GroupGate
from llmconsole.engine.gateway.group import RequestRecord
from llmconsole.engine.load.workload import LengthDist
from llmconsole.engine.metrics.latency import Slo
from llmconsole.engine.modes.guarded_apply import ApplyFailed, ApplyRefused, guarded_apply
from llmconsole.engine.status import EngineState
from llmconsole.engine.sweep.plan import LoadLevel, SweepPlan
from llmconsole.engine.tune.guard import GuardSettings, breach, sustained, window_figures
from llmconsole.engine.tune.quiet import QuietSettings, busy_reason
from llmconsole.engine.tune.ranges import derive_space
from llmconsole.engine.tune.settings import TuneSettings
from llmconsole.engine.tune.space import Budget, Knob, clamp_to_workload, parse_knob, split_params
from llmconsole.engine.tune.tuner import Tuner
from llmconsole.engine.tune.verdict import infeasible_lines

log = logging.getLogger(__name__)


class TuneService:
    def __init__(self, ctx: DaemonContext):
        self.ctx = ctx
        self.fleet, self.store, self.gateway = ctx.fleet, ctx.store, ctx.gateway
        self.path = ctx.data_dir / "tune_schedule.json"
        self.schedule: dict[str, dict[str, Any]] = self._read()
        self.watches: dict[str, dict[str, Any]] = {}
        self.runs: list[dict[str, Any]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._last_run_s: dict[str, float] = {}
        self._postponed: set[str] = set()  # due, waiting for quiet traffic (said once)

    def _read(self) -> dict[str, dict[str, Any]]:
        return read_json_object(self.path)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        t = asyncio.create_task(coro, name=name)
        self._tasks.add(t)
        t.add_done_callback(self._tasks.discard)

    async def start(self) -> None:
        self._loop_task = asyncio.create_task(self._schedule_loop(), name="tune-schedule")

    async def close(self) -> None:
        for t in [self._loop_task, *self._tasks]:
            if t is not None:
                t.cancel()
        await asyncio.gather(*(t for t in [self._loop_task, *self._tasks] if t is not None), return_exceptions=True)

    # --- apply and guard ----------------------------------------------------------------------

    def _records(self, name: str) -> list[RequestRecord]:
        group = self.gateway.group_of(name) if self.gateway is not None else None
        return list(group.records) if group is not None else []

    async def apply(
        self,
        name: str,
        overrides: dict[str, Any],
        slo: Slo,
        *,
        actor: str,
        automatic: bool = False,
        guard: GuardSettings | None = None,
        detail: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        sup = self.fleet.get(name)
        spec_over, window = split_params(overrides)
        ctl = FleetController(self.fleet, name, gateway=self.gateway)
        window_before = None
        if window:  # checked before anything moves: a bad bound changes nothing
            window_before = await ctl.window()
            lo, hi = (
                window.get("min_window", window_before["min_window"]),
                window.get("max_window", window_before["max_window"]),
            )
            if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
                raise ValueError(f"window bounds {lo}..{hi} are not 1 <= min_window <= max_window")
        new = type(sup.spec).model_validate({**sup.spec.model_dump(), **spec_over})
        gate = GroupGate(self.gateway) if self.gateway is not None else None
        result = await guarded_apply(
            self.fleet,
            name,
            new,
            store=self.store,
            gate=gate,
            actor=actor,
            kind="tune",
            automatic=automatic,
            detail={"overrides": overrides, **(detail or {})},
        )
        if window and result.action_id is None:  # no restart, so no action yet: the window is the change
            with ActionLog(self.store).change(
                "tune",
                name,
                actor,
                automatic=automatic,
                before=window_before or {},
                detail={"overrides": overrides, **(detail or {})},
            ) as done:
                await ctl.set_window(window)
                done["to"] = await ctl.window()
        elif window:
            await ctl.set_window(window)
        g = guard or GuardSettings()
        if result.from_config_id != result.to_config_id or window:
            self.watches[name] = {
                "from_config_id": result.from_config_id,
                "to_config_id": result.to_config_id,
                "since_s": time.time(),
                "slo": slo.as_dict(),
                "state": "watching",
                "reason": None,
                "window": window or None,
                "window_before": window_before,
            }
            self._spawn(
                self._watch(name, result.from_config_id, result.to_config_id, slo, g, window_before),
                f"tune-guard-{name}",
            )
        return {**result.to_json(), "watch_s": g.watch_s, "window": window or None}

    async def _watch(
        self,
        name: str,
        before_id: str,
        applied_id: str,
        slo: Slo,
        g: GuardSettings,
        window_before: dict[str, int] | None = None,
    ) -> None:
        began = time.time()
        checks: list[tuple[float, str | None]] = []
        w = self.watches[name]
        while time.time() - began < g.watch_s:
            await asyncio.sleep(g.check_s)
            sup = self.fleet.get(name)
            if sup.spec.config_id != applied_id:
                w["state"] = "ended: the config was changed"
                return
            now = time.time()
            fig = window_figures(self._records(name), slo, max(began, now - g.window_s), now)
            checks.append((now, breach(fig, g)))
            why = sustained(checks, now, g.window_s)
            if why:
                reason = f"after the tuned config {applied_id} was applied: {why} for {g.window_s:.0f} s"
                log.warning("rolling %s back to %s: %s", name, before_id, reason)
                w.update(state="rolled back", reason=reason)
                try:
                    if window_before:
                        ctl = FleetController(self.fleet, name, gateway=self.gateway)
                        with ActionLog(self.store).change(
                            "window",
                            name,
                            "llmconsole",
                            automatic=True,
                            before=await ctl.window(),
                            detail={"reason": reason},
                        ) as done:
                            await ctl.set_window(window_before)
                            done["to"] = window_before
                    if before_id != applied_id:
                        await rollback(
                            self.ctx, name, actor="llmconsole", to_config_id=before_id, automatic=True, reason=reason
                        )
                except Exception as e:
                    w.update(state="rollback failed", reason=f"{reason}; rollback failed: {e}")
                    log.exception("automatic rollback of %s failed", name)
                return
        w["state"] = "kept"

    # --- the schedule -------------------------------------------------------------------------

    def due(self, now_s: float) -> list[str]:
        """The engines whose scheduled tune starts now. A schedule with "quiet_only" (the
        autopilot's) waits while its traffic is busy (engine/tune/quiet.py), recorded once as
        postponed; after a whole interval of waiting that run is skipped, with the reason."""
        out = []
        for name, cfg in list(self.schedule.items()):
            last = self._last_run_s.setdefault(name, now_s)
            interval = float(cfg["interval_s"])
            if now_s - last < interval:
                continue
            why = self.busy_reason(name, cfg) if cfg.get("quiet_only") else None
            if why is None:
                self._last_run_s[name] = now_s
                self._postponed.discard(name)
                out.append(name)
                continue
            if now_s - last >= 2 * interval:
                self._last_run_s[name] = now_s
                self._postponed.discard(name)
                self._note(name, "skipped", f"never quiet for a whole interval: {why}")
            elif name not in self._postponed:
                self._postponed.add(name)
                self._note(name, "postponed", why)
        return out

    def _note(self, name: str, status: str, why: str) -> None:
        log.info("scheduled tune of %s %s: %s", name, status, why)
        self.runs.append({"engine": name, "at_s": time.time(), "status": status, "error": why})
        del self.runs[:-20]

    def busy_reason(self, name: str, cfg: dict[str, Any]) -> str | None:
        group = self.gateway.group_of(name) if self.gateway is not None else None
        if group is None:
            return None
        settings = QuietSettings(
            window_s=float(cfg.get("quiet_window_s", 600.0)),
            lookback_s=max(float(cfg.get("lookback_s", 3600.0)), float(cfg.get("quiet_window_s", 600.0))),
        )
        arrivals = [r.finished_at_s - r.e2e_s for r in list(group.records)]
        return busy_reason(arrivals, time.time(), group.admission.queued, settings)

    async def _schedule_loop(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            for name in self.due(time.monotonic()):
                cfg = self.schedule.get(name)
                if cfg is None:
                    continue
                try:
                    await self.scheduled_run(name, cfg)
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # one bad run must not end the schedule
                    log.exception("scheduled tune of %s failed", name)
                    self.runs.append({"engine": name, "at_s": time.time(), "status": "failed", "error": str(e)})

    def traffic_shape(self, name: str, cfg: dict[str, Any]) -> tuple[LoadLevel, LengthDist]:
        """The arrival rate and output lengths the gateway saw over the schedule's lookback."""
        now = time.time()
        lookback = float(cfg.get("lookback_s", 3600))
        recent = [r for r in self._records(name) if r.finished_at_s >= now - lookback and r.outcome == "ok"]
        if len(recent) < 4:
            return LoadLevel("concurrency", float(cfg.get("concurrency", 4))), LengthDist.parse(
                cfg.get("output_len", "64")
            )
        span = max(1.0, max(r.finished_at_s for r in recent) - min(r.finished_at_s - r.e2e_s for r in recent))
        rate = round(len(recent) / span, 2)
        outs = [r.output_len for r in recent if r.output_len]
        out_len = (
            LengthDist.fixed(max(1, int(statistics.median(outs))))
            if outs
            else LengthDist.parse(cfg.get("output_len", "64"))
        )
        return LoadLevel("rate", max(rate, 0.1)), out_len

    async def scheduled_run(self, name: str, cfg: dict[str, Any]) -> dict[str, Any]:
        sup = self.fleet.get(name)
        if sup.state != EngineState.READY:
            run = {"engine": name, "at_s": time.time(), "status": "skipped", "error": f"engine is {sup.state}"}
            self.runs.append(run)
            return run
        slo = Slo.parse([f"{k}={v}" for k, v in cfg["slo"].items()])
        load, out_len = self.traffic_shape(name, cfg)
        in_len = LengthDist.parse(str(cfg.get("input_len", "64")))
        plan = SweepPlan(
            engine=name,
            grid={},
            loads=(load,),
            slo=slo,
            repeats=1,
            num_requests=int(cfg.get("num_requests", 16)),
            input_len=in_len,
            output_len=out_len,
            warmup_requests=1,
            max_run_s=float(cfg.get("max_run_s", 120)),
        )
        spec = sup.spec.public_dict()
        knobs = tuple(parse_knob(k) for k in cfg.get("knobs") or ()) or (
            Knob("max_num_seqs"),
            Knob("max_num_batched_tokens"),
        )
        ctl = FleetController(self.fleet, name, gateway=self.gateway)
        facts = await ctl.facts(with_window=self.gateway is not None)
        window = facts.window
        space = await asyncio.to_thread(
            derive_space,
            knobs,
            facts,
            input_len=in_len.value,
            output_len=out_len.value,
            concurrency=int(load.value) if load.kind == "concurrency" else None,
        )
        knobs = clamp_to_workload(space.knobs, in_len.value + out_len.value)
        settings = TuneSettings(
            plan,
            knobs,
            Budget(trials=int(cfg.get("budget_trials", 4))),
            top_k=int(cfg.get("top_k", 1)),
            repeats=int(cfg.get("repeats", 1)),
            start=space.start,
        )
        storage = self.fleet.paths.data_dir / "tuning" / "studies.journal"
        base_spec = {k: spec.get(k) for k in (k.name for k in knobs)}
        if window:
            base_spec.update({k: window[k.removeprefix("gateway_")] for k in base_spec if k.startswith("gateway_")})
        result = await Tuner(settings, ctl, storage).run()
        run = {
            "engine": name,
            "at_s": time.time(),
            "status": result.status,
            "study": result.study,
            "load": load.label,
            "output_len": out_len.describe(),
            "trials": len(result.trials),
            "new_trials": result.new_trials,
            "running": base_spec,
            "ranges": space.sources,
            "proposal": result.winner.params if result.winner else None,
            "proposal_req_s": result.winner.mean_req_s if result.winner else None,
            "why_no_proposal": infeasible_lines(result.trials) if result.winner is None else [],
            "applied": None,
        }
        if result.winner and cfg.get("apply") and result.winner.params != base_spec:
            try:
                run["applied"] = await self.apply(
                    name,
                    result.winner.params,
                    slo,
                    actor="llmconsole schedule",
                    automatic=True,
                    detail={"study": result.study},
                )
            except (ApplyRefused, ApplyFailed) as e:
                run["applied"] = {"error": str(e)}
        self.runs.append(run)
        del self.runs[:-20]
        return run

    def set_schedule(self, body: dict[str, Any]) -> dict[str, Any]:
        name = str(body.get("engine") or "")
        self.fleet.get(name)  # UnknownEngine for a name the daemon does not supervise
        if body.get("off"):
            self.schedule.pop(name, None)
        else:
            self.schedule[name] = self.check_schedule(body)
            self._last_run_s[name] = time.monotonic()
        write_atomic(self.path, json.dumps(self.schedule, indent=2))  # whole, durable, 0600
        return self.state()

    def check_schedule(self, body: dict[str, Any]) -> dict[str, Any]:
        """The schedule a body asks for; ValueError (bad input) or UnknownEngine, nothing kept."""
        self.fleet.get(str(body.get("engine") or ""))
        interval = float(body.get("interval_s", 4 * 3600))
        if not interval >= 10:
            raise ValueError("interval_s must be at least 10 s")
        slo = Slo.parse([f"{k}={v}" for k, v in (body.get("slo") or {}).items()])
        if not slo:
            raise ValueError('a scheduled tune needs an SLO ({"p99_e2e_ms": 2000, ...})')
        for k in body.get("knobs") or ():
            parse_knob(k)
        if "quiet_only" in body and not isinstance(body["quiet_only"], bool):
            raise ValueError("quiet_only must be true or false")
        if "quiet_window_s" in body:
            QuietSettings(window_s=float(body["quiet_window_s"]), lookback_s=float("inf"))
        keep = (
            "budget_trials",
            "apply",
            "knobs",
            "input_len",
            "output_len",
            "num_requests",
            "concurrency",
            "lookback_s",
            "max_run_s",
            "top_k",
            "repeats",
            "quiet_only",
            "quiet_window_s",
        )
        return {
            "interval_s": interval,
            "slo": slo.as_dict(),
            **{k: body[k] for k in keep if k in body},
        }

    def state(self) -> dict[str, Any]:
        return {"schedule": self.schedule, "watches": self.watches, "runs": self.runs[-20:]}
