"""The daemon's memory on the control API: operator sessions, history and rollback.

Routes (under /v1):
  POST /sessions                      {"client": "tui"} -> {"session_id": N}; the peer's user is recorded
  POST /sessions/{id}/end
  GET  /engines/{name}/history        the engine's config versions, newest first, with diffs
  POST /engines/{name}/rollback       {"to": CONFIG_ID}? -> restarts on that version (default: the
                                      last known-good one before the current config)

A client names its session with the X-Llmconsole-Session header; the actions it causes carry it.
Every action is committed to the store before it is carried out, and its outcome after
(daemon/services/rollback.py).
"""

from __future__ import annotations

import asyncio

from aiohttp import web

from llmconsole.daemon.context import context_of
from llmconsole.daemon.http import error_response, json_body, peer_user, session_of
from llmconsole.daemon.services.rollback import rollback
from llmconsole.db.versions import versions


async def post_session(request: web.Request) -> web.Response:
    body = await json_body(request)
    client = str(body.get("client") or "cli")[:32]
    sid = context_of(request).need_store().begin_session(client, user=peer_user(request))
    return web.json_response({"session_id": sid}, status=201)


async def post_session_end(request: web.Request) -> web.Response:
    try:
        context_of(request).need_store().end_session(int(request.match_info["id"]))
    except (KeyError, ValueError):
        return error_response(404, f"no session {request.match_info['id']}")
    return web.json_response({"ended": True})


async def get_history(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    entries = await asyncio.to_thread(versions, context_of(request).need_store(), name)
    return web.json_response({"engine": name, "versions": [e.to_json() for e in entries]})


async def post_rollback(request: web.Request) -> web.Response:
    body = await json_body(request)
    to = body.get("to")
    result = await rollback(
        context_of(request),
        request.match_info["name"],
        actor=peer_user(request),
        to_config_id=str(to) if to else None,
        session_id=session_of(request),
    )
    return web.json_response(result, status=202)


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/sessions", post_session)
    app.router.add_post("/v1/sessions/{id}/end", post_session_end)
    app.router.add_get("/v1/engines/{name}/history", get_history)
    app.router.add_post("/v1/engines/{name}/rollback", post_rollback)
