"""The gateway's own behaviour against a local stub upstream (a pure component test: the stub
only streams canned chunks and records what reached it). The real-engine pass-through and
restart tests are in test_gateway_engine.py."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from llmconsole.engine.gateway.group import EngineGroup, Upstream
from llmconsole.engine.gateway.pid import PidSettings
from llmconsole.engine.gateway.proxy import Gateway
from tests.support.stub_upstream import Stub


async def _setup(stubs, window=4, max_queue=256, queue_timeout_s=5.0, groups=None):
    for s in stubs:
        await s.start()
    gw = Gateway()
    for name, members in (groups or {"g": stubs}).items():
        g = EngineGroup(
            name,
            [Upstream(s.name, s.url, s.api_key) for s in members],
            settings=PidSettings(start_window=window, min_window=1),
            controlled=False,
            max_queue=max_queue,
            queue_timeout_s=queue_timeout_s,
        )
        g.model_names = {s.name for s in members}
        gw.add_group(g)
    await gw.start()
    return gw


async def _teardown(gw, stubs):
    await gw.close()
    for s in stubs:
        await s.runner.cleanup()


def run(coro):
    return asyncio.run(coro)


def test_streamed_and_plain_bodies_pass_through_unchanged():
    async def main():
        stub = Stub()
        gw = await _setup([stub])
        try:
            async with aiohttp.ClientSession() as c:
                for stream in (True, False):
                    body = {"model": "stub", "prompt": "h\u00e9llo", "stream": stream}
                    async with c.post(f"{stub.url}/v1/completions", json=body) as r:
                        direct = (r.status, r.headers["Content-Type"], r.headers["X-Stub"], await r.read())
                    async with c.post(f"{gw.url}/g/g/v1/completions", json=body) as r:
                        via = (r.status, r.headers["Content-Type"], r.headers["X-Stub"], await r.read())
                    assert via == direct
                async with c.get(f"{gw.url}/v1/models") as r:
                    assert (await r.json())["data"] == [{"id": "stub"}]
            rec = gw.groups["g"].records
            assert [r.outcome for r in rec] == ["ok", "ok", "ok"]
            streamed = rec[0]
            assert streamed.streamed and streamed.output_chunks == 5
            # No usage frame in the stub's stream: the length falls back to its five events.
            assert streamed.output_tokens is None and streamed.output_len == 5
            assert 0 <= streamed.queue_s <= streamed.ttft_s <= streamed.e2e_s
            assert streamed.engine_ttft_s <= streamed.ttft_s
            assert not rec[1].streamed and rec[1].ttft_s is None
        finally:
            await _teardown(gw, [stub])

    run(main())


def test_the_window_bounds_what_reaches_the_engine():
    async def main():
        stub = Stub(chunks=4, delay_s=0.01)
        gw = await _setup([stub], window=3)
        try:
            async with aiohttp.ClientSession() as c:

                async def one(k):
                    async with c.post(f"{gw.url}/v1/completions", json={"prompt": k, "stream": True}) as r:
                        await r.read()
                        return r.status

                statuses = await asyncio.gather(*(one(k) for k in range(30)))
            assert statuses == [200] * 30
            assert stub.peak == 3  # filled, never exceeded
            assert max(r.queue_s for r in gw.groups["g"].records) > 0.02
        finally:
            await _teardown(gw, [stub])

    run(main())


def test_full_queue_and_queue_timeout_answer_503_with_retry_after():
    async def main():
        stub = Stub(chunks=1, delay_s=1.0)
        gw = await _setup([stub], window=1, max_queue=1, queue_timeout_s=0.5)
        try:
            async with aiohttp.ClientSession() as c:

                def post():
                    return c.post(f"{gw.url}/v1/completions", json={"prompt": "x"})

                running = asyncio.create_task(post().__aenter__())
                await asyncio.sleep(0.1)
                queued = asyncio.create_task(post().__aenter__())
                await asyncio.sleep(0.1)
                async with post() as r:
                    assert r.status == 503
                    assert int(r.headers["Retry-After"]) >= 1
                    err = (await r.json())["error"]
                    assert err["type"] == "queue_full" and err["code"] == 503
                    assert "engine group g is saturated" in err["message"] and "bound is 1" in err["message"]
                r = await queued  # waited 0.5 s behind the running one: timed out
                assert r.status == 503 and "Retry-After" in r.headers
                err = (await r.json())["error"]
                assert err["type"] == "queue_timeout" and "no slot within 0.5 s" in err["message"]
                r = await running
                assert r.status == 200
                r.release()
        finally:
            await _teardown(gw, [stub])

    run(main())


def test_a_client_that_disconnects_cancels_its_request_running_or_queued():
    async def main():
        stub = Stub(chunks=50, delay_s=0.05)
        gw = await _setup([stub], window=1)
        group = gw.groups["g"]
        try:
            async with aiohttp.ClientSession() as c:
                running = asyncio.create_task(c.post(f"{gw.url}/v1/completions", json={"stream": True}).__aenter__())
                await asyncio.sleep(0.3)
                queued = asyncio.create_task(c.post(f"{gw.url}/v1/completions", json={"stream": True}).__aenter__())
                await asyncio.sleep(0.2)
                assert (stub.active, group.admission.queued) == (1, 1)
                queued.cancel()  # the queued client leaves: it must leave the queue
                (await running).close()  # the running client leaves mid-stream
            for _ in range(50):
                if stub.cancelled == 1 and group.admission.in_flight == 0:
                    break
                await asyncio.sleep(0.05)
            assert stub.cancelled == 1 and stub.finished == 0 and stub.active == 0
            assert stub.started == 1  # the queued request never reached the engine
            assert group.admission.queued == 0 and group.admission.in_flight == 0
            assert sorted(r.outcome for r in group.records) == ["client_disconnected", "client_disconnected"]
        finally:
            await _teardown(gw, [stub])

    run(main())


def test_api_key_is_enforced_and_the_engine_gets_its_own():
    async def main():
        stub = Stub(api_key="s3cret")
        gw = await _setup([stub])
        try:
            async with aiohttp.ClientSession() as c:
                async with c.post(f"{gw.url}/v1/completions", json={}) as r:
                    assert r.status == 401
                    assert (await r.json())["error"]["type"] == "authentication_error"
                async with c.post(f"{gw.url}/v1/completions", json={}, headers={"Authorization": "Bearer nope"}) as r:
                    assert r.status == 401
                async with c.post(f"{gw.url}/v1/completions", json={}, headers={"Authorization": "Bearer s3cret"}) as r:
                    assert r.status == 200
            assert stub.auth_seen == ["Bearer s3cret"]
        finally:
            await _teardown(gw, [stub])

    run(main())


def test_least_outstanding_routing_and_groups_on_their_own_routes():
    async def main():
        a, b, c_ = Stub("a", chunks=10, delay_s=0.03), Stub("b", chunks=10, delay_s=0.03), Stub("c")
        gw = await _setup([a, b, c_], window=8, groups={"batch": [a, b], "fast": [c_]})
        try:
            async with aiohttp.ClientSession() as c:

                async def one(url, body):
                    async with c.post(url, json=body) as r:
                        return r.status, await r.read()

                out = await asyncio.gather(
                    *(one(f"{gw.url}/g/batch/v1/completions", {"stream": True}) for _ in range(8))
                )
                assert all(s == 200 for s, _ in out)
                assert (a.peak, b.peak) == (4, 4)  # spread evenly, not piled on one engine
                status, data = await one(f"{gw.url}/g/fast/v1/chat/completions", {"stream": False})
                assert status == 200 and json.loads(data)["from"] == "c"
                status, data = await one(f"{gw.url}/v1/completions", {"model": "c"})
                assert json.loads(data)["from"] == "c"  # the root door routes by model
                status, data = await one(f"{gw.url}/v1/completions", {"model": "nope"})
                assert status == 404 and "batch" in json.loads(data)["error"]["message"]
                status, data = await one(f"{gw.url}/g/nope/v1/completions", {})
                assert status == 404
        finally:
            await _teardown(gw, [a, b, c_])

    run(main())


def test_requests_wait_for_an_engine_that_is_not_ready():
    async def main():
        stub = Stub()
        gw = await _setup([stub], queue_timeout_s=5.0)
        group = gw.groups["g"]
        group.set_upstream("stub", stub.url, ready=False)
        try:
            async with aiohttp.ClientSession() as c:
                pending = asyncio.create_task(c.post(f"{gw.url}/v1/completions", json={"stream": True}).__aenter__())
                await asyncio.sleep(0.5)
                assert stub.started == 0 and group.admission.queued == 1
                group.set_upstream("stub", stub.url, ready=True)
                r = await pending
                assert r.status == 200
                await r.read()
                r.release()
            assert group.records[-1].queue_s >= 0.4
        finally:
            await _teardown(gw, [stub])

    run(main())


def test_usage_frame_gives_the_token_count_when_events_merge_tokens():
    from llmconsole.engine.gateway.group import RequestRecord
    from llmconsole.engine.gateway.proxy import completion_tokens

    # vLLM merges tokens into fewer events when its consumer lags: 3 events for 8 tokens here.
    tail = (
        b'data: {"choices":[{"text":"ab"}]}\n\ndata: {"choices":[{"text":"cdefgh"}]}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":16,"total_tokens":24,"completion_tokens":8}}\n\n'
        b"data: [DONE]\n\n"
    )
    assert completion_tokens(tail) == 8
    assert completion_tokens(b'data: {"choices":[{"text":"x"}]}\n\n') is None
    rec = RequestRecord(
        "g", "e", "/v1/completions", 200, "ok", True, 0.0, 0.0, 0.1, 1.0, 0.1, 1.0, output_chunks=3, output_tokens=8
    )
    assert rec.output_len == 8
    assert (
        RequestRecord("g", "e", "/v1/completions", 200, "ok", False, 0.0, 0.0, None, 1.0, None, 1.0).output_len is None
    )


def test_the_controllers_tpot_counts_the_usage_frames_tokens():
    import time

    import pytest

    from llmconsole.engine.gateway.group import EngineGroup, RequestRecord
    from llmconsole.engine.gateway.pid import PidSettings, Signal

    group = EngineGroup("g", settings=PidSettings(signal=Signal.TPOT, target_ms=100.0, min_samples=1))
    # 1 s of decoding after the first token, 11 tokens in 3 merged events: 100 ms per token.
    group.record(
        RequestRecord(
            "g",
            "e",
            "/v1/completions",
            200,
            "ok",
            True,
            time.time(),
            0.0,
            0.1,
            1.1,
            0.1,
            1.1,
            output_chunks=3,
            output_tokens=11,
        )
    )
    assert group.controller.measured_ms(time.monotonic()) == (pytest.approx(100.0), 1)
