"""The gateway's door and its honest failures, against local stub upstreams: every limit (body
cap, body budget, header / body / write timeouts, the connection cap, Host, the key) with its
refusal counted, slow readers that give their admission slot back, an engine that dies
mid-stream, and which outcomes count against an engine. Real engines: test_gateway_engine.py."""

from __future__ import annotations

import asyncio
import json
import socket
import time

import aiohttp
import pytest
from aiohttp import web

from llmconsole.engine.gateway.door import (
    _CLOSES_PER_SWEEP,
    BodyBudget,
    BodyBusy,
    DoorLimits,
    connection_cap,
    host_allowed,
    host_name,
)
from llmconsole.engine.gateway.group import SILENT_WHEN_DOWN_S, EngineGroup, RequestRecord, Upstream
from llmconsole.engine.gateway.pid import PidSettings
from llmconsole.engine.gateway.proxy import Gateway
from llmconsole.engine.metrics.latency import Slo
from llmconsole.engine.tune.guard import window_figures
from tests.support.recording_upstream import Recording
from tests.support.stub_upstream import Stub

MiB = 1024 * 1024


def run(coro):
    return asyncio.run(coro)


async def _gateway(
    stub_url: str,
    *,
    limits: DoorLimits | None = None,
    key: str | None = None,
    api_key: str | None = None,
    window: int = 4,
    host: str = "127.0.0.1",
) -> Gateway:
    gw = Gateway(host, limits=limits, key=key)
    g = EngineGroup(
        "g",
        [Upstream("e", stub_url, api_key)],
        settings=PidSettings(start_window=window, min_window=1),
        controlled=False,
        queue_timeout_s=10.0,
    )
    g.model_names = {"e"}
    gw.add_group(g)
    await gw.start()
    return gw


async def _raw(gw: Gateway, data: bytes = b"", rcvbuf: int | None = None):
    sock = socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", gw.port))
    reader, writer = await asyncio.open_connection(sock=sock)
    if data:
        writer.write(data)
        await writer.drain()
    return reader, writer


async def _closed_within(reader: asyncio.StreamReader, timeout_s: float) -> bytes:
    """Everything the gateway sends until it closes the connection (fails if it does not)."""
    got = b""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            chunk = await asyncio.wait_for(reader.read(65536), max(0.01, deadline - time.monotonic()))
        except ConnectionResetError:
            return got
        if not chunk:
            return got
        got += chunk


def _head(
    path: str = "/g/g/v1/completions", length: int | None = None, host: str = "127.0.0.1", extra: str = ""
) -> bytes:
    framing = f"Content-Length: {length}\r\n" if length is not None else "Transfer-Encoding: chunked\r\n"
    return (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n{extra}{framing}\r\n").encode()


async def _post_refused(c: aiohttp.ClientSession, url: str, data) -> bytes:
    """POST a body the gateway refuses: its 413 answer, or b"" when the gateway closed the
    connection before the client read it."""
    try:
        async with c.post(url, data=data) as r:
            assert r.status == 413
            return await r.read()
    except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError):
        return b""


# --- pure parts ---------------------------------------------------------------------------------


def test_limits_validate_and_size_the_connection_cap_from_descriptors():
    lim = DoorLimits()
    assert lim.max_body_bytes >= 8 * MiB and lim.body_budget_bytes >= lim.max_body_bytes
    assert connection_cap(lim, nofile=1024) == 1024 - lim.reserved_fds - lim.upstream_connections
    assert connection_cap(DoorLimits(max_connections=100), nofile=20000) == 100
    assert connection_cap(DoorLimits(max_connections=100_000), nofile=1024) == 512  # never into the reserve
    assert DoorLimits.from_json({"header_timeout_s": 5, "allowed_hosts": ["GW.lan"]}).allowed_hosts == ("gw.lan",)
    # An engine's first token may take minutes of queue and prefill: the defaults wait for it.
    assert (lim.upstream_first_byte_timeout_s, lim.upstream_idle_timeout_s) == (300.0, 60.0)
    assert DoorLimits.from_json({"upstream_first_byte_timeout_s": 900}).upstream_first_byte_timeout_s == 900
    for bad in (
        {"nope": 1},
        {"max_body_bytes": 0},
        {"body_budget_bytes": 10, "max_body_bytes": 20},
        {"write_timeout_s": -1},
        {"allowed_hosts": "x"},
        {"upstream_first_byte_timeout_s": 0},
        {"upstream_idle_timeout_s": "60"},
    ):
        with pytest.raises(ValueError):
            DoorLimits.from_json(bad)


