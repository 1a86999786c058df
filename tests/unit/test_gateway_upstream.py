"""The gateway's connections to engines (engine/gateway/upstream.py) against scripted raw HTTP
servers: every body framing, answers split at every byte, keep-alive reuse, a connection the
engine closed while idle, refusal, an answer that breaks off, and an engine that stops answering
without closing (the first-byte and idle timeouts, TCP keepalive)."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from llmconsole.engine.gateway.upstream import UpstreamBroken, UpstreamPool, UpstreamRefused, UpstreamTimeout

HEAD = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n"


class Scripted:
    """A server that reads one request head (and its body) per answer, then writes the next
    scripted answer in pieces of `piece` bytes; None as an answer closes the connection."""

    def __init__(self, answers: list[bytes | None], piece: int = 0, close_after: bool = False):
        self.answers = list(answers)
        self.piece = piece
        self.close_after = close_after
        self.connections = 0
        self.requests: list[bytes] = []

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while self.answers:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                self.requests.append(head + await reader.readexactly(length))
                answer = self.answers.pop(0)
                if answer is None:
                    writer.transport.abort()
                    return
                step = self.piece or len(answer)
                for k in range(0, len(answer), step):
                    writer.write(answer[k : k + step])
                    await writer.drain()
                    if self.piece:
                        await asyncio.sleep(0)
                if self.close_after:
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]


def _chunked(*parts: bytes, trailer: bytes = b"") -> bytes:
    body = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts)
    return (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nTransfer-Encoding: chunked\r\n\r\n"
        + body
        + b"0\r\n"
        + trailer
        + b"\r\n"
    )


def test_every_framing_split_at_every_byte_gives_the_same_body():
    events = [b'data: {"k": %d}\n\n' % k for k in range(5)]
    answers = {
        "chunked": (_chunked(*events), b"".join(events)),
        "chunked with trailers": (_chunked(b"ab", b"c", trailer=b"X-T: 1\r\n"), b"abc"),
        "length": (
            b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 7\r\n\r\n{"a":1}',
            b'{"a":1}',
        ),
        "interim then length": (
            b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\nno",
            b"no",
        ),
        "empty": (b"HTTP/1.1 204 No Content\r\n\r\n", b""),
    }

    async def main():
        for name, (answer, body) in answers.items():
            for piece in (0, 1, 3, 7):
                srv = Scripted([answer, answer], piece=piece)
                port = await srv.start()
                pool = UpstreamPool(4)
                try:
                    for _ in range(2):  # the second on the same, reused connection
                        r = await pool.request("127.0.0.1", port, HEAD, b"{}")
                        assert await r.read() == body, (name, piece)
                    assert srv.connections == 1, (name, piece)
                    assert srv.requests[0].endswith(b"\r\n\r\n{}")
                finally:
                    await pool.close()
                    srv.server.close()
        srv = Scripted([answers["chunked"][0]])
        port = await srv.start()
        pool = UpstreamPool(4)
        r = await pool.request("127.0.0.1", port, HEAD, b"{}")
        assert (r.status, r.content_type) == (200, "text/event-stream")
        assert ("Transfer-Encoding", "chunked") in r.headers
        await r.read()
        await pool.close()
        srv.server.close()

    asyncio.run(main())


def test_an_answer_until_close_and_connection_close_are_not_reused():
    async def main():
        answer = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of it"
        srv = Scripted([answer, answer], close_after=True)
        port = await srv.start()
        pool = UpstreamPool(4)
        for _ in range(2):
            r = await pool.request("127.0.0.1", port, HEAD, b"{}")
            assert await r.read() == b"all of it"
        assert srv.connections == 2
        await pool.close()
        srv.server.close()

    asyncio.run(main())


def test_a_reused_connection_the_engine_closed_is_retried_once_and_refusal_is_told():
    async def main():
        ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
        srv = Scripted([ok, None, ok])  # the second request finds the connection closed
        port = await srv.start()
        pool = UpstreamPool(4)
        assert await (await pool.request("127.0.0.1", port, HEAD, b"{}")).read() == b"ok"
        assert await (await pool.request("127.0.0.1", port, HEAD, b"{}")).read() == b"ok"
        assert srv.connections == 2
        srv.server.close()
        await srv.server.wait_closed()
        await pool.close()
        with pytest.raises(UpstreamRefused):
            await UpstreamPool(4).request("127.0.0.1", port, HEAD, b"{}")

    asyncio.run(main())


def test_an_answer_that_breaks_off_raises_and_garbage_is_refused():
    async def main():
        cut = _chunked(b"data: 1\n\n", b"data: 2\n\n")[:-20]
        srv = Scripted([cut], close_after=True)  # the engine dies mid-body
        port = await srv.start()
        pool = UpstreamPool(4)
        r = await pool.request("127.0.0.1", port, HEAD, b"{}")
        got = await r.next_chunk()
        assert got and got.startswith(b"data: 1")
        with pytest.raises(UpstreamBroken, match="closed mid-answer"):
            while await r.next_chunk() is not None:
                pass
        await pool.close()
        srv.server.close()

        bad = Scripted([b"SSH-2.0-OpenSSH\r\n\r\n"])
        port = await bad.start()
        with pytest.raises(UpstreamBroken, match="not valid HTTP"):
            await UpstreamPool(4).request("127.0.0.1", port, HEAD, b"{}")
        bad.server.close()

    asyncio.run(main())


def test_the_pool_bounds_connections_and_a_waiting_request_gets_one():
    async def main():
        slow_ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
        srv = Scripted([slow_ok] * 3)
        port = await srv.start()
        pool = UpstreamPool(1)
        first = await pool.request("127.0.0.1", port, HEAD, b"{}")
        second = asyncio.create_task(pool.request("127.0.0.1", port, HEAD, b"{}"))
        await asyncio.sleep(0.05)
        assert pool.open_connections == 1
        assert await first.read() == b"ok"  # done: the connection goes back, the waiter takes it
        assert await (await second).read() == b"ok"
        assert srv.connections == 1
        await pool.close()
        srv.server.close()

    asyncio.run(main())


class Silent:
    """An engine that stops answering without closing: it reads requests and sends `answer`
    (possibly nothing, or a stream's head and first event), then nothing more."""

    def __init__(self, answer: bytes = b"") -> None:
        self.answer = answer
        self.writers: list[asyncio.StreamWriter] = []

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        await reader.readuntil(b"\r\n\r\n")
        if self.answer:
            writer.write(self.answer)
        await reader.read()  # until the gateway closes

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self.server.sockets[0].getsockname()[1]

    def close(self) -> None:
        for w in self.writers:
            w.transport.abort()
        self.server.close()


def test_an_engine_that_stops_answering_is_timed_out_at_the_default_limits():
    """The pool's sweep at the default timeouts, with its clock moved on instead of waiting:
    nothing at all within 300 s of the request, or a stream silent for 60 s once it began, ends
    the answer with UpstreamTimeout. Just short of either, nothing is cut (a long prefill is no
    fault), and time the reader held the answer paused does not count."""

    async def main():
        nothing = Silent()
        stream_head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
        began = Silent(stream_head + b"9\r\ndata: 1\n\n\r\n")
        head_only = Silent(stream_head)
        pool = UpstreamPool(8)
        try:
            ports = [await s.start() for s in (nothing, began, head_only)]
            waiting = asyncio.create_task(pool.request("127.0.0.1", ports[0], HEAD, b"{}"))
            streaming = await pool.request("127.0.0.1", ports[1], HEAD, b"{}")
            assert await streaming.next_chunk() == b"data: 1\n\n"
            prefill = await pool.request("127.0.0.1", ports[2], HEAD, b"{}")  # head in, no token yet
            assert not waiting.done()
            now = time.monotonic()
            assert pool.sweep(now + 59) == 0
            assert pool.sweep(now + 61) == 1  # the stream that went silent
            with pytest.raises(UpstreamTimeout, match="silent for 60 s"):
                await streaming.next_chunk()
            assert pool.sweep(now + 299) == 0  # a slow first token is still waited for
            assert pool.sweep(now + 301) == 2
            with pytest.raises(UpstreamTimeout, match="no answer within 300 s"):
                await waiting
            with pytest.raises(UpstreamTimeout, match="no answer within 300 s"):
                await prefill.next_chunk()
            assert pool.open_connections == 0
            # A paused answer (its reader is slow) is not the engine's silence.
            paused = await pool.request("127.0.0.1", ports[1], HEAD, b"{}")
            paused._conn.pause()
            assert pool.sweep(time.monotonic() + 3600) == 0
        finally:
            await pool.close()
            for s in (nothing, began, head_only):
                s.close()

    asyncio.run(main())


def test_engine_connections_probe_with_tcp_keepalive():
    async def main():
        srv = Scripted([b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"])
        port = await srv.start()
        pool = UpstreamPool(4)
        try:
            await (await pool.request("127.0.0.1", port, HEAD, b"{}")).read()
            [conn] = list(pool._all)
            sock = conn.transport.get_extra_info("socket")
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
            if hasattr(socket, "TCP_KEEPIDLE"):
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 5
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 2
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3
        finally:
            await pool.close()
            srv.server.close()

    asyncio.run(main())
