"""The gateway's engines, this host's and other hosts', behind one interface, followed by
subscription: a group learns an engine's change when its supervisor publishes it."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from llmconsole.daemon.services.gateway_service import GatewayService
from llmconsole.engine.fleet import Fleet
from llmconsole.engine.gateway.endpoint import Endpoint, FleetEndpoints, LocalEndpoint, RemoteEndpoint
from llmconsole.engine.gateway.remote import Health, RemoteMember
from llmconsole.engine.status import EngineState, EngineStatus
from llmconsole.paths import Paths
from tests.support.supervision import FAST, until


def _paths(tmp_path: Path) -> Paths:
    return Paths(data_dir=tmp_path / "data", runtime_dir=tmp_path / "run").ensure()


def _status(state: EngineState) -> EngineStatus:
    return EngineStatus(
        name="e",
        state=state,
        config_id="c",
        model="/models/m",
        served_model_name="m",
        device="cpu",
        url="http://127.0.0.1:9",
    )


def test_local_and_remote_engines_answer_the_same_questions():
    local: Endpoint = LocalEndpoint.of(_status(EngineState.READY), "k")
    assert (local.name, local.url, local.api_key, local.remote) == ("e", "http://127.0.0.1:9", "k", False)
    assert local.models == {"m", "/models/m"} and local.routable(None)
    assert not LocalEndpoint.of(_status(EngineState.STARTING), None).routable(None)
    assert "k" not in repr(local)

    member = RemoteMember("e@b", "http://10.0.0.2:8000", "rk", ("m",))
    unchecked: Endpoint = RemoteEndpoint(member, None)
    assert (unchecked.name, unchecked.url, unchecked.api_key, unchecked.remote) == ("e@b", member.url, "rk", True)
    assert unchecked.models == {"m"} and not unchecked.routable(None)
    passing = RemoteEndpoint(member, Health(url=member.url, ready=True, ok_at=10.0))
    assert passing.routable(None) and passing.routable(5.0)
    assert not passing.routable(11.0)  # a request found it refusing after its last passed check


def test_the_gateway_follows_an_engine_by_what_its_supervisor_publishes(tmp_path, fake):
    async def main():
        fleet = Fleet(_paths(tmp_path), FAST)
        await fleet.open()
        svc = GatewayService(fleet, port=0)
        await svc.start()
        try:
            e = await fleet.start("e", fake.spec(), force=True)

            def upstream_ready() -> bool | None:
                group = svc.gateway.groups.get("e")
                return group is not None and "e" in group.upstreams and group.upstreams["e"].ready

            await until(lambda: e.state == EngineState.READY, what="ready")
            await until(upstream_ready, timeout_s=5, what="the group routes to it")
            ep = FleetEndpoints(fleet).endpoint("e")
            assert ep is not None and svc.gateway.groups["e"].upstreams["e"].url == ep.url
            os.kill(e.proc.pid, signal.SIGKILL)
            await until(lambda: not upstream_ready(), timeout_s=10, what="out of its group once it crashed")
            assert e.state in (EngineState.CRASHED, EngineState.STARTING)
            await until(upstream_ready, timeout_s=20, what="back in its group once it serves again")
            await fleet.stop("e")
            await until(lambda: not upstream_ready(), timeout_s=5, what="out of its group once stopped")
        finally:
            await svc.close()
            await fleet.close()
        fleet.board.publish(_status(EngineState.READY))  # no listener left behind: nothing syncs

    asyncio.run(main())
