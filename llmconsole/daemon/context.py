"""The one object the daemon's services share: its fleet, its store, its gateway, its settings.

Services and routes take this instead of loose `fleet, store, gateway` parameters, so what a
service may touch is written down once and typed. The store and the gateway are optional: unit
tests build daemons without them, and a route that needs one answers 503 where it is missing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from llmconsole.daemon.http import ServiceUnavailable
from llmconsole.daemon.services.gateway_service import GatewayService
from llmconsole.db import Store
from llmconsole.db.recorder import Recorder
from llmconsole.engine.fleet import Fleet
from llmconsole.settings import Resolved, load


@dataclass(frozen=True)
class DaemonContext:
    fleet: Fleet
    store: Store | None = None
    gateway: GatewayService | None = None
    recorder: Recorder | None = None
    # The daemon's settings (llmconsole/settings), resolved once at its start; a context built
    # without them (unit tests) resolves this process's.
    settings: Resolved = field(default_factory=load)

    @property
    def data_dir(self) -> Path:
        return self.fleet.paths.data_dir

    def need_gateway(self) -> GatewayService:
        if self.gateway is None:
            raise ServiceUnavailable("this daemon runs no gateway")
        return self.gateway

    def need_store(self) -> Store:
        if self.store is None:
            raise ServiceUnavailable("this daemon keeps no history database")
        return self.store


CONTEXT = web.AppKey("context", DaemonContext)


def context_of(request: web.Request) -> DaemonContext:
    return request.app[CONTEXT]
