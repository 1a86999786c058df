"""The gateway's connections to its engines: keep-alive HTTP/1.1, no more than a proxy needs.

Every request through the gateway makes one request to an engine, so this side's cost is paid on
every first token. A general client (aiohttp's) spends about 150 us of CPU per request on what a
proxy does not use (cookies, redirects, tracing, timers, its own request and response objects);
this one writes the request in one call and parses only what an engine's HTTP server answers: a
status line, headers, and a body framed by Content-Length, chunked transfer encoding or the
connection's end. Bodies pass through as they arrive (chunked framing removed), byte for byte.

A connection is reused once its answer has fully arrived. One that the engine closed while it
sat idle is noticed (it leaves the pool); one that closes just as it is reused, before any byte
of an answer, is retried once on a new connection. An answer that breaks off after it began
raises UpstreamBroken to whoever reads it.

An engine that stops answering without closing (frozen, or its host gone) is found three ways:
TCP keepalive probes on every connection (a host that is gone: about 11 s of silence), the
pool's timeouts (no first body byte within `first_byte_timeout_s` of the request, or a stream
silent for `idle_timeout_s`; checked by one sweep a second, no timer per request; time the
reader held the answer paused does not count), and whoever marks the engine down: `cut` ends
an answer at once, and the answers of one engine are tracked for that (see Upstream.inflight).
The request bytes themselves are the caller's, written by a library that validates them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
import time
from collections.abc import AsyncIterator

_MAX_HEAD_BYTES = 64 * 1024
_PAUSE_BYTES = 256 * 1024  # an answer buffered this far ahead of its reader pauses the socket
_RESUME_BYTES = 64 * 1024
# Keepalive probes on engine connections: the first after 5 s of silence, then every 2 s, and 3
# unanswered ones close the connection. Probes are answered by the peer's kernel, so they find a
# host or network that is gone; a frozen engine process is the timeouts' business.
_KEEPALIVE_IDLE_S, _KEEPALIVE_INTERVAL_S, _KEEPALIVE_PROBES = 5, 2, 3
_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _UNTIL_CLOSE, _DONE = range(8)


class UpstreamError(Exception):
    """Something went wrong on the engine's side of the gateway."""


class UpstreamRefused(UpstreamError):
    """Nothing reached the engine: it refused the connection (restarting, or gone)."""


class UpstreamBroken(UpstreamError):
    """The engine's answer broke off, or was not HTTP."""


class UpstreamTimeout(UpstreamBroken):
    """The engine sent nothing within the first-byte timeout, or a stream went silent."""


class UpstreamDown(UpstreamBroken):
    """The engine was marked down while this answer was open: it was ended without waiting."""


class UpstreamResponse:
    """One answer: status and headers at once, then the body as it arrives."""

    def __init__(self, conn: _Conn, track: set[UpstreamResponse] | None = None) -> None:
        self._conn: _Conn | None = conn
        self._track = track
        if track is not None:
            track.add(self)
        self.status = 0
        self.headers: list[tuple[str, str]] = []
        self.content_type = ""
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._eof = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self.head_ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    # --- what the connection feeds ----------------------------------------------------------

    def _feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        if self._buffered > _PAUSE_BYTES and self._conn is not None:
            self._conn.pause()
        self._wake()

    def _feed_eof(self) -> None:
        self._eof = True
        self._conn = None  # back in the pool, or closed: no longer this answer's
        self._untrack()
        self._wake()

    def _untrack(self) -> None:
        if self._track is not None:
            self._track.discard(self)
            self._track = None

    def _fail(self, exc: BaseException) -> None:
        if self._eof:
            return
        self._error = exc
        self._conn = None
        self._untrack()
        if not self.head_ready.done():
            self.head_ready.set_exception(exc)
            self.head_ready.exception()  # retrieved: request() re-raises it
        self._wake()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    # --- what the proxy reads ---------------------------------------------------------------

    async def next_chunk(self) -> bytes | None:
        """The body's bytes that arrived since the last call (waiting for some), or None at its end."""
        while not self._chunks:
            if self._eof:
                return None
            if self._error is not None:
                raise self._error
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        chunks = self._chunks
        chunk = chunks.popleft() if len(chunks) == 1 else b"".join([chunks.popleft() for _ in range(len(chunks))])
        self._buffered -= len(chunk)
        if self._buffered < _RESUME_BYTES and self._conn is not None:
            self._conn.resume()
        return chunk

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[bytes]:
        while True:
            chunk = await self.next_chunk()
            if chunk is None:
                return
            yield chunk

    async def read(self) -> bytes:
        parts = [chunk async for chunk in self]
        return b"".join(parts)

    def close(self) -> None:
        """Done with this answer before its end: its connection is closed (vLLM then aborts
        the request); after its end, nothing to do."""
        conn, self._conn = self._conn, None
        self._untrack()
        if conn is not None and not self._eof:
            conn.abort()

    def silent_s(self, now: float) -> float:
        """Seconds since its engine last sent anything on this answer's connection."""
        conn = self._conn
        return 0.0 if conn is None else now - conn.last_rx

    def cut(self, exc: UpstreamError) -> None:
        """End this answer now, from outside (its engine was marked down): whoever waits for its
        head or its next bytes gets `exc`, and its connection closes."""
        conn = self._conn
        if conn is not None and conn.resp is self:
            conn._broken(exc)
        else:
            self._fail(exc)