def test_host_names():
    loop = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})
    assert (
        host_name("[::1]:8000") == "[::1]" and host_name("LocalHost:80") == "localhost" and host_name("a.b.") == "a.b"
    )
    assert host_allowed("localhost:1234", loop) and host_allowed("127.0.0.1", loop) and host_allowed("[::1]:9", loop)
    assert host_allowed("127.1.2.3:80", loop) and host_allowed(None, loop)
    assert not host_allowed("evil.example:1234", loop) and not host_allowed("localhost.evil.example", loop)
    # Loopback literals only, never a prefix: a DNS-rebinding name resolves wherever its owner likes.
    for name in ("127.attacker.example", "127.attacker.example:80", "127.0.0.1.nip.io", "127.", "127.0.0.256"):
        assert not host_allowed(name, loop), name
    assert host_allowed("127.255.0.1:8", loop) and host_allowed("[0:0:0:0:0:0:0:1]:8", loop)
    assert host_allowed("gw.lan", loop | {"gw.lan"})
    assert host_allowed("evil.example", None)  # bound elsewhere: the operator's call


def test_body_budget_grants_in_order_and_times_out():
    async def main():
        b = BodyBudget(100)
        await b.take(60, 1.0)
        waiter = asyncio.create_task(b.take(60, 1.0))
        await asyncio.sleep(0.05)
        assert not waiter.done() and b.used == 60
        b.give(60)
        await waiter
        assert b.used == 60
        with pytest.raises(BodyBusy):
            await b.take(50, 0.1)
        assert b.used == 60  # a waiter that gave up holds nothing
        b.give(60)
        assert b.used == 0

    run(main())


# --- limits at the door -------------------------------------------------------------------------


def test_a_body_over_the_cap_is_refused_from_its_length_before_it_is_read():
    async def main():
        stub = Stub()
        await stub.start()
        gw = await _gateway(stub.url, limits=DoorLimits(max_body_bytes=1 * MiB, body_budget_bytes=2 * MiB))
        try:
            reader, writer = await _raw(gw, _head(length=60 * MiB))  # the header only: nothing follows
            answer = await _closed_within(reader, 5.0)
            assert answer.startswith(b"HTTP/1.1 413") and b"request_too_large" in answer
            writer.close()

            async def chunked():  # no length: refused once past the cap, not after 60 MiB
                for _ in range(60):
                    yield b" " * MiB

            async with aiohttp.ClientSession() as c:
                await _post_refused(c, f"{gw.url}/g/g/v1/completions", chunked())
                async with c.post(f"{gw.url}/g/g/v1/completions", json={"prompt": "x" * 100_000}) as r:
                    assert r.status == 200  # a large but real prompt passes
            assert gw.door.rejected["too_large"] == 2 and stub.started == 1
            assert gw.door.budget.used == 0
        finally:
            await gw.close()
            await stub.runner.cleanup()

    run(main())


