"""Sweeps and tunes run in the daemon (daemon/services/run_service.py), on the control API.

Routes (under /v1):
  POST /runs                {"kind": "sweep"|"tune", "request": {...}} -> 202 the run; 400 a bad
                            request (nothing started), 404 unknown engine, 409 the engine is not
                            ready or another run holds it
  GET  /runs                ?engine=NAME: the runs kept (under way, and the last finished ones)
  GET  /runs/{id}           ?since=N: the run, its progress events from the N-th on, its outcome
  POST /runs/{id}/cancel    the run stops after what is under way and puts the engine back
"""

from __future__ import annotations

from aiohttp import web

from llmconsole.daemon.hosted import services_of
from llmconsole.daemon.http import error_response, json_body, peer_user, wire_response
from llmconsole.wire.runs import RunAnswer, RunsAnswer, RunSummary


def _run_id(request: web.Request) -> int:
    try:
        return int(request.match_info["id"])
    except ValueError:
        raise ValueError(f"run ids are numbers, not {request.match_info['id']!r}") from None


async def post_run(request: web.Request) -> web.Response:
    body = await json_body(request)
    kind, req = body.get("kind"), body.get("request")
    if not isinstance(kind, str) or not isinstance(req, dict):
        return error_response(400, 'request body must be {"kind": "sweep"|"tune", "request": {...}}')
    run = services_of(request).runs.start(kind, req, actor=peer_user(request))
    return wire_response(RunAnswer.model_validate(run.to_json()), status=202)


async def get_runs(request: web.Request) -> web.Response:
    engine = request.query.get("engine")
    runs = [r.summary() for r in services_of(request).runs.runs.values() if engine is None or r.engine == engine]
    return wire_response(RunsAnswer.model_validate({"runs": runs}))


async def get_run(request: web.Request) -> web.Response:
    try:
        since = max(0, int(request.query.get("since", 0)))
    except ValueError:
        return error_response(400, "since must be an integer")
    return wire_response(RunAnswer.model_validate(services_of(request).runs.get(_run_id(request)).to_json(since)))


async def post_cancel(request: web.Request) -> web.Response:
    return wire_response(
        RunSummary.model_validate(services_of(request).runs.cancel(_run_id(request)).summary()), status=202
    )


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/runs", post_run)
    app.router.add_get("/v1/runs", get_runs)
    app.router.add_get("/v1/runs/{id}", get_run)
    app.router.add_post("/v1/runs/{id}/cancel", post_cancel)
