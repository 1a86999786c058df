"""Control API routes for the gateway's engine groups and their batch windows (the admission
window and its PID controller). `name` in a window route is a group, or an engine (its group):

  GET  /v1/engines/{name}/window    ?trace_points=N: settings, state, the group's counters and
                                    the newest N controller steps (default 600, the whole memory)
  POST /v1/engines/{name}/window    {"target_ms": 800, "signal": "ttft", "min_window": 4,
                                     "max_window": 32, "freeze": true|false, "set": 12}
                                    any subset; "set" fixes the window and freezes the controller
  GET    /v1/groups                 every group served: named ones and each other engine's own,
                                    then removed ones still finishing ("retired": true, no URL)
  PUT    /v1/groups/{name}          {"engines": ["a", "b"]}: form the named group, or change it;
                                    engines of other hosts are named ENGINE@HOST, and "remote":
                                    {"b@gpu1": {"url", "api_key", "models"}} says where each listens
                                    (the CLI asks their hosts' daemons)
  DELETE /v1/groups/{name}          dissolve it; its engines go back to groups of their own
  GET    /v1/gateway                the door: URL, limits, connections and their cap, refusals
                                    by reason, whether a key is required and where it is kept

Errors follow the rest of the API (daemon/http.py): 400 bad input (nothing was changed), 404
unknown engine or group, 503 the daemon runs no gateway.

Every change is an action in the store (who, when, the window and settings, or the group's
engines, from and to), as a config change is: `history`'s audit log and the export's "What
changed" show freezes and windows set by hand like restarts.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from llmconsole.daemon.context import context_of
from llmconsole.daemon.http import error_response, json_body, peer_user, session_of, wire_response
from llmconsole.daemon.services.gateway_service import GatewayService
from llmconsole.daemon.services.rollback import ActionLog
from llmconsole.engine.gateway.membership import UnknownGroup
from llmconsole.engine.gateway.remote import RemoteMember
from llmconsole.wire.gateway import GroupInfo, GroupsAnswer, WindowState

_SETTINGS = ("target_ms", "signal", "min_window", "max_window", "kp", "ki", "kd")


def window_facts(state: dict[str, Any]) -> dict[str, Any]:
    """What a window action changes, from a window state: the window, frozen or not, the settings."""
    return {k: state[k] for k in ("window", "frozen", *_SETTINGS) if k in state}


async def get_window(request: web.Request) -> web.Response:
    gateway = context_of(request).need_gateway()
    try:
        points = int(request.query.get("trace_points", 600))
    except ValueError:
        return error_response(400, "trace_points must be an integer")
    return wire_response(WindowState.model_validate(gateway.window_state(request.match_info["name"], max(0, points))))


async def post_window(request: web.Request) -> web.Response:
    gateway = context_of(request).need_gateway()
    body = await json_body(request)
    unknown = set(body) - set(_SETTINGS) - {"freeze", "set"}
    if unknown:
        return error_response(400, f"unknown fields: {', '.join(sorted(unknown))}")
    freeze, window = body.get("freeze"), body.get("set")
    if freeze is not None and not isinstance(freeze, bool):
        return error_response(400, "freeze must be true or false")
    for key in ("set", "min_window", "max_window"):
        value = body.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            return error_response(400, f"{key} must be an integer")
    name = request.match_info["name"]
    before = gateway.window_state(name, trace_points=0)  # an unknown name: 404, nothing recorded
    with ActionLog(context_of(request).store).change(
        "window",
        name,
        peer_user(request),
        session_id=session_of(request),
        before=window_facts(before),
        detail={"group": before["group"], "asked": body},
    ) as done:
        state = gateway.change_window(
            name, settings={k: body[k] for k in _SETTINGS if k in body}, freeze=freeze, window=window
        )
        await gateway.saved()  # done once on disk
        done["to"] = window_facts(state)
    return wire_response(WindowState.model_validate(state))


async def get_groups(request: web.Request) -> web.Response:
    return wire_response(GroupsAnswer.model_validate({"groups": context_of(request).need_gateway().groups_state()}))


def _members(gateway: GatewayService, name: str) -> list[str] | None:
    """The engines a named group has now (None: no such named group)."""
    groups = gateway.membership.groups
    return list(groups[name]) if name in groups else None


def _remote_members(body: Any) -> dict[str, RemoteMember]:
    """The body's "remote" object: ENGINE@HOST -> {"url", "api_key", "models"}; ValueError
    says what is wrong, never with a key in it."""
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise ValueError('"remote" must be an object: {"ENGINE@HOST": {"url": ..., "api_key": ..., "models": [...]}}')
    return {name: RemoteMember.from_json(name, entry) for name, entry in body.items()}


async def put_group(request: web.Request) -> web.Response:
    ctx = context_of(request)
    gateway = ctx.need_gateway()
    body = await json_body(request)
    engines = body.get("engines")
    if not isinstance(engines, list) or not all(isinstance(e, str) for e in engines):
        return error_response(400, 'request body must be {"engines": ["name", ...]}')
    unknown = set(body) - {"engines", "remote"}
    if unknown:
        return error_response(400, f"unknown fields: {', '.join(sorted(unknown))}")
    try:
        remote = _remote_members(body.get("remote"))
    except ValueError as e:
        return error_response(400, str(e))
    name = request.match_info["name"]
    with ActionLog(ctx.store).change(
        "group", name, peer_user(request), session_id=session_of(request), before={"engines": _members(gateway, name)}
    ) as done:
        state = gateway.set_group(name, engines, remote)
        await gateway.saved()  # done once on disk
        done["to"] = {"engines": _members(gateway, name)}
        if remote:  # where the other hosts' engines are is part of the change; their keys never are
            done["to"]["remote"] = {n: m.url for n, m in sorted(remote.items())}
    if remote:
        await gateway.check_remotes()  # what they answer now, rather than a second from now
        state = gateway.group_state(name)
    return wire_response(GroupInfo.model_validate(state))


async def delete_group(request: web.Request) -> web.Response:
    ctx = context_of(request)
    gateway = ctx.need_gateway()
    name = request.match_info["name"]
    if _members(gateway, name) is None:
        raise UnknownGroup(name)  # 404, nothing recorded
    with ActionLog(ctx.store).change(
        "group", name, peer_user(request), session_id=session_of(request), before={"engines": _members(gateway, name)}
    ) as done:
        engines = gateway.remove_group(name)
        await gateway.saved()  # done once on disk
        done["to"] = {"engines": None}
    return web.json_response({"removed": name, "engines": engines})


async def get_gateway(request: web.Request) -> web.Response:
    return web.json_response(context_of(request).need_gateway().door_state())


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/engines/{name}/window", get_window)
    app.router.add_post("/v1/engines/{name}/window", post_window)
    app.router.add_get("/v1/groups", get_groups)
    app.router.add_put("/v1/groups/{name}", put_group)
    app.router.add_delete("/v1/groups/{name}", delete_group)
    app.router.add_get("/v1/gateway", get_gateway)