def test_a_body_without_a_length_is_held_to_the_lower_chunked_cap():
    # A chunked body can only be refused once it is read past its cap, so that cap is lower: a
    # flood of them costs the door 1 MiB each, and a client with a larger body sends its length.
    async def main():
        stub = Stub()
        await stub.start()
        gw = await _gateway(stub.url, limits=DoorLimits(max_chunked_body_bytes=256 * 1024))
        body = json.dumps({"prompt": "z" * 400_000}).encode()  # over the chunked cap, far under 16 MiB

        def pieces(data: bytes):
            async def gen():
                for i in range(0, len(data), 64 * 1024):
                    yield data[i : i + 64 * 1024]

            return gen()

        try:
            async with aiohttp.ClientSession() as c:
                answer = await _post_refused(c, f"{gw.url}/g/g/v1/completions", pieces(body))
                if answer:
                    assert b"Content-Length" in answer and b"262144" in answer
                assert gw.door.rejected["too_large"] == 1 and stub.started == 0
                hdrs = {"Content-Type": "application/json"}
                async with c.post(f"{gw.url}/g/g/v1/completions", data=body, headers=hdrs) as r:
                    assert r.status == 200  # the same body with its length passes
                async with c.post(
                    f"{gw.url}/g/g/v1/completions", data=pieces(json.dumps({"prompt": "z" * 200_000}).encode())
                ) as r:
                    assert r.status == 200  # a chunked body under its cap reaches the engine
            assert stub.started == 2 and gw.door.rejected["too_large"] == 1 and gw.door.budget.used == 0
        finally:
            await gw.close()
            await stub.runner.cleanup()

    run(main())


def test_a_connection_reads_in_small_pieces_until_its_body_is_let_in():
    # A refused header must not cost a 256 KiB read of the body behind it; a body that is let in
    # is read in large pieces, and the next request on the connection starts small again.
    async def main():
        stub = Stub()
        await stub.start()
        gw = await _gateway(stub.url)
        try:
            body = json.dumps({"prompt": "q" * 300_000}).encode()
            reader, writer = await _raw(gw, _head(length=len(body)) + body[:1000])
            deadline = time.monotonic() + 5
            while not any(c.body_since for c in gw.door.conns.values()) and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            (conn,) = gw.door.conns.values()
            assert conn.body_since is not None and conn.transport.max_size == 256 * 1024
            writer.write(body[1000:])
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200")
            while conn.idle_since is None and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert conn.idle_since is not None and conn.transport.max_size == 16 * 1024
            writer.close()
            _, fresh = await _raw(gw, b"POST /g/g/v1/comp")
            while len(gw.door.conns) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert {c.transport.max_size for c in gw.door.conns.values()} == {16 * 1024}
            fresh.close()
        finally:
            await gw.close()
            await stub.runner.cleanup()

    run(main())


