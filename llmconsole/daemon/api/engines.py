"""The daemon itself and its engines' lifecycle on the control API.

Routes (all under /v1):
  GET  /daemon                      the daemon itself (pid, llmconsole version, wire_version, home,
                                    uptime); every answer also names its wire in X-Llmconsole-Wire
  POST /daemon/stop                 {"stop_engines": false} - engines keep serving by default
  GET  /status                      host gauges and every engine's status (a starting one with
                                    "startup": its phase, elapsed_s and expected_s, its last start)
  POST /engines/{name}/start        {"spec": {...}} for a new engine, or {"overrides": {...}}
                                    to start a known one on its last spec with some fields changed;
                                    an optional "api_key" travels beside, never in the spec dump;
                                    "force": true skips the fit check (without it, a config that
                                    cannot fit is a 400 whose details hold the numbers)
  POST /engines/{name}/stop         {"drain_timeout_s": 30}
  POST /engines/{name}/restart      same body as start (optional), and "drain_timeout_s"
                                    Both drain through the gateway first, as a mode switch does:
                                    the engine gets no new requests and those in flight finish
                                    (within the drain timeout, default the supervision policy's)
                                    before it stops, so a planned restart cuts no stream.
  DELETE /engines/{name}            forget a stopped engine
  GET  /engines/{name}/member       what a gateway group of another host needs to route to the
                                    engine: where it listens (bind address, port), its model
                                    names and its API key (the socket is its user's alone; each
                                    read is logged with who asked)
  GET  /engines/{name}/logs         ?offset=N (bytes; omit for the tail) &max_bytes=M

Errors are {"error": "...", "details": [...]} with 400 (bad input: nothing was changed),
404 (unknown engine), 409 (not allowed in the engine's current state): see daemon/http.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from llmconsole import __version__
from llmconsole.daemon.context import CONTEXT, DaemonContext, context_of
from llmconsole.daemon.http import error_response, json_body, peer_user, session_of, wire_response
from llmconsole.daemon.services.rollback import ActionLog, drained
from llmconsole.daemon.services.startup import StartupProgress
from llmconsole.engine.fleet import Fleet
from llmconsole.engine.spec import EngineSpec, fill_secrets
from llmconsole.engine.spec_checks import check_name
from llmconsole.engine.status import EngineStatus
from llmconsole.engine.supervisor import EngineBusy
from llmconsole.wire import WIRE_VERSION
from llmconsole.wire.status import DaemonFacts, DaemonInfo, EngineInfo, HostInfo, StatusAnswer

log = logging.getLogger(__name__)

STOP = web.AppKey("stop", asyncio.Event)
STOP_ENGINES = web.AppKey("stop_engines", list[bool])
STARTED_AT = web.AppKey("started_at", float)
STARTUP = web.AppKey("startup", StartupProgress)


def _spec_from_body(fleet: Fleet, name: str, body: dict[str, Any]) -> EngineSpec | None:
    """The spec a start/restart asks for, or None for 'the engine's last spec'."""
    api_key = body.get("api_key")
    if body.get("spec") is not None:
        fields = dict(body["spec"])
        if api_key is not None:
            fields["api_key"] = api_key
        return EngineSpec(**fields)
    overrides = body.get("overrides") or {}
    if not overrides and api_key is None:
        return None
    base = fleet.get(name).spec
    fields = base.config_dict()
    fields.update(overrides)
    # A spec read back from status or history names its secrets only: the engine's values fill them.
    if isinstance(fields.get("env"), dict):
        fields["env"] = fill_secrets(fields["env"], {**base.env, **fleet.secret_env(name)})
    if api_key is not None:
        fields["api_key"] = api_key
    elif base.api_key is not None:
        fields["api_key"] = base.api_key.get_secret_value()
    return EngineSpec(**fields)


async def get_daemon(request: web.Request) -> web.Response:
    fleet = context_of(request).fleet
    return wire_response(
        DaemonInfo(
            wire_version=WIRE_VERSION,
            pid=os.getpid(),
            version=__version__,
            data_dir=str(fleet.paths.data_dir),
            socket=str(fleet.paths.socket),
            uptime_s=time.time() - request.app[STARTED_AT],
            engines=len(fleet.engines),
        )
    )


async def post_daemon_stop(request: web.Request) -> web.Response:
    body = await json_body(request)
    stop_engines = bool(body.get("stop_engines", False))
    log.info("daemon stop requested by %s (stop_engines=%s)", peer_user(request), stop_engines)
    request.app[STOP_ENGINES].append(stop_engines)
    request.app[STOP].set()
    return web.json_response({"stopping": True, "stop_engines": stop_engines}, status=202)


def _daemon_warnings(ctx: DaemonContext) -> list[str]:
    """What the daemon could not do as configured and did otherwise (never silently)."""
    gateway = ctx.gateway
    return [gateway.settings_error] if gateway is not None and gateway.settings_error else []


