"""What every route of the control API shares: reading a request (its JSON body, who sent it,
which operator session it belongs to) and one place that turns the domain's errors into HTTP.

Handlers raise the domain's own exceptions; `domain_errors` maps them, so a route says what it
does, not how each failure reads on the wire. Every error is {"error": "...", "details": [...]}:
400 bad input (nothing was changed), 404 unknown engine or group, 409 not allowed in the current
state (or an apply that was tried and rolled back), 503 a service this daemon does not run.
"""

from __future__ import annotations

import logging
import os
import pwd
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from llmconsole.engine.fleet import UnknownEngine
from llmconsole.engine.modes.guarded_apply import ApplyFailed, ApplyRefused
from llmconsole.engine.plan.validate import ConfigDoesNotFit
from llmconsole.engine.spec import validation_messages
from llmconsole.engine.supervisor import EngineBusy
from llmconsole.paths import peer_uid, trusted_uid
from llmconsole.wire import WIRE_HEADER, WIRE_VERSION
from llmconsole.wire.base import WireModel

log = logging.getLogger(__name__)

SESSION_HEADER = "X-Llmconsole-Session"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class NotFound(LookupError):
    """Something the daemon keeps by name or number (a run, say) that it does not have."""


class ServiceUnavailable(RuntimeError):
    """The daemon runs without the service a route needs (a daemon with no gateway, say)."""


def error_response(status: int, message: str, details: list[str] | None = None) -> web.Response:
    return web.json_response({"error": message, "details": details or []}, status=status)


def wire_response(answer: WireModel, status: int = 200) -> web.Response:
    """An answer through its wire model: what leaves the daemon is what clients' models read."""
    return web.json_response(answer.to_wire(), status=status)


async def say_wire_version(request: web.Request, response: web.StreamResponse) -> None:
    """Every answer, errors included, names the wire schema it speaks (llmconsole/wire)."""
    response.headers[WIRE_HEADER] = str(WIRE_VERSION)


def _bad_body(message: str) -> web.HTTPBadRequest:
    return web.HTTPBadRequest(text=f'{{"error": "{message}", "details": []}}', content_type="application/json")


async def json_body(request: web.Request) -> dict[str, Any]:
    """The request's JSON object; an empty body is {}. Anything else is a 400 that says why."""
    if not request.can_read_body:
        return {}
    try:
        body = await request.json()
    except ValueError:
        raise _bad_body("request body is not JSON") from None
    if not isinstance(body, dict):
        raise _bad_body("request body must be a JSON object")
    return body


def request_uid(request: web.Request) -> int | None:
    """The uid of the process on the other end of the request's socket (SO_PEERCRED)."""
    sock = request.transport.get_extra_info("socket") if request.transport else None
    if sock is None:
        return None
    try:
        return peer_uid(sock)
    except (AttributeError, OSError):
        return None


def peer_user(request: web.Request) -> str:
    """Who is on the other end of the socket (SO_PEERCRED), for the daemon's audit log."""
    uid = request_uid(request)
    if uid is None:
        return "unknown"
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return "unknown"


@web.middleware
async def this_user_only(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The control socket answers this user (and root) only. Its folder and mode keep others out
    already; this holds when they were loosened (a chmod, a shared runtime dir), and for a
    socket that is not a Unix one (the kernel cannot say who is there) nobody is let in."""
    sock = request.transport.get_extra_info("socket") if request.transport else None
    uid = request_uid(request) if sock is not None and sock.family == socket.AF_UNIX else None
    if uid is None or not trusted_uid(uid):
        who = "a peer the kernel cannot name" if uid is None else f"uid {uid}"
        log.warning(
            "refused %s %s from %s: this daemon answers uid %d only", request.method, request.path, who, os.getuid()
        )
        return error_response(403, f"this daemon answers its own user (uid {os.getuid()}) only, not {who}")
    return await handler(request)


def session_of(request: web.Request) -> int | None:
    """The operator session a client named in its X-Llmconsole-Session header, if any."""
    raw = request.headers.get(SESSION_HEADER)
    try:
        return int(raw) if raw else None
    except ValueError:
        return None


def error_for(e: Exception) -> web.Response | None:
    """The HTTP answer to one of the domain's errors; None for anything else (a bug: 500)."""
    if isinstance(e, (UnknownEngine, NotFound)):  # UnknownGroup too
        return error_response(404, str(e))
    if isinstance(e, ValidationError):
        return error_response(400, "invalid engine spec", validation_messages(e))
    if isinstance(e, ConfigDoesNotFit):
        return error_response(400, str(e), e.verdict.details())
    if isinstance(e, ApplyRefused):
        return error_response(400, str(e), e.details)
    if isinstance(e, ApplyFailed):
        return error_response(409, str(e), [f"restored config: {e.restored_config_id}"])
    if isinstance(e, EngineBusy):
        return error_response(409, str(e))
    if isinstance(e, ServiceUnavailable):
        return error_response(503, str(e))
    if isinstance(e, (ValueError, TypeError)):  # RollbackError, GroupError, ModeError, bad values
        return error_response(400, str(e))
    return None


@web.middleware
async def domain_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException:
        raise
    except Exception as e:
        mapped = error_for(e)
        if mapped is None:
            raise
        return mapped