def test_large_bodies_share_the_budget_and_small_ones_never_wait():
    async def main():
        stub = Stub()
        await stub.start()
        lim = DoorLimits(max_body_bytes=200_000, body_budget_bytes=200_000, body_timeout_s=5.0)
        gw = await _gateway(stub.url, limits=lim)
        try:
            body = json.dumps({"prompt": "y" * 150_000}).encode()
            # A holds the budget while its body trickles in; B waits; C is small and passes.
            ra, wa = await _raw(gw, _head(length=len(body)) + body[:1000])
            await asyncio.sleep(0.3)
            async with aiohttp.ClientSession() as c:
                b = asyncio.create_task(
                    c.post(f"{gw.url}/g/g/v1/completions", data=body, headers={"Content-Type": "application/json"})
                )
                await asyncio.sleep(0.3)
                assert not b.done() and gw.door.budget.used == len(body)
                async with c.post(f"{gw.url}/g/g/v1/completions", json={"prompt": "small"}) as r:
                    assert r.status == 200
                wa.write(body[1000:])  # A completes: served, then B gets the budget
                head = await ra.readuntil(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200")
                r = await b
                assert r.status == 200
                r.release()
            assert gw.door.budget.used == 0 and stub.started == 3
            wa.close()
        finally:
            await gw.close()
            await stub.runner.cleanup()

    run(main())


def test_idle_slow_header_and_slow_body_connections_are_closed_and_counted():
    async def main():
        stub = Stub()
        await stub.start()
        gw = await _gateway(stub.url, limits=DoorLimits(header_timeout_s=1.0, body_timeout_s=1.0))
        try:
            idle = await _raw(gw)  # held by the kernel for a second, then by the door for one more
            partial = await _raw(gw, b"POST /g/g/v1/completions HTTP/1.1\r\nHost: 127")
            slow_body = await _raw(gw, _head(length=1000) + b'{"prompt": "')
            for r, _ in (idle, partial, slow_body):
                assert await _closed_within(r, 6.0) == b""  # cut, no answer
            assert gw.door.rejected["header_timeout"] == 2 and gw.door.rejected["body_timeout"] == 1
            assert stub.started == 0 and gw.door.open_connections == 0
            # A keep-alive client between requests is not a refusal.
            async with aiohttp.ClientSession() as c:
                async with c.post(f"{gw.url}/g/g/v1/completions", json={}) as r:
                    assert r.status == 200
                await asyncio.sleep(2.5)
                assert gw.door.open_connections == 0 and gw.door.rejected["header_timeout"] == 2
        finally:
            await gw.close()
            await stub.runner.cleanup()

    run(main())


def test_connections_that_expire_together_are_closed_a_batch_per_sweep():
    # Closing thousands of sockets in one turn of the event loop stalls every stream the gateway
    # relays; the door closes at most a batch per sweep and the rest in the next sweeps.
    async def main():
        stub = Stub()
        await stub.start()
        gw = await _gateway(stub.url, limits=DoorLimits(header_timeout_s=1.0))
        n = _CLOSES_PER_SWEEP * 2 + 22
        try:
            conns = await asyncio.gather(*(_raw(gw, b"POST /g/g/v1/comp") for _ in range(n)))
            steps, seen = [], 0
            deadline = time.monotonic() + 10
            while seen < n and time.monotonic() < deadline:
                await asyncio.sleep(0.01)  # shorter than a sweep: at most one sweep between looks
                now = gw.door.rejected["header_timeout"]
                if now != seen:
                    steps.append(now - seen)
                    seen = now
            assert seen == n, f"{seen} of {n} closed"
            assert max(steps) <= _CLOSES_PER_SWEEP and len(steps) >= 3, steps
            for r, w in conns:
                assert await _closed_within(r, 2.0) == b""
                w.close()
        finally:
            await gw.close()
            await stub.runner.cleanup()

    run(main())


class BigStub(Stub):
    """Streams `chunks` events of `size` bytes as fast as it can write them."""

    def __init__(self, chunks: int, size: int):
        super().__init__(chunks=chunks, delay_s=0.0)
        self.size = size

    async def completions(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        self.started += 1
        self.active += 1
        try:
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            for _ in range(self.chunks):
                await resp.write(b"data: " + b"x" * self.size + b"\n\n")
            await resp.write(b"data: [DONE]\n\n")
            self.finished += 1
            return resp
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.active -= 1


def test_a_slow_reader_gives_its_slot_back_when_the_engine_is_done_and_is_cut_later():
    async def main():
        stub = BigStub(chunks=40, size=8000)  # about 320 kB: inside the client buffer
        await stub.start()
        gw = await _gateway(stub.url, limits=DoorLimits(write_timeout_s=1.5, header_timeout_s=1.5), window=1)
        group = gw.groups["g"]
        try:
            reader, writer = await _raw(gw, _head(length=2) + b"{}", rcvbuf=4096)  # and never reads
            for _ in range(50):
                if stub.finished == 1:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.1)
            assert stub.finished == 1 and group.admission.in_flight == 0  # the slot is free again
            assert [r.outcome for r in group.records] == ["ok"]
            async with aiohttp.ClientSession() as c:  # and someone else gets it at once
                async with c.post(f"{gw.url}/g/g/v1/completions", json={"stream": True}) as r:
                    assert r.status == 200 and (await r.read()).endswith(b"data: [DONE]\n\n")
            # What the kernel did not take waits in the gateway for the write timeout; the rest
            # was the kernel's; either way the connection is closed soon after.
            await asyncio.sleep(4.0)
            assert gw.door.open_connections == 0
            writer.close()
        finally:
            await gw.close()
            await stub.runner.cleanup()

    run(main())


def test_a_slow_reader_past_the_client_buffer_is_cut_and_releases_its_slot():
    async def main():
        stub = BigStub(chunks=4000, size=16000)  # 64 MB: far past a 256 kB client buffer and the kernel's
        await stub.start()
        gw = await _gateway(stub.url, limits=DoorLimits(write_timeout_s=1.0, client_buffer_bytes=256 * 1024), window=1)
        group = gw.groups["g"]
        try:
            reader, writer = await _raw(gw, _head(length=2) + b"{}", rcvbuf=4096)
            await asyncio.sleep(0.5)
            assert group.admission.in_flight == 1 and stub.active == 1  # held: the engine is blocked on us
            for _ in range(80):
                if group.admission.in_flight == 0:
                    break
                await asyncio.sleep(0.05)
            assert group.admission.in_flight == 0 and gw.door.rejected["write_timeout"] == 1
            await asyncio.sleep(0.2)
            assert stub.cancelled == 1 and stub.finished == 0  # the engine's request was aborted
            assert [r.outcome for r in group.records] == ["client_timeout"]
            writer.close()
        finally:
            await gw.close()
            await stub.runner.cleanup()

    run(main())


def test_at_the_connection_cap_idle_connections_make_room_and_busy_ones_are_waited_for():
    async def main():
        stub = Stub(chunks=10, delay_s=0.1)  # about 1 s per streamed answer
        await stub.start()
        gw = await _gateway(stub.url, limits=DoorLimits(max_connections=4, header_timeout_s=30.0), window=8)
        try:
            # Sockets that send nothing stay in the kernel (TCP_DEFER_ACCEPT): these send the
            # start of a request and then nothing.
            idle = [await _raw(gw, b"POST /v1/comp") for _ in range(4)]
            await asyncio.sleep(0.7)
            assert gw.door.open_connections == 4
            async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as c:
                async with c.post(f"{gw.url}/g/g/v1/completions", json={}) as r:
                    assert r.status == 200  # the oldest idle socket made room
                assert gw.door.rejected["connections"] >= 1
                assert await _closed_within(idle[0][0], 2.0) == b""

                async def stream():
                    async with c.post(f"{gw.url}/g/g/v1/completions", json={"stream": True}) as r:
                        return r.status, await r.read()

                # Five streams, four connections: the fifth waits (in the kernel's backlog) until
                # a connection is free, then completes; nothing is refused.
                began = time.monotonic()
                results = await asyncio.gather(*(stream() for _ in range(5)))
                assert all(s == 200 and b.endswith(b"data: [DONE]\n\n") for s, b in results)
                assert time.monotonic() - began > 1.5
            assert gw.door.peak_connections <= 4
        finally:
            await gw.close()
            await stub.runner.cleanup()

    run(main())


def test_host_header_must_name_loopback():
    async def main():
        stub = Stub()
        await stub.start()
        gw = await _gateway(stub.url, limits=DoorLimits(allowed_hosts=("gw.lan",)))
        try:
            async with aiohttp.ClientSession() as c:
                for host, status in (
                    ("evil.example:1234", 403),
                    ("localhost:1", 200),
                    ("[::1]:5", 200),
                    ("gw.lan", 200),
                    ("127.0.0.1", 200),
                    ("127.attacker.example", 403),
                ):
                    async with c.post(f"{gw.url}/g/g/v1/completions", json={}, headers={"Host": host}) as r:
                        assert r.status == status, host
            assert gw.door.rejected["host"] == 2 and stub.started == 4
        finally:
            await gw.close()
            await stub.runner.cleanup()

    run(main())


def test_the_gateway_key_is_checked_before_the_body_and_engines_get_theirs():
    async def main():
        stub = Stub(api_key="engine-key")
        await stub.start()
        gw = await _gateway(stub.url, key="gw-key", api_key="engine-key")
        try:
            reader, writer = await _raw(gw, _head(length=60 * MiB))  # no key, a huge body: 401 at once
            answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            assert answer.startswith(b"HTTP/1.1 401")
            writer.close()
            async with aiohttp.ClientSession() as c:
                for auth, status in (
                    (None, 401),
                    ("Bearer nope", 401),
                    ("gw-key", 401),
                    ("Bearer gw-key", 200),
                    ("Bearer engine-key", 200),
                ):
                    headers = {"Authorization": auth} if auth else {}
                    async with c.post(f"{gw.url}/g/g/v1/completions", json={}, headers=headers) as r:
                        assert r.status == status, auth
                async with c.get(f"{gw.url}/v1/models") as r:
                    assert r.status == 401
                async with c.get(f"{gw.url}/v1/models", headers={"Authorization": "Bearer gw-key"}) as r:
                    assert r.status == 200
            assert stub.auth_seen == ["Bearer engine-key"] * 2  # never the client's key
            assert gw.door.rejected["unauthorized"] == 5
        finally:
            await gw.close()
            await stub.runner.cleanup()

        open_gw = await _gateway(stub.url)  # no key anywhere: the key is optional
        await stub.start()
        open_gw.groups["g"].set_upstream("e", stub.url, True, None)
        try:
            async with aiohttp.ClientSession() as c:
                async with c.post(f"{open_gw.url}/g/g/v1/completions", json={}) as r:
                    assert r.status == 200
        finally:
            await open_gw.close()
            await stub.runner.cleanup()

    run(main())


# --- honest failure -------------------------------------------------------------------------


class DyingUpstream:
    """An engine that streams `events` events and then dies (the connection is reset), or answers
    a plain `status` when given one."""

    def __init__(self, events: int = 3, status: int | None = None):
        self.events, self.status = events, status

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0
        )
        await reader.readexactly(length)
        if self.status is not None:
            body = json.dumps({"error": {"message": "no", "code": self.status}}).encode()
            writer.write(
                f"HTTP/1.1 {self.status} X\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n".encode()
                + body
            )
            await writer.drain()
            writer.close()
            return
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for k in range(self.events):
            event = b'data: {"choices": [{"text": "t%d"}]}\n\n' % k
            writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            await writer.drain()
            await asyncio.sleep(0.05)
        writer.transport.abort()  # killed: no end of the chunked body, no [DONE]

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        return self.url