async def get_status(request: web.Request) -> web.Response:
    ctx = context_of(request)
    fleet = ctx.fleet
    host = fleet.probe.sample_host()
    now = time.time()
    progress = request.app[STARTUP]
    engines = []
    for st in fleet.statuses():  # a starting engine: its phase, time since launch and its last start's length
        engines.append(EngineInfo.model_validate({**st.to_json(), "startup": progress.of(st, now)}))
    return wire_response(
        StatusAnswer(
            wire_version=WIRE_VERSION,
            daemon=DaemonFacts(pid=os.getpid(), version=__version__, time_s=now, warnings=_daemon_warnings(ctx)),
            host=HostInfo.model_validate(dataclasses.asdict(host)),
            engines=engines,
        )
    )


def engine_info(status: EngineStatus) -> EngineInfo:
    """An engine's status on the wire."""
    return EngineInfo.model_validate(status.to_json())


def _engine_handler(action: str) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handler(request: web.Request) -> web.Response:
        ctx = context_of(request)
        fleet = ctx.fleet
        name = request.match_info["name"]
        body = await json_body(request)
        actions = ActionLog(ctx.store)
        check_name(name)
        before = fleet.engines[name].spec if name in fleet.engines else None
        spec = None
        if action in ("start", "restart"):
            spec = (
                None if name not in fleet.engines and body.get("spec") is None else _spec_from_body(fleet, name, body)
            )
            if name not in fleet.engines and spec is None:
                return error_response(400, f"engine {name} is new: give it a spec (at least a model)")
        after = spec if spec is not None else (before if action != "stop" else None)
        if after is not None and action != "stop":
            after = fleet.launch_spec(after)  # what the fleet will run (a CPU engine's default KV size)
        action_id = actions.begin(
            action, name, peer_user(request), session_id=session_of(request), from_spec=before, to_spec=after
        )
        try:
            raw_drain = body.get("drain_timeout_s")
            drain = float(raw_drain) if raw_drain is not None else None
            if action == "start":
                await fleet.start(name, spec, force=bool(body.get("force")))
            elif action == "restart":
                async with drained(ctx, name, drain):
                    # Ended `done` once the target serves (or failed): see on_change_ended.
                    await fleet.restart(name, spec, force=bool(body.get("force")), action_id=action_id)
            elif action == "stop":
                async with drained(ctx, name, drain):
                    await fleet.stop(name, drain)
        except (ValueError, TypeError, EngineBusy) as e:  # refused: recorded, then answered by the middleware
            actions.end(action_id, "refused", {"error": str(e)})
            raise
        if action != "restart":
            actions.end(action_id, "done")
        log.info("%s %s by %s", action, name, peer_user(request))
        return wire_response(engine_info(fleet.get(name).status()), status=202 if action != "stop" else 200)

    return handler


async def delete_engine(request: web.Request) -> web.Response:
    ctx = context_of(request)
    name = request.match_info["name"]
    actions = ActionLog(ctx.store)
    spec = ctx.fleet.get(name).spec  # 404 for an engine the daemon does not have: nothing recorded
    action_id = actions.begin("remove", name, peer_user(request), session_id=session_of(request), from_spec=spec)
    try:
        await ctx.fleet.remove(name)
    except EngineBusy as e:
        actions.end(action_id, "refused", {"error": str(e)})
        raise
    actions.end(action_id, "done")
    return web.json_response({"removed": name})


async def get_member(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    sup = context_of(request).fleet.get(name)
    st = sup.status()
    key = sup.spec.api_key.get_secret_value() if sup.spec.api_key else None
    log.info(
        "engine %s: its address and API key were read by %s, for a gateway group of another host",
        name,
        peer_user(request),
    )
    return web.json_response(
        {
            "engine": name,
            "state": str(st.state),
            "bind": sup.spec.host,
            "port": st.port,
            "models": [m for m in dict.fromkeys((st.served_model_name, st.model)) if m],
            "api_key": key,
        }
    )


async def get_logs(request: web.Request) -> web.Response:
    path = context_of(request).fleet.get(request.match_info["name"]).log_path
    try:
        max_bytes = min(int(request.query.get("max_bytes", 64 * 1024)), 4 * 1024 * 1024)
        offset = request.query.get("offset")
        offset_i = int(offset) if offset is not None else None
    except ValueError:
        return error_response(400, "offset and max_bytes must be integers")
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return web.json_response({"text": "", "offset": 0, "size": 0})
    start = max(0, size - max_bytes) if offset_i is None else min(max(0, offset_i), size)
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(max_bytes)
    return web.json_response(
        {"text": data.decode("utf-8", errors="replace"), "offset": start + len(data), "size": size}
    )


def add_routes(app: web.Application) -> None:
    app[STOP] = asyncio.Event()
    app[STOP_ENGINES] = []
    app[STARTED_AT] = time.time()
    app[STARTUP] = StartupProgress(app[CONTEXT].store)
    app.router.add_get("/v1/daemon", get_daemon)
    app.router.add_post("/v1/daemon/stop", post_daemon_stop)
    app.router.add_get("/v1/status", get_status)
    app.router.add_post("/v1/engines/{name}/start", _engine_handler("start"))
    app.router.add_post("/v1/engines/{name}/stop", _engine_handler("stop"))
    app.router.add_post("/v1/engines/{name}/restart", _engine_handler("restart"))
    app.router.add_delete("/v1/engines/{name}", delete_engine)
    app.router.add_get("/v1/engines/{name}/logs", get_logs)
    app.router.add_get("/v1/engines/{name}/member", get_member)
