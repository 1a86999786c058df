"""Control API routes for auto-tuning (the service itself is daemon/services/tune_service.py):

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

from aiohttp import web

from llmconsole.daemon.services.tune_service import TuneService
from llmconsole.engine.modes.guarded_apply import ApplyFailed, ApplyRefused
from llmconsole.engine.metrics.latency import Slo
from llmconsole.engine.tune.guard import GuardSettings


TUNE = web.AppKey("tune", TuneService)


def _error(status: int, message: str, details: list[str] | None = None) -> web.Response:
    return web.json_response({"error": message, "details": details or []}, status=status)


async def post_apply(request: web.Request) -> web.Response:
    from llmconsole.daemon.api.engines import _json_body, peer_user
    from llmconsole.engine.fleet import UnknownEngine

    body = await _json_body(request)
    name = request.match_info["name"]
    try:
        slo = Slo.parse([f"{k}={v}" for k, v in (body.get("slo") or {}).items()])
        guard = GuardSettings(**(body.get("guard") or {}))
        result = await request.app[TUNE].apply(name, dict(body.get("overrides") or {}), slo,
                                               actor=peer_user(request), guard=guard,
                                               detail={"study": body.get("study")})
    except UnknownEngine as e:
        return _error(404, str(e))
    except ApplyRefused as e:
        return _error(400, str(e), e.details)
    except ApplyFailed as e:
        return _error(409, str(e))
    except (ValueError, TypeError) as e:
        return _error(400, str(e))
    return web.json_response(result)


async def get_tune(request: web.Request) -> web.Response:
    return web.json_response(request.app[TUNE].state())


async def post_schedule(request: web.Request) -> web.Response:
    from llmconsole.daemon.api.engines import _json_body
    from llmconsole.engine.fleet import UnknownEngine

    body = await _json_body(request)
    try:
        return web.json_response(request.app[TUNE].set_schedule(body))
    except UnknownEngine as e:
        return _error(404, str(e))
    except ValueError as e:
        return _error(400, str(e))


async def start_services(app: web.Application, fleet, store, gateway, rollback) -> list:
    """The tune service wired into the daemon; returns what to close on the way out."""
    svc = app[TUNE] = TuneService(fleet, store, gateway, rollback)
    app.router.add_post("/v1/engines/{name}/tune/apply", post_apply)
    app.router.add_get("/v1/tune", get_tune)
    app.router.add_post("/v1/tune/schedule", post_schedule)
    await svc.start()
    return [svc]

