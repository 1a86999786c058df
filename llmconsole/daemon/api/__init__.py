"""The daemon's control API: HTTP on a Unix socket (0600), JSON in and out, one module of routes
per resource. Errors from the domain become HTTP answers in one middleware (daemon/http.py)."""

from __future__ import annotations

from aiohttp import web

from llmconsole.daemon.api import audit, autopilot, engines, history, modes, runs, samples, tune, window
from llmconsole.daemon.context import CONTEXT, DaemonContext
from llmconsole.daemon.hosted import SERVICES, HostedServices
from llmconsole.daemon.http import domain_errors, say_wire_version


def make_app(ctx: DaemonContext, services: HostedServices | None = None) -> web.Application:
    """The API over `ctx`; routes of hosted services answer only when `services` is given."""
    app = web.Application(middlewares=[domain_errors])
    app[CONTEXT] = ctx
    app.on_response_prepare.append(say_wire_version)
    if services is not None:
        app[SERVICES] = services
    for routes in (engines, audit, history, window, modes, tune, runs, samples, autopilot):
        routes.add_routes(app)
    return app
