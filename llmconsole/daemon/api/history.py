"""The daemon's memory on the control API: operator sessions, the audit log, history, rollback.

Routes (under /v1):
  POST /sessions                      {"client": "tui"} -> {"session_id": N}; the peer's user is recorded
  POST /sessions/{id}/end
  GET  /engines/{name}/history        the engine's config versions, newest first, with diffs
  POST /engines/{name}/rollback       {"to": CONFIG_ID}? -> restarts on that version (default: the
                                      last known-good one before the current config)

A client names its session with the X-Llmconsole-Session header; the actions it causes carry it.
Every action is committed to the store before it is carried out, and its outcome after.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiohttp import web

from llmconsole.db import Store
from llmconsole.db.versions import RollbackError, choose_target, spec_from_version, versions
from llmconsole.db.recorder import Recorder
from llmconsole.engine.fleet import Fleet, UnknownEngine
from llmconsole.engine.spec import EngineSpec
from llmconsole.engine.supervisor import EngineBusy

log = logging.getLogger(__name__)

STORE = web.AppKey("store", Store)
RECORDER = web.AppKey("recorder", Recorder)
SESSION_HEADER = "X-Llmconsole-Session"


def session_of(request: web.Request) -> int | None:
    raw = request.headers.get(SESSION_HEADER)
    try:
        return int(raw) if raw else None
    except ValueError:
        return None


class ActionLog:
    """Writes an action before it happens and its outcome after; a daemon with no store (unit
    tests of the API) logs nothing."""

    def __init__(self, store: Store | None):
        self.store = store

    def begin(self, kind: str, engine: str | None, actor: str, *, session_id: int | None = None,
              from_spec: EngineSpec | None = None, to_spec: EngineSpec | None = None,
              automatic: bool = False, detail: dict[str, Any] | None = None) -> int | None:
        if self.store is None:
            return None
        for spec in (from_spec, to_spec):  # an action names configs the store must hold
            if spec is not None:
                self.store.record_config(spec.config_id, spec.public_dict())
        return self.store.record_action(
            kind, engine=engine, actor=actor, session_id=session_id,
            from_config_id=from_spec.config_id if from_spec else None,
            to_config_id=to_spec.config_id if to_spec else None,
            automatic=automatic, detail=detail)

    def end(self, action_id: int | None, outcome: str, detail: dict[str, Any] | None = None) -> None:
        if self.store is not None and action_id is not None:
            self.store.update_action_outcome(action_id, outcome, detail)


async def rollback(fleet: Fleet, store: Store, name: str, *, actor: str, to_config_id: str | None = None,
                   automatic: bool = False, session_id: int | None = None, reason: str | None = None) -> dict[str, Any]:
    """Restart `name` on a stored version. Raises RollbackError (nothing changed) when there is
    no such version or it cannot run any more."""
    sup = fleet.get(name)
    current = sup.spec
    actions = ActionLog(store)
    try:
        target = choose_target(store, name, current.config_id, to_config_id)
        spec = spec_from_version(target, current)
    except RollbackError as e:
        action_id = actions.begin("rollback", name, actor, session_id=session_id, automatic=automatic,
                                  from_spec=current, detail={"reason": reason})
        actions.end(action_id, "refused", {"error": str(e)})
        raise
    action_id = actions.begin("rollback", name, actor, session_id=session_id, automatic=automatic,
                              from_spec=current, to_spec=spec, detail={"reason": reason} if reason else None)
    try:
        await fleet.restart(name, spec)
    except Exception as e:
        actions.end(action_id, "failed", {"error": str(e)})
        raise
    actions.end(action_id, "applied")
    log.info("rolled %s back from %s to %s (%s)", name, current.config_id, target.config_id,
             "automatic" if automatic else actor)
    return {"engine": name, "from_config_id": current.config_id, "to_config_id": spec.config_id,
            "action_id": action_id}


def on_config_failed(fleet: Fleet, store: Store):
    """The fleet's listener for configs the supervisor gave up on (a crash loop, or a start that
    never came up): roll the engine back to its last known-good config, if it has one."""

    def listener(name: str) -> None:
        async def go() -> None:
            sup = fleet.get(name)
            reason = sup.last_error
            try:
                choose_target(store, name, sup.spec.config_id)
            except RollbackError as e:  # a new engine's first config: nothing to go back to
                log.warning("engine %s failed on config %s and stays down: %s", name, sup.spec.config_id, e)
                return
            try:
                await rollback(fleet, store, name, actor="llmconsole", automatic=True,
                               reason=f"config {sup.spec.config_id} failed: {reason}")
            except Exception:
                log.exception("automatic rollback of %s failed", name)

        # The supervisor calls this from its own task, holding its lock: roll back afterwards.
        asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(go()))

    return listener


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message, "details": []}, status=status)


async def post_session(request: web.Request) -> web.Response:
    from llmconsole.daemon.api.engines import _json_body, peer_user

    body = await _json_body(request)
    client = str(body.get("client") or "cli")[:32]
    sid = request.app[STORE].begin_session(client, user=peer_user(request))
    return web.json_response({"session_id": sid}, status=201)


async def post_session_end(request: web.Request) -> web.Response:
    try:
        request.app[STORE].end_session(int(request.match_info["id"]))
    except (KeyError, ValueError):
        return _error(404, f"no session {request.match_info['id']}")
    return web.json_response({"ended": True})


async def get_history(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    entries = await asyncio.to_thread(versions, request.app[STORE], name)
    return web.json_response({"engine": name, "versions": [e.to_json() for e in entries]})


async def post_rollback(request: web.Request) -> web.Response:
    from llmconsole.daemon.api.engines import FLEET, _json_body, peer_user

    body = await _json_body(request)
    name = request.match_info["name"]
    to = body.get("to")
    try:
        result = await rollback(request.app[FLEET], request.app[STORE], name, actor=peer_user(request),
                                to_config_id=str(to) if to else None, session_id=session_of(request))
    except RollbackError as e:
        return _error(400, str(e))
    except UnknownEngine as e:
        return _error(404, str(e))
    except EngineBusy as e:
        return _error(409, str(e))
    return web.json_response(result, status=202)


def add_routes(app: web.Application, store: Store, recorder: Recorder) -> None:
    app[STORE] = store
    app[RECORDER] = recorder
    app.router.add_post("/v1/sessions", post_session)
    app.router.add_post("/v1/sessions/{id}/end", post_session_end)
    app.router.add_get("/v1/engines/{name}/history", get_history)
    app.router.add_post("/v1/engines/{name}/rollback", post_rollback)
