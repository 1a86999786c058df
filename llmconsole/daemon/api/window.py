"""Control API routes for the gateway's engine groups and their batch windows (the admission
window and its PID controller). `name` in a window route is a group, or an engine (its group):

  GET  /v1/engines/{name}/window    ?trace_points=N: settings, state, the group's counters and
                                    the newest N controller steps (default 600, the whole memory)
  POST /v1/engines/{name}/window    {"target_ms": 800, "signal": "ttft", "min_window": 4,
                                     "max_window": 32, "freeze": true|false, "set": 12}
                                    any subset; "set" fixes the window and freezes the controller
  GET    /v1/groups                 every group served: named ones and each other engine's own,
                                    then removed ones still finishing ("retired": true, no URL)
  PUT    /v1/groups/{name}          {"engines": ["a", "b"]}: form the named group, or change it
  DELETE /v1/groups/{name}          dissolve it; its engines go back to groups of their own

Errors follow the rest of the API: 400 (bad input: nothing was changed), 404 (unknown engine),
503 (the daemon runs no gateway).
"""

from __future__ import annotations

from aiohttp import web

from llmconsole.engine.fleet import UnknownEngine
from llmconsole.daemon.services.gateway_service import GatewayService
from llmconsole.engine.gateway.membership import GroupError, UnknownGroup

GATEWAY = web.AppKey("gateway", GatewayService)

_SETTINGS = ("target_ms", "signal", "min_window", "max_window", "kp", "ki", "kd")


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message, "details": []}, status=status)


def _service(request: web.Request) -> GatewayService | None:
    return request.app.get(GATEWAY)


async def get_window(request: web.Request) -> web.Response:
    service = _service(request)
    if service is None:
        return _error(503, "this daemon runs no gateway")
    try:
        points = int(request.query.get("trace_points", 600))
        return web.json_response(service.window_state(request.match_info["name"], max(0, points)))
    except ValueError:
        return _error(400, "trace_points must be an integer")
    except UnknownEngine as e:
        return _error(404, str(e))


async def post_window(request: web.Request) -> web.Response:
    service = _service(request)
    if service is None:
        return _error(503, "this daemon runs no gateway")
    from llmconsole.daemon.api.engines import _json_body  # api.py imports this module

    body = await _json_body(request)
    unknown = set(body) - set(_SETTINGS) - {"freeze", "set"}
    if unknown:
        return _error(400, f"unknown fields: {', '.join(sorted(unknown))}")
    freeze, window = body.get("freeze"), body.get("set")
    if freeze is not None and not isinstance(freeze, bool):
        return _error(400, "freeze must be true or false")
    for key in ("set", "min_window", "max_window"):
        value = body.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            return _error(400, f"{key} must be an integer")
    try:
        state = service.change_window(
            request.match_info["name"], settings={k: body[k] for k in _SETTINGS if k in body},
            freeze=freeze, window=window,
        )
    except UnknownEngine as e:
        return _error(404, str(e))
    except (ValueError, TypeError) as e:
        return _error(400, str(e))
    return web.json_response(state)


async def get_groups(request: web.Request) -> web.Response:
    service = _service(request)
    if service is None:
        return _error(503, "this daemon runs no gateway")
    return web.json_response({"groups": service.groups_state()})


async def put_group(request: web.Request) -> web.Response:
    service = _service(request)
    if service is None:
        return _error(503, "this daemon runs no gateway")
    from llmconsole.daemon.api.engines import _json_body

    engines = (await _json_body(request)).get("engines")
    if not isinstance(engines, list) or not all(isinstance(e, str) for e in engines):
        return _error(400, 'request body must be {"engines": ["name", ...]}')
    try:
        return web.json_response(service.set_group(request.match_info["name"], engines))
    except GroupError as e:
        return _error(400, str(e))


async def delete_group(request: web.Request) -> web.Response:
    service = _service(request)
    if service is None:
        return _error(503, "this daemon runs no gateway")
    name = request.match_info["name"]
    try:
        engines = service.remove_group(name)
    except UnknownGroup as e:
        return _error(404, str(e))
    return web.json_response({"removed": name, "engines": engines})


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/engines/{name}/window", get_window)
    app.router.add_post("/v1/engines/{name}/window", post_window)
    app.router.add_get("/v1/groups", get_groups)
    app.router.add_put("/v1/groups/{name}", put_group)
    app.router.add_delete("/v1/groups/{name}", delete_group)