def test_an_engine_that_dies_mid_stream_ends_the_stream_with_an_error_not_a_clean_end():
    async def main():
        up = DyingUpstream(events=3)
        gw = await _gateway(await up.start())
        group = gw.groups["g"]
        body = {"model": "e", "prompt": "x", "stream": True}
        try:
            async with aiohttp.ClientSession() as c:
                got = b""
                with pytest.raises(aiohttp.ClientPayloadError):
                    async with c.post(f"{gw.url}/g/g/v1/completions", json=body) as r:
                        assert r.status == 200
                        async for chunk in r.content.iter_any():
                            got += chunk
            events = [line[6:] for line in got.decode().splitlines() if line.startswith("data: ")]
            assert len(events) == 4 and "[DONE]" not in got.decode()
            err = json.loads(events[-1])["error"]
            assert err["type"] == "upstream_died" and "incomplete" in err["message"]

            import httpx

            async with httpx.AsyncClient(base_url=gw.url) as hc:
                lines = []
                with pytest.raises(httpx.RemoteProtocolError):
                    async with hc.stream("POST", "/g/g/v1/completions", json=body) as r:
                        async for line in r.aiter_lines():
                            lines.append(line)
                assert any('"upstream_died"' in line for line in lines)

            try:
                import openai
            except ImportError:
                openai = None
            if openai is not None:  # what an application using the OpenAI SDK sees
                client = openai.AsyncOpenAI(base_url=f"{gw.url}/g/g/v1", api_key="unused", max_retries=0)
                texts = []
                with pytest.raises(openai.APIError, match="stopped answering mid-stream"):
                    stream = await client.completions.create(model="e", prompt="x", stream=True)
                    async for part in stream:
                        texts.append(part.choices[0].text)
                assert texts == ["t0", "t1", "t2"]
                await client.close()
            outcomes = [r.outcome for r in group.records]
            assert outcomes and set(outcomes) == {"upstream_died"}
            assert group.outcomes["upstream_died"] == len(outcomes) and group.outcomes["ok"] == 0
            assert group.admission.in_flight == 0
        finally:
            await gw.close()
            up.server.close()

    run(main())


