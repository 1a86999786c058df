"""The sweep runner's and the tuner's engine controller inside the daemon: each point or trial
restarts the engine through the fleet (the same supervised restart an operator's change takes),
and the window bounds move through the gateway service. The scheduled tune and the runs a
console starts in the daemon drive their runners through this."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any

from llmconsole.daemon.services.gateway_service import GatewayService
from llmconsole.engine.fleet import Fleet
from llmconsole.engine.status import EngineState
from llmconsole.engine.sweep.probe import ResourceSample, resource_sample
from llmconsole.engine.sweep.runner import EngineStartFailed, EngineTarget
from llmconsole.engine.tune.ranges import EngineFacts


class FleetController:
    """Restarts through the fleet, the window bounds through the gateway service."""

    def __init__(self, fleet: Fleet, name: str, ready_timeout_s: float = 900.0, gateway: GatewayService | None = None):
        self.fleet, self.name, self.ready_timeout_s, self.gateway = fleet, name, ready_timeout_s, gateway

    def _gateway(self) -> GatewayService:
        if self.gateway is None:
            raise ValueError("this daemon runs no gateway: the window cannot be tuned")
        return self.gateway

    async def gateway_url(self) -> str:
        svc = self._gateway()
        return svc.gateway.group_url(svc.group(self.name).name)  # the engine's group's door

    async def window(self) -> dict[str, int]:
        s = self._gateway().group(self.name).controller.settings
        return {"min_window": s.min_window, "max_window": s.max_window}

    async def set_window(self, bounds: dict[str, int]) -> None:
        self._gateway().change_window(self.name, settings=dict(bounds))  # ValueError: refused, unchanged

    async def facts(self, *, with_window: bool) -> EngineFacts:
        """What the tuner's ranges come from: the engine as it runs now, and the gateway's window
        bounds when a knob moves them."""
        sup = self.fleet.get(self.name)
        window = await self.window() if with_window else None
        st = sup.status()
        return EngineFacts(
            model=str(sup.spec.model),
            device=str(st.device or "cpu"),
            spec=sup.spec.public_dict(),
            window=window,
            custom_kernel_refusal=st.custom_kernel_refusal,
        )

    def _target(self) -> EngineTarget:
        sup = self.fleet.get(self.name)
        st = sup.status()
        # An engine that is not serving (after a failed start, say) has no URL: the target still
        # says which config it is on, which is what the runners compare before a restart.
        return EngineTarget(
            st.url or "", st.served_model_name, sup.spec.model, sup.spec.config_id, sup.spec.public_dict()
        )

    async def current(self) -> EngineTarget:
        return self._target()

    async def apply(self, overrides: dict[str, Any]) -> EngineTarget:
        sup = self.fleet.get(self.name)
        try:
            spec = sup.spec.model_copy(update=overrides)
            spec = self.fleet.launch_spec(type(spec).model_validate(spec.model_dump()))
            await self.fleet.restart(self.name, spec)
        except Exception as e:  # the fit check's refusal, a bad value: this config cannot run
            raise EngineStartFailed(str(e)) from None
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            if sup.state == EngineState.READY and sup.status().url:
                return self._target()
            if (
                sup.state in (EngineState.FAILED, EngineState.STOPPED, EngineState.CRASHED)
                or sup.spec.config_id != spec.config_id
            ):
                raise EngineStartFailed(sup.last_error or str(sup.state))
            await asyncio.sleep(0.5)
        raise EngineStartFailed(f"not ready within {self.ready_timeout_s:.0f} s")

    async def restore(self, original: EngineTarget) -> EngineTarget:
        return await self.apply(original.spec)

    async def resources(self) -> ResourceSample:
        host = self.fleet.probe.sample_host()  # cached and cheap, as the status route takes it
        return resource_sample(self.fleet.get(self.name).status().to_json(), dataclasses.asdict(host))
