"""Memory modes, alerts and automated responses on the control API (the services behind them:
daemon/services/mode_service.py, response_service.py, exporter.py).

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
import copy
import time

from aiohttp import web

from llmconsole.daemon.context import context_of
from llmconsole.daemon.hosted import services_of
from llmconsole.daemon.http import error_response, json_body, peer_user, session_of, wire_response
from llmconsole.daemon.services.rollback import ActionLog
from llmconsole.wire.alerts import AlertsAnswer


async def get_mode(request: web.Request) -> web.Response:
    return web.json_response(services_of(request).modes.state(request.match_info["name"]))


async def post_mode(request: web.Request) -> web.Response:
    body = await json_body(request)
    mode, budget = body.get("mode"), body.get("budget_bytes")
    if not isinstance(mode, str):
        return error_response(400, "give a mode: performance, balanced, aggressive or auto")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0):
        return error_response(400, "budget_bytes must be a positive integer")
    result = await services_of(request).modes.set_mode(
        request.match_info["name"],
        mode,
        actor=peer_user(request),
        force=bool(body.get("force")),
        budget_bytes=budget,
        session_id=session_of(request),
    )
    return web.json_response(result)


async def get_alerts(request: web.Request) -> web.Response:
    svc = services_of(request).responses
    since = time.time() - float(request.query.get("since_s", 86400))
    alerts = await asyncio.to_thread(svc.store.alerts, since=since)
    actions = await asyncio.to_thread(svc.store.actions, since=since)
    return wire_response(
        AlertsAnswer.model_validate(
            {
                "active": svc.alert_states(),
                "alerts": [
                    {
                        "id": a.id,
                        "at": a.at,
                        "engine": a.engine,
                        "rule": a.rule,
                        "severity": a.severity,
                        "state": a.state,
                        "resolved_at": a.resolved_at,
                        "detail": a.detail,
                    }
                    for a in alerts
                ],
                "responses": [
                    {
                        "id": a.id,
                        "at": a.at,
                        "engine": a.engine,
                        "kind": a.kind,
                        "outcome": a.outcome,
                        "detail": a.detail,
                    }
                    for a in actions
                    if a.kind.startswith("response:")
                ],
                "settings": svc.settings,
            }
        )
    )


async def get_response_config(request: web.Request) -> web.Response:
    return web.json_response(services_of(request).responses.settings)


async def post_response_config(request: web.Request) -> web.Response:
    body = await json_body(request)
    responses = services_of(request).responses
    with ActionLog(context_of(request).store).change(
        "responses", None, peer_user(request), session_id=session_of(request), before=copy.deepcopy(responses.settings)
    ) as done:
        done["to"] = await responses.configure(body)
    return web.json_response(responses.settings)


async def post_undo(request: web.Request) -> web.Response:
    try:
        action_id = int(request.match_info["id"])
    except ValueError:
        return error_response(400, f"no response {request.match_info['id']!r}: give its number")
    return web.json_response(await services_of(request).responses.undo(action_id, actor=peer_user(request)))


async def get_exporter(request: web.Request) -> web.Response:
    return web.json_response(services_of(request).exporter.info())


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/engines/{name}/mode", get_mode)
    app.router.add_post("/v1/engines/{name}/mode", post_mode)
    app.router.add_get("/v1/alerts", get_alerts)
    app.router.add_get("/v1/responses/config", get_response_config)
    app.router.add_post("/v1/responses/config", post_response_config)
    app.router.add_post("/v1/responses/{id}/undo", post_undo)
    app.router.add_get("/v1/exporter", get_exporter)
