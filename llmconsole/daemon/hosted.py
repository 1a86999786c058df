"""The services the daemon hosts beside supervision, started and closed as one.

Each takes the daemon's context (fleet, store, gateway) and nothing else; the routes find them
here. Order matters on the way in (modes annotate statuses the exporter reads; the run service
drives engines through the same fleet) and the reverse on the way out.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web

from llmconsole.daemon.context import DaemonContext
from llmconsole.daemon.http import ServiceUnavailable
from llmconsole.daemon.services.autopilot_service import AutopilotService
from llmconsole.daemon.services.exporter import DaemonCollector, Exporter
from llmconsole.daemon.services.mode_service import ModeService
from llmconsole.daemon.services.response_service import ResponseService
from llmconsole.daemon.services.run_service import RunService
from llmconsole.daemon.services.tune_service import TuneService


@dataclass(frozen=True)
class HostedServices:
    modes: ModeService
    responses: ResponseService
    exporter: Exporter
    tune: TuneService
    runs: RunService
    autopilot: AutopilotService

    @classmethod
    def build(cls, ctx: DaemonContext) -> HostedServices:
        modes = ModeService(ctx)
        ctx.fleet.status_annotators.append(modes.annotate)
        responses = ResponseService(ctx)
        exporter = Exporter(DaemonCollector(ctx, responses, modes), ctx.data_dir, settings=ctx.settings)
        tune = TuneService(ctx)
        return cls(
            modes=modes,
            responses=responses,
            exporter=exporter,
            tune=tune,
            runs=RunService(ctx),
            autopilot=AutopilotService(ctx, modes, responses, tune),
        )

    async def start(self) -> None:
        await self.exporter.start()
        await self.modes.start()
        await self.responses.start()
        await self.tune.start()

    async def close(self) -> None:
        """Runs first (each puts its engine back on its config), then the rest."""
        await self.runs.close()
        for service in (self.tune, self.responses, self.modes, self.exporter):
            await service.close()


SERVICES = web.AppKey("services", HostedServices)


def services_of(request: web.Request) -> HostedServices:
    services = request.app.get(SERVICES)
    if services is None:
        raise ServiceUnavailable("this daemon hosts no services (modes, alerts, tunes, runs)")
    return services