def test_a_frozen_member_marked_down_gives_its_window_seats_back_at_once():
    """Another host's engine that accepts requests and then answers nothing: once its health
    checks mark it down, the requests it went silent on are cut, their seats go back to the
    window at once, and since nothing reached their clients they are served by the engine that
    joins the group next. (Before, they held their seats until the engine's connection closed.)"""

    async def main():
        frozen = Recording(on_request=time.monotonic, frozen=True)
        good = Recording()
        await frozen.start()
        await good.start()
        gw = Gateway("127.0.0.1")
        group = gw.add_group(
            EngineGroup(
                "g",
                [Upstream("e@far", frozen.url, remote=True)],
                settings=PidSettings(start_window=4, min_window=1),
                controlled=False,
                queue_timeout_s=30.0,
            )
        )
        await gw.start()
        try:
            async with aiohttp.ClientSession() as c:

                async def post() -> int:
                    async with c.post(f"{gw.url}/g/g/v1/completions", json={"prompt": "x"}) as r:
                        await r.read()
                        return r.status

                clients = [asyncio.create_task(post()) for _ in range(2)]
                await _until(lambda: len(frozen.requests) == 2, "both requests at the frozen engine")
                assert group.admission.in_flight == 2
                # Silent for as long as the gateway waits before it calls an answer abandoned.
                await _until(
                    lambda: all(time.monotonic() - r.seen >= SILENT_WHEN_DOWN_S for r in frozen.requests),
                    "the engine silent",
                )
                assert group.admission.in_flight == 2  # silence alone cuts nothing
                group.set_upstream("e@far", frozen.url, False, remote=True)  # its checks failed
                for _ in range(20):
                    await asyncio.sleep(0)  # a few turns of the loop, no waiting on the engine
                assert group.admission.in_flight == 0 and not any(t.done() for t in clients)
                await _until(lambda: group.admission.queued == 2, "both requests waiting for an engine")
                group.set_upstream("e2", good.url, True)
                assert await asyncio.gather(*clients) == [200, 200]
            assert len(good.requests) == 2
            assert {r.engine for r in group.records} == {"e2"}
        finally:
            await gw.close()
            await frozen.stop()
            await good.stop()

    run(main())