class _Conn(asyncio.Protocol):
    """One keep-alive connection to one engine, answering one request at a time."""

    def __init__(self, pool: UpstreamPool, key: tuple[str, int]) -> None:
        self.pool = pool
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.resp: UpstreamResponse | None = None
        self.state = _DONE
        self.remaining = 0
        self.keep_alive = True
        self.received = False  # any byte of the current answer
        self.closed = False
        self.idle_since = 0.0
        self.sent_at = 0.0  # when the current request was sent (monotonic s)
        self.last_rx = 0.0  # when the engine last sent anything (or reading resumed)
        self.body_begun = False  # any byte of the current answer's body
        self._paused = False

    # --- asyncio ----------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        keepalive(transport.get_extra_info("socket"))

    def data_received(self, data: bytes) -> None:
        if self.resp is None:
            self.abort()  # bytes nobody asked for: this connection cannot be trusted
            return
        self.last_rx = time.monotonic()
        self.received = True
        self.buf += data
        try:
            self._parse()
        except (ValueError, IndexError) as e:
            self._broken(UpstreamBroken(f"the engine's answer is not valid HTTP: {e}"))

    def eof_received(self) -> bool | None:
        return None  # close our side too

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        self.pool._lost(self)
        resp, self.resp = self.resp, None
        if resp is None:
            return
        if self.state == _UNTIL_CLOSE:
            if self.buf:
                resp._feed(bytes(self.buf))
            resp._feed_eof()
        elif not self.received:
            resp._fail(UpstreamRefused(f"the engine closed the connection before answering ({exc or 'closed'})"))
        else:
            resp._fail(UpstreamBroken(f"the engine's connection closed mid-answer ({exc or 'closed'})"))

    # --- one request ------------------------------------------------------------------------

    def send(self, data: bytes, resp: UpstreamResponse) -> None:
        assert self.transport is not None
        self.resp = resp
        self.state = _HEAD
        self.received = False
        self.body_begun = False
        self.keep_alive = True
        self.sent_at = self.last_rx = time.monotonic()
        self.transport.write(data)

    def pause(self) -> None:
        if not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self._paused and self.transport is not None and not self.closed:
            self._paused = False
            self.last_rx = time.monotonic()  # the time it was paused was the reader's
            self.transport.resume_reading()

    def abort(self) -> None:
        self.keep_alive = False
        if self.transport is not None:
            self.transport.abort()

    def _broken(self, exc: BaseException) -> None:
        resp, self.resp = self.resp, None
        if resp is not None:
            resp._fail(exc)
        self.abort()

    def _parse(self) -> None:
        """Take what `buf` holds: the head once, then body bytes, fed to the answer in one piece
        per read (the events of one read leave in one write to the client)."""
        resp = self.resp
        if resp is None:
            return
        if self.state == _HEAD and not self._parse_head(resp):
            return
        buf = self.buf
        pos, n = 0, len(buf)
        out: list[bytes] = []
        done = False
        while pos < n or self.state == _LENGTH and self.remaining == 0:
            state = self.state
            if state == _CHUNK_SIZE:
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    if n - pos > 1024:
                        raise ValueError("a chunk size line is too long")
                    break
                size = int(bytes(buf[pos:end]).split(b";", 1)[0], 16)
                pos = end + 2
                if size == 0:
                    self.state = _TRAILER
                elif n - pos >= size + 2:  # the whole chunk is here (the usual case)
                    if buf[pos + size : pos + size + 2] != b"\r\n":
                        raise ValueError("a chunk does not end in CRLF")
                    out.append(bytes(buf[pos : pos + size]))
                    pos += size + 2
                else:
                    self.state, self.remaining = _CHUNK_DATA, size
            elif state == _CHUNK_DATA or state == _LENGTH:
                take = min(n - pos, self.remaining)
                if take:
                    out.append(bytes(buf[pos : pos + take]))
                pos += take
                self.remaining -= take
                if self.remaining == 0:
                    if state == _LENGTH:
                        done = True
                        break
                    self.state = _CHUNK_END
            elif state == _CHUNK_END:
                if n - pos < 2:
                    break
                if buf[pos : pos + 2] != b"\r\n":
                    raise ValueError("a chunk does not end in CRLF")
                pos += 2
                self.state = _CHUNK_SIZE
            elif state == _TRAILER:
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    break
                blank = end == pos
                pos = end + 2
                if blank:  # the blank line after (any) trailers
                    done = True
                    break
            elif state == _UNTIL_CLOSE:
                out.append(bytes(buf[pos:]))
                pos = n
            else:
                break
        del buf[:pos]
        if out:
            self.body_begun = True
            resp._feed(out[0] if len(out) == 1 else b"".join(out))
        if done:
            self._complete()

    def _parse_head(self, resp: UpstreamResponse) -> bool:
        """The status line and headers, once they are all in; False until then."""
        buf = self.buf
        while True:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > _MAX_HEAD_BYTES:
                    raise ValueError("its header is over 64 KiB")
                return False
            head = bytes(buf[:end]).decode("latin-1").split("\r\n")
            del buf[: end + 4]
            version, _, rest = head[0].partition(" ")
            if not version.startswith("HTTP/1."):
                raise ValueError(f"status line {head[0][:80]!r}")
            status = int(rest[:3])
            if not 100 <= status < 200:
                break  # else an interim answer: the real one follows
        headers = []
        length = None
        chunked = False
        for line in head[1:]:
            name, _, value = line.partition(":")
            name, value = name.strip(), value.strip()
            headers.append((name, value))
            low = name.lower()
            if low == "content-length":
                length = int(value)
            elif low == "transfer-encoding":
                chunked = "chunked" in value.lower()
            elif low == "connection":
                self.keep_alive = "close" not in value.lower()
            elif low == "content-type":
                resp.content_type = value.split(";", 1)[0].strip().lower()
        if version == "HTTP/1.0":
            self.keep_alive = False
        resp.status, resp.headers = status, headers
        if chunked:
            self.state = _CHUNK_SIZE
        elif length is not None:
            self.state, self.remaining = _LENGTH, length
        elif status in (204, 304):
            self.state, self.remaining = _LENGTH, 0
        else:
            self.state = _UNTIL_CLOSE
            self.keep_alive = False
        resp.head_ready.set_result(None)
        return True

    def _complete(self) -> None:
        resp, self.resp = self.resp, None
        self.state = _DONE
        if resp is not None:
            resp._feed_eof()
        if self.keep_alive and not self.buf and not self.closed:
            self.resume()
            self.pool._idle(self)
        else:
            self.abort()


