"""Memory modes, alerts and automated responses on the control API, and the daemon's services
behind them (the auto mode policy loop, the alert evaluator, the Prometheus exporter).

Routes (under /v1):
  GET  /engines/{name}/mode       the engine's mode, whether auto picks it, the budget it applies to
  POST /engines/{name}/mode       {"mode": "performance|balanced|aggressive|auto", "force": false,
                                   "budget_bytes": N?}; a switch is a guarded apply: 200 applied,
                                   400 refused (nothing changed), 409 failed and rolled back (why)
  GET  /alerts                    alerts active now, recent alerts and the responses they caused
  GET  /responses/config          POST the same shape to change which responses are enabled
  POST /responses/{id}/undo       undo one automated response
  GET  /exporter                  where the daemon's /metrics is served
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import time
from typing import Any

from aiohttp import web

from llmconsole.daemon.services.exporter import DaemonCollector, Exporter
from llmconsole.engine.fleet import UnknownEngine
from llmconsole.engine.modes.guarded_apply import ApplyFailed, ApplyRefused, guarded_apply
from llmconsole.engine.modes.policy import PolicySettings, PolicyState, step, used_fraction
from llmconsole.engine.modes.memory import AUTO, Mode, ModeError, cpu_kv_budget_bytes, mode_of, mode_spec, parse_mode
from llmconsole.daemon.services.response_service import ResponseService
from llmconsole.engine.alerts.response_settings import GroupGate
from llmconsole.engine.status import EngineState, EngineStatus
from llmconsole.engine.supervisor import EngineBusy

log = logging.getLogger(__name__)

AUTO_INTERVAL_S = 5.0


class ModeService:
    """Mode switches (guarded applies) and the auto policy for the engines that ask for it."""

    def __init__(self, fleet, store=None, gateway=None, policy: PolicySettings | None = None):
        self.fleet = fleet
        self.store = store
        self.gateway = gateway
        self.policy = policy or PolicySettings()
        self._file = fleet.paths.data_dir / "modes.json"
        self.auto: dict[str, PolicyState] = {}
        self._busy: set[str] = set()
        self._task: asyncio.Task | None = None
        for name in self._read_auto():  # a daemon restart also waits an interval before switching
            if name in fleet.engines:
                now = mode_of(fleet.engines[name].spec, self.device_of(name))
                self.auto[name] = PolicyState(Mode(now) if now else Mode.PERFORMANCE, time.monotonic())

    def _read_auto(self) -> list[str]:
        try:
            return list(json.loads(self._file.read_text()).get("auto", []))
        except (OSError, ValueError, AttributeError):
            return []

    def _save(self) -> None:
        tmp = self._file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"auto": sorted(self.auto)}))
        os.replace(tmp, self._file)

    def device_of(self, name: str) -> str:
        device = self.fleet.get(name).status().device
        return "cpu" if device in ("cpu", "unknown") else device

    def annotate(self, st: EngineStatus) -> EngineStatus:
        device = "cpu" if st.device in ("cpu", "unknown") else st.device
        return dataclasses.replace(st, mode=mode_of(st.spec, device), mode_auto=st.name in self.auto)

    def state(self, name: str, budget_bytes: int | None = None) -> dict[str, Any]:
        sup = self.fleet.get(name)
        device = self.device_of(name)
        return {"engine": name, "mode": mode_of(sup.spec, device), "auto": name in self.auto, "device": device,
                "budget_bytes": (budget_bytes or cpu_kv_budget_bytes()) if device == "cpu" else None,
                "gpu_memory_utilization": sup.spec.gpu_memory_utilization,
                "kv_cache_memory_bytes": sup.spec.kv_cache_memory_bytes,
                "kv_cache_tokens": sup.status().kv_cache_tokens}

    async def set_mode(self, name: str, mode_text: str, *, actor: str, force: bool = False,
                       budget_bytes: int | None = None, automatic: bool = False) -> dict[str, Any]:
        sup = self.fleet.get(name)
        if mode_text.strip().lower() == AUTO:
            # Enabling the policy counts as a switch: its first restart waits a full interval.
            self.auto[name] = PolicyState(Mode(mode_of(sup.spec, self.device_of(name)) or Mode.PERFORMANCE),
                                          time.monotonic())
            self._save()
            return {**self.state(name), "applied": None}
        mode = parse_mode(mode_text)
        if not automatic and name in self.auto:
            del self.auto[name]  # an operator's choice ends the policy's
            self._save()
        device = self.device_of(name)
        budget = budget_bytes if budget_bytes is not None else cpu_kv_budget_bytes() if device == "cpu" else None
        new = mode_spec(sup.spec, mode, device, budget)
        if name in self._busy:
            raise EngineBusy(f"a mode switch of {name} is under way")
        self._busy.add(name)
        try:
            gate = GroupGate(self.gateway) if self.gateway is not None else None
            result = await guarded_apply(self.fleet, name, new, store=self.store, gate=gate, actor=actor,
                                         kind="mode", automatic=automatic, force=force,
                                         detail={"mode": mode.value, "budget_bytes": budget})
        finally:
            self._busy.discard(name)
        return {**self.state(name, budget), "applied": result.to_json()}

    async def start(self) -> None:
        self._task = asyncio.create_task(self._auto_loop(), name="mode-auto")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def _auto_loop(self) -> None:
        while True:
            try:
                await self.auto_step(time.monotonic())
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("auto mode step failed")
            await asyncio.sleep(AUTO_INTERVAL_S)

    async def auto_step(self, now_s: float) -> None:
        if not self.auto:
            return
        frac = used_fraction(self.fleet.probe.sample_host())
        if frac is None:
            return
        for name in list(self.auto):
            if name not in self.fleet.engines:
                del self.auto[name]
                continue
            new_state, decision = step(self.auto[name], frac, now_s, self.policy)
            self.auto[name] = new_state
            if decision is None or name in self._busy:
                continue
            if self.fleet.get(name).state != EngineState.READY:
                continue
            log.warning("auto mode: %s memory at %.0f%%: %s -> %s", name, frac * 100, decision.from_mode,
                        decision.to_mode)
            asyncio.create_task(self._auto_apply(name, decision.to_mode))

    async def _auto_apply(self, name: str, mode: Mode) -> None:
        try:
            await self.set_mode(name, mode.value, actor="llmconsole", automatic=True)
        except (ApplyFailed, ApplyRefused, EngineBusy, ModeError) as e:
            log.warning("auto mode switch of %s to %s did not happen: %s", name, mode, e)


MODES = web.AppKey("modes", ModeService)
RESPONSES = web.AppKey("responses", ResponseService)
EXPORTER = web.AppKey("exporter", Exporter)


def _error(status: int, message: str, details: list[str] | None = None) -> web.Response:
    return web.json_response({"error": message, "details": details or []}, status=status)


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json() if request.can_read_body else {}
    except ValueError:
        raise web.HTTPBadRequest(text='{"error": "request body is not JSON"}', content_type="application/json")
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(text='{"error": "request body must be a JSON object"}', content_type="application/json")
    return body


async def get_mode(request: web.Request) -> web.Response:
    try:
        return web.json_response(request.app[MODES].state(request.match_info["name"]))
    except UnknownEngine as e:
        return _error(404, str(e))
    except ModeError as e:  # e.g. a budget in the daemon's environment that is not a number
        return _error(400, str(e))


async def post_mode(request: web.Request) -> web.Response:
    from llmconsole.daemon.api.engines import peer_user

    body = await _body(request)
    mode, budget = body.get("mode"), body.get("budget_bytes")
    if not isinstance(mode, str):
        return _error(400, "give a mode: performance, balanced, aggressive or auto")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0):
        return _error(400, "budget_bytes must be a positive integer")
    try:
        result = await request.app[MODES].set_mode(request.match_info["name"], mode, actor=peer_user(request),
                                                   force=bool(body.get("force")), budget_bytes=budget)
    except UnknownEngine as e:
        return _error(404, str(e))
    except ApplyRefused as e:
        return _error(400, str(e), e.details)
    except ModeError as e:
        return _error(400, str(e))
    except EngineBusy as e:
        return _error(409, str(e))
    except ApplyFailed as e:
        return _error(409, str(e), [f"restored config: {e.restored_config_id}"])
    return web.json_response(result)


async def get_alerts(request: web.Request) -> web.Response:
    svc = request.app[RESPONSES]
    since = time.time() - float(request.query.get("since_s", 86400))
    alerts = await asyncio.to_thread(svc.store.alerts, since=since)
    actions = await asyncio.to_thread(svc.store.actions, since=since)
    return web.json_response({
        "active": svc.alert_states(),
        "alerts": [{"id": a.id, "at": a.at, "engine": a.engine, "rule": a.rule, "severity": a.severity,
                    "state": a.state, "resolved_at": a.resolved_at, "detail": a.detail} for a in alerts],
        "responses": [{"id": a.id, "at": a.at, "engine": a.engine, "kind": a.kind, "outcome": a.outcome,
                       "detail": a.detail} for a in actions if a.kind.startswith("response:")],
        "settings": svc.settings,
    })


async def get_response_config(request: web.Request) -> web.Response:
    return web.json_response(request.app[RESPONSES].settings)


async def post_response_config(request: web.Request) -> web.Response:
    try:
        return web.json_response(request.app[RESPONSES].configure(await _body(request)))
    except ValueError as e:
        return _error(400, str(e))


async def post_undo(request: web.Request) -> web.Response:
    from llmconsole.daemon.api.engines import peer_user

    try:
        action_id = int(request.match_info["id"])
        return web.json_response(await request.app[RESPONSES].undo(action_id, actor=peer_user(request)))
    except ValueError as e:
        return _error(400, str(e))
    except UnknownEngine as e:
        return _error(404, str(e))
    except EngineBusy as e:
        return _error(409, str(e))


async def get_exporter(request: web.Request) -> web.Response:
    return web.json_response(request.app[EXPORTER].info())


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/engines/{name}/mode", get_mode)
    app.router.add_post("/v1/engines/{name}/mode", post_mode)
    app.router.add_get("/v1/alerts", get_alerts)
    app.router.add_get("/v1/responses/config", get_response_config)
    app.router.add_post("/v1/responses/config", post_response_config)
    app.router.add_post("/v1/responses/{id}/undo", post_undo)
    app.router.add_get("/v1/exporter", get_exporter)


async def start_services(app: web.Application, fleet, store, gateway, rollback) -> list:
    """Modes, alerts and the exporter, wired into the daemon; returns what to close on the way out."""
    modes = app[MODES] = ModeService(fleet, store, gateway)
    fleet.status_annotators.append(modes.annotate)
    responses = app[RESPONSES] = ResponseService(fleet, store, gateway, rollback=rollback)
    exporter = app[EXPORTER] = Exporter(DaemonCollector(fleet, gateway, responses, modes), fleet.paths.data_dir)
    await exporter.start()
    await modes.start()
    await responses.start()
    return [responses, modes, exporter]