async def _until(pred, what: str, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(0.02)


def test_engine_errors_client_errors_and_what_counts_against_an_engine():
    async def main():
        records = []
        for status in (500, 400):
            up = DyingUpstream(status=status)
            gw = await _gateway(await up.start())
            try:
                async with aiohttp.ClientSession() as c:
                    async with c.post(f"{gw.url}/g/g/v1/completions", json={}) as r:
                        assert r.status == status
                records += list(gw.groups["g"].records)
            finally:
                await gw.close()
                up.server.close()
        assert [r.outcome for r in records] == ["engine_error", "client_error"]

    run(main())

    def rec(outcome: str, at: float = 15.0) -> RequestRecord:
        return RequestRecord("g", "e", "/v1/completions", 200, outcome, True, at, 0.0, 0.01, 0.1, 0.01, 0.1, 8)

    slo = Slo.parse(["p99_e2e_ms=500"])
    floods = [
        rec(o)
        for o in (
            "queue_full",
            "queue_timeout",
            "client_disconnected",
            "client_timeout",
            "client_error",
            "unauthorized",
        )
        for _ in range(50)
    ]
    fig = window_figures(floods + [rec("ok")] * 10, slo, 10.0, 20.0)
    assert (fig.requests, fig.errors, fig.good) == (10, 0, 10)  # a flood at the door counts for nothing
    fig = window_figures([rec("ok")] * 8 + [rec("engine_error"), rec("upstream_died")], slo, 10.0, 20.0)
    assert (fig.requests, fig.errors) == (10, 2)


_LOW_LIMIT_GATEWAY = """
import asyncio, json, os, sys
from llmconsole.engine.gateway.door import DoorLimits
from llmconsole.engine.gateway.proxy import Gateway

async def main():
    gw = Gateway(limits=DoorLimits(reserved_fds=64, upstream_connections=32, header_timeout_s=30.0))
    await gw.start()
    print(json.dumps({"port": gw.port, "cap": gw.door.cap}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    files = []
    try:
        for _ in range(50):  # what supervision needs meanwhile: health checks, launches, logs
            files.append(open(os.devnull))
    except OSError:
        pass
    print(json.dumps({"opened": len(files), "connections": gw.door.open_connections,
                      "peak": gw.door.peak_connections, "rejected": dict(gw.door.rejected)}), flush=True)
    await gw.close()

asyncio.run(main())
"""


def test_a_flood_past_the_descriptor_limit_leaves_the_reserve_to_supervision():
    import os
    import resource
    import subprocess
    import sys

    def low_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))

    proc = subprocess.Popen(
        [sys.executable, "-c", _LOW_LIMIT_GATEWAY],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=low_limit,
        env=dict(os.environ),
    )
    try:
        first = json.loads(proc.stdout.readline())
        assert first["cap"] == 256 - 64 - 32

        async def flood():
            held = []
            for _ in range(400):  # far past the cap, and past the process's descriptor limit
                try:
                    r, w = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", first["port"]), 5)
                    w.write(b"GET /health HT")  # accepted (it sent something), never completed
                    held.append((r, w))
                except (OSError, TimeoutError):
                    pass
            await asyncio.sleep(1.5)
            async with aiohttp.ClientSession() as c:  # an ordinary client still gets in
                async with c.get(
                    f"http://127.0.0.1:{first['port']}/health", timeout=aiohttp.ClientTimeout(total=20)
                ) as r:
                    assert r.status == 200
            return held

        held = asyncio.run(flood())
        proc.stdin.write("go\n")
        proc.stdin.flush()
        after = json.loads(proc.stdout.readline())
        assert after["opened"] == 50  # the reserve was still there
        assert after["peak"] <= first["cap"] and after["connections"] <= first["cap"]
        assert after["rejected"].get("connections", 0) >= 1 and "descriptors" not in after["rejected"]
        del held
    finally:
        proc.kill()
        proc.wait()


def test_a_client_that_expects_100_continue_gets_it_or_its_413_before_sending():
    async def main():
        stub = Stub()
        await stub.start()
        gw = await _gateway(stub.url, limits=DoorLimits(max_body_bytes=1 * MiB, body_budget_bytes=2 * MiB))
        try:
            body = b'{"prompt": "x"}'
            reader, writer = await _raw(gw, _head(length=len(body), extra="Expect: 100-continue\r\n"))
            interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            assert interim.startswith(b"HTTP/1.1 100 Continue")
            writer.write(body)
            answer = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            assert answer.startswith(b"HTTP/1.1 200")
            writer.close()
            reader, writer = await _raw(gw, _head(length=2 * MiB, extra="Expect: 100-continue\r\n"))
            answer = await _closed_within(reader, 5.0)
            assert answer.startswith(b"HTTP/1.1 413")
            writer.close()
        finally:
            await gw.close()
            await stub.runner.cleanup()

    run(main())