def keepalive(sock: socket.socket | None) -> None:
    """Turn on TCP keepalive with short probes (where the platform has the options)."""
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for name, value in (
            ("TCP_KEEPIDLE", _KEEPALIVE_IDLE_S),
            ("TCP_KEEPINTVL", _KEEPALIVE_INTERVAL_S),
            ("TCP_KEEPCNT", _KEEPALIVE_PROBES),
        ):
            option = getattr(socket, name, None)
            if option is not None:
                sock.setsockopt(socket.IPPROTO_TCP, option, value)


class UpstreamPool:
    """Keep-alive connections per engine address, at most `limit` open at once (a request that
    finds them all busy waits for one)."""

    # vLLM's server (uvicorn) closes a connection idle for 5 s: reuse only younger ones, so that
    # a reuse rarely races that close (the retry covers the rest).
    def __init__(
        self,
        limit: int,
        connect_timeout_s: float = 5.0,
        keepalive_s: float = 4.0,
        *,
        first_byte_timeout_s: float = 300.0,
        idle_timeout_s: float = 60.0,
    ) -> None:
        self.limit = limit
        self.connect_timeout_s = connect_timeout_s
        self.keepalive_s = keepalive_s
        self.first_byte_timeout_s = first_byte_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self._sweeper: asyncio.Task[None] | None = None
        self._idle_conns: dict[tuple[str, int], list[_Conn]] = {}
        self._open = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._all: set[_Conn] = set()

    @property
    def open_connections(self) -> int:
        return self._open

    async def request(
        self, host: str, port: int, head: bytes, body: bytes, track: set[UpstreamResponse] | None = None
    ) -> UpstreamResponse:
        """Send `head` (the request line and headers, ending in the blank line) and `body`;
        returns once the answer's status and headers are in. UpstreamRefused when nothing
        reached the engine; UpstreamBroken when its answer was not one (UpstreamTimeout when
        none came in time, UpstreamDown when it was cut). The answer sits in `track` while it
        is open."""
        key = (host, port)
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever(), name="upstream-sweep")
        for attempt in (0, 1):
            conn, reused = await self._acquire(key)
            resp = UpstreamResponse(conn, track)
            conn.send(head + body if body else head, resp)
            try:
                await resp.head_ready
            except UpstreamRefused:
                if reused and attempt == 0:
                    continue  # the engine closed it as we reused it: once more on a new one
                raise
            except asyncio.CancelledError:
                resp.close()
                raise
            return resp
        raise AssertionError("unreachable")

    async def _acquire(self, key: tuple[str, int]) -> tuple[_Conn, bool]:
        while True:
            idle = self._idle_conns.get(key)
            now = time.monotonic()
            while idle:
                conn = idle.pop()
                if not conn.closed and now - conn.idle_since < self.keepalive_s:
                    return conn, True
                conn.abort()
            if self._open < self.limit or self._evict_idle():
                break
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            try:
                await fut
            finally:
                if fut in self._waiters:
                    self._waiters.remove(fut)
        self._open += 1
        conn = _Conn(self, key)
        self._all.add(conn)
        loop = asyncio.get_running_loop()
        try:
            await asyncio.wait_for(loop.create_connection(lambda: conn, key[0], key[1]), self.connect_timeout_s)
        except (OSError, TimeoutError) as e:
            self._all.discard(conn)
            self._open -= 1
            self._wake_one()
            raise UpstreamRefused(f"cannot connect to {key[0]}:{key[1]} ({e or type(e).__name__})") from None
        except asyncio.CancelledError:
            self._all.discard(conn)
            self._open -= 1
            self._wake_one()
            raise
        return conn, False

    def _evict_idle(self) -> bool:
        """At the limit: close an idle connection (to any engine) to make room."""
        for conns in self._idle_conns.values():
            if conns:
                conn = conns.pop(0)
                conn.abort()
                self._lost(conn)  # counted out now, not when the loop gets to it
                return True
        return False

    def _idle(self, conn: _Conn) -> None:
        conn.idle_since = time.monotonic()
        self._idle_conns.setdefault(conn.key, []).append(conn)
        self._wake_one()

    def _lost(self, conn: _Conn) -> None:
        if conn in self._all:
            self._all.discard(conn)
            self._open -= 1
        idle = self._idle_conns.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)
        self._wake_one()

    def _wake_one(self) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    async def _sweep_forever(self) -> None:
        every_s = min(1.0, self.idle_timeout_s / 4, self.first_byte_timeout_s / 4)
        while True:
            await asyncio.sleep(every_s)
            self.sweep(time.monotonic())

    def sweep(self, now: float) -> int:
        """End the answers whose engine is past a timeout; returns how many."""
        late = []
        for conn in self._all:
            if conn.resp is None or conn._paused:
                continue
            if not conn.body_begun:
                if now - conn.sent_at > self.first_byte_timeout_s:
                    late.append(
                        (conn, f"no answer within {self.first_byte_timeout_s:g} s (upstream_first_byte_timeout_s)")
                    )
            elif now - conn.last_rx > self.idle_timeout_s:
                late.append((conn, f"its stream went silent for {self.idle_timeout_s:g} s (upstream_idle_timeout_s)"))
        for conn, why in late:
            conn._broken(UpstreamTimeout(why))
        return len(late)

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        for conn in list(self._all):
            conn.abort()
        self._idle_conns.clear()
        await asyncio.sleep(0)
