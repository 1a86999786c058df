"""The auto memory-mode policy does not restart an engine while requests queue at its door.

Found replaying a day under the autopilot: the standby it started (a second engine on the host)
raised host memory past the balanced threshold, and the policy restarted the primary for a mode
switch at once, with hundreds of requests queued at the gateway. A switch short of the
aggressive level (memory about to run out) now waits for the queue to drain; one at the
aggressive level does not wait."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from llmconsole.daemon.services.mode_service import ModeService
from llmconsole.engine.host import HostSample
from llmconsole.engine.modes.memory import Mode
from llmconsole.engine.modes.policy import PolicySettings, PolicyState
from llmconsole.engine.status import EngineState

GIB = 2**30


class _Host:
    def __init__(self) -> None:
        self.used_bytes = 10 * GIB

    def sample_host(self) -> HostSample:
        return HostSample(None, self.used_bytes, 16 * GIB, (), False, None)


def _service(tmp_path, queued: list[int]) -> tuple[ModeService, _Host, list[tuple[str, Mode]]]:
    host = _Host()
    engine = SimpleNamespace(state=EngineState.READY)
    fleet = SimpleNamespace(probe=host, engines={"demo": engine}, get=lambda name: engine)
    gateway = SimpleNamespace(group_of=lambda name: SimpleNamespace(admission=SimpleNamespace(queued=queued[0])))
    ctx = SimpleNamespace(fleet=fleet, store=None, gateway=gateway, data_dir=tmp_path)
    svc = ModeService(ctx, policy=PolicySettings(min_switch_interval_s=0))  # type: ignore[arg-type]
    applied: list[tuple[str, Mode]] = []

    async def record(name: str, mode: Mode, reason: str | None = None) -> None:
        applied.append((name, mode))

    svc._auto_apply = record  # type: ignore[method-assign]
    svc.auto["demo"] = PolicyState(Mode.PERFORMANCE)
    return svc, host, applied


def _step(svc: ModeService, now_s: float) -> None:
    async def run() -> None:
        await svc.auto_step(now_s)
        await asyncio.sleep(0)  # the switch task it started

    asyncio.run(run())


def test_a_balanced_switch_waits_while_requests_queue_then_happens(tmp_path):
    queued = [200]
    svc, host, applied = _service(tmp_path, queued)
    host.used_bytes = int(16 * GIB * 0.65)  # above balanced (60%), below aggressive (80%)
    _step(svc, 10.0)
    _step(svc, 20.0)
    assert applied == [] and svc.auto["demo"].mode == Mode.PERFORMANCE
    queued[0] = 0
    _step(svc, 30.0)
    assert applied == [("demo", Mode.BALANCED)] and svc.auto["demo"].mode == Mode.BALANCED


def test_an_aggressive_switch_does_not_wait(tmp_path):
    svc, host, applied = _service(tmp_path, [200])
    host.used_bytes = int(16 * GIB * 0.9)
    _step(svc, 10.0)
    assert applied == [("demo", Mode.AGGRESSIVE)]
