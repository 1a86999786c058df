"""The store's history and exports on the control API: the daemon is the one owner of the SQLite
store, and `llmconsole history` and `llmconsole export` read it here (llmconsole/wire/history.py
holds the shapes).

Routes (under /v1):
  GET  /history    ?engine=NAME&actions=true: each engine's config versions, newest first, with
                   their diffs from the config each was derived from; with actions, each engine's
                   action log too. 404 an engine that never ran and that the daemon does not know.
  POST /export     {"out_dir": ABSOLUTE PATH, "session_id"?, "since_s"?}: the bundle, written by
                   the daemon into that folder (new, or empty and this user's; files 0600, never
                   through a link). 400 a folder refused or a session that does not exist:
                   nothing was written.
"""

from __future__ import annotations

import asyncio

from aiohttp import web
from pydantic import ValidationError

from llmconsole.daemon.context import context_of
from llmconsole.daemon.http import NotFound, error_response, json_body, peer_user
from llmconsole.daemon.services.bundle import write_bundle
from llmconsole.db import Store
from llmconsole.db.versions import versions
from llmconsole.engine.spec import validation_messages
from llmconsole.export_folder import ExportError
from llmconsole.wire.history import (
    ActionEntry,
    ConfigVersionEntry,
    ExportAnswer,
    ExportRequest,
    HistoryAnswer,
    HistoryQuery,
)


def _history(store: Store, query: HistoryQuery, known: set[str]) -> HistoryAnswer:
    ran = sorted({r.engine for r in store.runs()})
    if query.engine is not None and query.engine not in ran and query.engine not in known:
        also = f" (engines with a history: {', '.join(ran)})" if ran else ""
        raise NotFound(f"no engine named {query.engine!r} has run{also}")
    engines = [query.engine] if query.engine is not None else ran
    listing = {
        name: [ConfigVersionEntry.model_validate(v.to_json()) for v in versions(store, name)] for name in engines
    }
    actions = None
    if query.actions:
        actions = {
            name: [
                ActionEntry(
                    id=a.id,
                    at=a.at,
                    actor=a.actor,
                    kind=a.kind,
                    from_config_id=a.from_config_id,
                    to_config_id=a.to_config_id,
                    outcome=a.outcome,
                    automatic=a.automatic,
                    detail=a.detail,
                )
                for a in store.actions(engine=name)
            ]
            for name in engines
        }
    return HistoryAnswer(engines=listing, actions=actions)


async def get_history(request: web.Request) -> web.Response:
    try:
        query = HistoryQuery.model_validate(dict(request.query))
    except ValidationError as e:
        return error_response(400, "invalid history query", validation_messages(e))
    ctx = context_of(request)
    answer = await asyncio.to_thread(_history, ctx.need_store(), query, set(ctx.fleet.engines))
    return web.json_response(answer.model_dump(mode="json"))


async def post_export(request: web.Request) -> web.Response:
    try:
        export = ExportRequest.model_validate(await json_body(request))
    except ValidationError as e:
        return error_response(400, "invalid export request", validation_messages(e))
    ctx = context_of(request)
    store = ctx.need_store()
    try:
        result = await asyncio.to_thread(write_bundle, store, ctx.fleet.paths, export, user=peer_user(request))
    except ExportError as e:
        return error_response(400, str(e))
    answer = ExportAnswer(
        out_dir=str(result.out_dir),
        since_s=result.span.since_s,
        until_s=result.span.until_s,
        files=list(result.files),
        counts=list(result.counts),
    )
    return web.json_response(answer.model_dump(mode="json"))


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/history", get_history)
    app.router.add_post("/v1/export", post_export)
