"""Control API routes for auto-tuning (the service itself: daemon/services/tune_service.py):

  POST /v1/engines/{name}/tune/apply  {"overrides": {...}, "slo": {"p99_e2e_ms": 2000}, "guard": {...}?}
                                      a guarded apply of the tuned config; then the engine is watched
  GET  /v1/tune                       the schedule, the watches and the last scheduled runs
  POST /v1/tune/schedule              {"engine": NAME, "interval_s": S, "budget_trials": N, "apply": bool,
                                       "slo": {...}, "knobs": [...], "input_len": "64", ...} or
                                      {"engine": NAME, "off": true}

Errors follow the rest of the API: 400 (bad input: nothing was changed), 404 (unknown engine),
409 (the apply was tried and rolled back).
"""

from __future__ import annotations

import copy

from aiohttp import web

from llmconsole.daemon.context import context_of
from llmconsole.daemon.hosted import services_of
from llmconsole.daemon.http import json_body, peer_user, session_of
from llmconsole.daemon.services.rollback import ActionLog
from llmconsole.engine.metrics.latency import Slo
from llmconsole.engine.tune.guard import GuardSettings


async def post_apply(request: web.Request) -> web.Response:
    body = await json_body(request)
    slo = Slo.parse([f"{k}={v}" for k, v in (body.get("slo") or {}).items()])
    guard = GuardSettings(**(body.get("guard") or {}))
    result = await services_of(request).tune.apply(
        request.match_info["name"],
        dict(body.get("overrides") or {}),
        slo,
        actor=peer_user(request),
        guard=guard,
        detail={"study": body.get("study")},
    )
    return web.json_response(result)


async def get_tune(request: web.Request) -> web.Response:
    return web.json_response(services_of(request).tune.state())


async def post_schedule(request: web.Request) -> web.Response:
    body = await json_body(request)
    tune = services_of(request).tune
    engine = str(body.get("engine") or "")
    with ActionLog(context_of(request).store).change(
        "tune_schedule",
        engine or None,
        peer_user(request),
        session_id=session_of(request),
        before={"schedule": copy.deepcopy(tune.schedule.get(engine))},
    ) as done:
        state = tune.set_schedule(body)
        done["to"] = {"schedule": state["schedule"].get(engine)}
    return web.json_response(state)


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/engines/{name}/tune/apply", post_apply)
    app.router.add_get("/v1/tune", get_tune)
    app.router.add_post("/v1/tune/schedule", post_schedule)
