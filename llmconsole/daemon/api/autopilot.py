"""Control API routes for the autopilot (the service: daemon/services/autopilot_service.py):

  GET    /v1/autopilot            every group the autopilot drives: each control, what it did, why
  GET    /v1/autopilot/{name}     one of them (an engine, or its group)
  POST   /v1/autopilot/{name}     {"slo": {"p99_e2e_ms": 2000}, "mode": true, "standby": true,
                                   "standby_for_s": S?, "tune_interval_s": S | null,
                                   "tune_budget_trials": N, "window_bounds": [MIN, MAX]?}: on
  DELETE /v1/autopilot/{name}     off: each control back as the autopilot found it

Errors follow the rest of the API: 400 bad input (nothing was changed), 404 unknown engine or
group, or an autopilot that is not on, 503 no gateway.
"""

from __future__ import annotations

from aiohttp import web

from llmconsole.daemon.hosted import services_of
from llmconsole.daemon.http import json_body, peer_user, session_of, wire_response
from llmconsole.engine.autopilot.plan import AutopilotPlan
from llmconsole.wire.autopilot import AutopilotAnswer


async def get_all(request: web.Request) -> web.Response:
    return wire_response(AutopilotAnswer.model_validate(services_of(request).autopilot.status()))


async def get_one(request: web.Request) -> web.Response:
    svc = services_of(request).autopilot
    return wire_response(AutopilotAnswer.model_validate(svc.status(request.match_info["name"])))


async def post_on(request: web.Request) -> web.Response:
    body = await json_body(request)
    try:
        plan = AutopilotPlan.from_json(body)
    except TypeError as e:
        raise ValueError(str(e)) from None
    state = await services_of(request).autopilot.turn_on(
        request.match_info["name"], plan, actor=peer_user(request), session_id=session_of(request)
    )
    return wire_response(AutopilotAnswer.model_validate(state))


async def delete_off(request: web.Request) -> web.Response:
    state = await services_of(request).autopilot.turn_off(
        request.match_info["name"], actor=peer_user(request), session_id=session_of(request)
    )
    return wire_response(AutopilotAnswer.model_validate(state))


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/autopilot", get_all)
    app.router.add_get("/v1/autopilot/{name}", get_one)
    app.router.add_post("/v1/autopilot/{name}", post_on)
    app.router.add_delete("/v1/autopilot/{name}", delete_off)
