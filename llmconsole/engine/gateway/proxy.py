"""The gateway: one OpenAI-compatible front door for the host's engine groups.

  /v1/completions, /v1/chat/completions, /v1/models     routed by the body's "model" (or the
                                                         only group there is)
  /g/<group>/v1/...                                      one group, by name
  /health                                                the gateway itself

Before any body is read, the door (door.py) has checked the connection's limits, the Host
header, that nothing in the request line or headers could end a line of the request made from
it, and the key; the body is read under a size cap and a memory budget. The request to the engine
is written by h11, which refuses to write anything that is not HTTP, from the path the gateway
routed to (one of the paths above, never the client's), the client's query as it was sent (still
percent-encoded), and the client's headers less hop-by-hop ones and its key. Bodies and streamed
chunks then pass through unchanged, byte for byte. Each request waits for a slot of its group's
admission gate (see admission.py), goes to the group's least-loaded ready engine, and is
measured: queue time, TTFT and end-to-end at the gateway.

The key: when the gateway has a key of its own (`key`), or any engine behind it has one, every
request must carry a key: the gateway's, or (on a group's requests) one of that group's engines'
keys. Engines get their own key from the gateway, never the client's.

A request that nothing was answered to yet goes to the group's next ready engine (or waits in
the queue for one) when its engine refused its connection, closed it before answering, or failed
it with a 5xx while going away (a stop or a crash: its /health then fails too); the client sees
the answer only. A stream whose answer has begun is never sent twice.

How requests end (group.py lists the outcomes): a client that goes away cancels its request,
queued or running (the server cancels the handler, which closes the upstream connection, and
vLLM aborts a request whose connection closed). A stream's bytes are handed to the client's
connection without waiting for it to read, up to `client_buffer_bytes`, so a slow reader holds its
admission slot only while the engine is still generating for it (or, past that buffer, until the
door's write timeout cuts it). An engine that dies mid-stream ends the client's stream with an
error event (`data: {"error": ...}`, which the OpenAI clients raise) and an aborted body, never
a clean end that would pass truncated text off as whole. An engine that answers nothing is cut by
the door's upstream timeouts (upstream.py: no first body byte in `upstream_first_byte_timeout_s`,
a stream silent for `upstream_idle_timeout_s`): 502, or the same error event mid-stream. Another
host's engine marked down by its health checks has its silent answers cut at once (group.py):
their seats go back to the window, and a request nothing of which reached its client goes to
the group's next engine, as a refused one does.
"""

from __future__ import annotations

import asyncio
import errno
import hmac
import json
import logging
import re
import time
from collections.abc import Callable
from typing import Any, cast
from urllib.parse import urlsplit

import aiohttp
import h11
from aiohttp import web
from aiohttp.http_writer import StreamWriter
from multidict import CIMultiDict

from llmconsole.engine.gateway import group as outcomes
from llmconsole.engine.gateway.admission import QueueFull, QueueTimeout
from llmconsole.engine.gateway.door import (
    BodyBusy,
    BodyTooLarge,
    Connection,
    Door,
    DoorLimits,
    allowed_hosts,
    host_allowed,
    request_fault,
)
from llmconsole.engine.gateway.group import EngineGroup, RequestRecord, Upstream
from llmconsole.engine.gateway.upstream import (
    UpstreamDown,
    UpstreamError,
    UpstreamPool,
    UpstreamRefused,
    UpstreamResponse,
)
from llmconsole.engine.ports import pick_port

log = logging.getLogger(__name__)

_API_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})
_MODELS_PATH = "/v1/models"
# The usage frame's token count, read from a stream's last bytes (the frame comes just before
# [DONE]); the tail is bounded so that reading it costs the same for any answer length.
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
_TAIL_BYTES = 4096
_DONE = b"data: [DONE]"
_EVENT = b"data: "


def completion_tokens(tail: bytes) -> int | None:
    """The last usage frame's completion_tokens in a stream's tail, or None without one."""
    found = _COMPLETION_TOKENS.findall(tail)
    return int(found[-1]) if found else None


# Hop-by-hop and framing headers are the gateway's own business (it answered any Expect itself),
# and the client's key is not the engine's; everything else passes.
_DROP_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "transfer-encoding",
        "content-length",
        "host",
        "server",
        "date",
        "upgrade",
        "proxy-connection",
        "te",
        "trailer",
        "authorization",
        "expect",
    }
)
_DROP_RESPONSE_HEADERS = _DROP_HEADERS - {"authorization", "expect"}
_DROP_REQUEST_HEADERS = frozenset(h.encode() for h in _DROP_HEADERS)
_NOT_READY_RETRY_S = 0.2
_GONE_PROBE_S = 2.0


def error_response(
    status: int, message: str, kind: str, headers: dict[str, str] | None = None, **extra: object
) -> web.Response:
    """Errors in the OpenAI shape that clients already parse."""
    body = {"error": {"message": message, "type": kind, "code": status, **extra}}
    return web.json_response(body, status=status, headers=headers)


def _closing(resp: web.Response) -> web.Response:
    resp.force_close()
    return resp


class UnsafeRequest(Exception):
    """h11 would not write the request to the engine: something in it is not HTTP."""


def request_head(
    method: str, target: bytes, host_header: str, headers: list[tuple[bytes, bytes]], key: str | None, length: int
) -> bytes:
    """An engine request's line and headers as h11 writes them (it checks every byte of the
    target, names and values, so no part of a request can end a line or start another one)."""
    fields = [(b"Host", host_header.encode()), *headers]
    if key:
        fields.append((b"Authorization", b"Bearer " + key.encode()))
    if length or method == "POST":
        fields.append((b"Content-Length", str(length).encode()))
    try:
        return h11.Connection(h11.CLIENT).send(h11.Request(method=method, target=target, headers=fields)) or b""
    except h11.LocalProtocolError as e:
        raise UnsafeRequest(str(e)) from None


def forwarded_headers(raw: tuple[tuple[bytes, bytes], ...]) -> list[tuple[bytes, bytes]]:
    """The client's headers an engine gets: less the hop-by-hop ones, those its Connection
    header names, and its key."""
    hop = set(_DROP_REQUEST_HEADERS)
    for name, value in raw:
        if name.lower() == b"connection":
            hop.update(t.strip().lower() for t in value.split(b","))
    return [(k, v) for k, v in raw if k.lower() not in hop]


class Gateway:
    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        on_record: Callable[[RequestRecord], None] | None = None,
        *,
        limits: DoorLimits | None = None,
        key: str | None = None,
    ) -> None:
        self.host = host
        self.port = port
        self.groups: dict[str, EngineGroup] = {}
        self.key = key  # the gateway's own key; None: see the module docstring
        self.door = Door(limits)
        self._hosts = allowed_hosts(host, self.door.limits)
        self._on_record = on_record
        self._pool: UpstreamPool | None = None
        self._addrs: dict[str, tuple[str, int, str]] = {}

    @property
    def limits(self) -> DoorLimits:
        return self.door.limits

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> str:
        # The window, not the pool, bounds concurrency; the pool's bound keeps the engines' side
        # inside the descriptors the door set aside for it.
        self._pool = UpstreamPool(
            self.limits.upstream_connections,
            first_byte_timeout_s=self.limits.upstream_first_byte_timeout_s,
            idle_timeout_s=self.limits.upstream_idle_timeout_s,
        )
        self.door.make_server(self._handle)
        # Port 0: one below the ephemeral range (see engine/ports.py), picked again if another
        # process binds it between the pick and the listen.
        tries = 3 if self.port == 0 else 1
        for attempt in range(tries):
            try:
                self.port = await self.door.listen(self.host, self.port or pick_port(self.host))
                break
            except OSError as e:
                if e.errno == errno.EADDRINUSE and attempt + 1 < tries:
                    continue
                await self._pool.close()
                self._pool = None
                raise
        log.info("gateway listening on %s (at most %d connections)", self.url, self.door.cap)
        return self.url

    def _upstreams(self) -> UpstreamPool:
        if self._pool is None:
            raise RuntimeError("the gateway is not started")
        return self._pool

    async def close(self) -> None:
        await self.door.close()
        if self._pool is not None:
            await self._pool.close()
            self._pool = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def group_url(self, group: str) -> str:
        return f"{self.url}/g/{group}"

    def add_group(self, group: EngineGroup) -> EngineGroup:
        self.groups[group.name] = group
        return group

    # --- the door ---------------------------------------------------------------------------

    def _key_ok(self, header: str | None, groups: list[EngineGroup]) -> bool:
        """The gateway's key, or a local engine's key of one of `groups`; no key anywhere: open."""
        keys = [k for g in groups for k in g.door_keys()]
        if self.key is None and not any(g.api_keys() for g in groups):
            return True
        if not header or not header.startswith("Bearer "):
            return False
        given = header[7:].strip().encode()
        if self.key is not None and hmac.compare_digest(given, self.key.encode()):
            return True
        return any(hmac.compare_digest(given, k.encode()) for k in keys)

    def _unauthorized(self, group: EngineGroup | None, path: str) -> web.Response:
        self.door.reject("unauthorized")
        if group is not None:
            now = time.monotonic()
            self._finish(group, None, path, 401, outcomes.UNAUTHORIZED, now, 0.0)
        return error_response(401, "a valid API key is required (Authorization: Bearer ...)", "authentication_error")

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        h = request.protocol
        conn = self.door.begin(h)
        try:
            return await self._route(request, conn)
        finally:
            self.door.end(h, conn)

    async def _route(self, request: web.BaseRequest, conn: Connection | None) -> web.StreamResponse:
        if not host_allowed(request.headers.get("Host"), self._hosts):
            self.door.reject("host")
            return _closing(
                error_response(
                    403,
                    "the Host header does not name this gateway (it answers to loopback names only)",
                    "forbidden_host",
                )
            )
        fault = request_fault(request)
        if fault is not None:
            return self._bad_request(fault)
        path = request.path
        group: EngineGroup | None = None
        if path.startswith("/g/"):
            name, _, rest = path[3:].partition("/")
            api = "/" + rest
            group = self.groups.get(name)
            if group is None:
                return error_response(
                    404, f"no engine group named {name!r}; groups: {sorted(self.groups)}", "not_found"
                )
        else:
            api = path
            if api == "/health" and request.method == "GET":
                return web.json_response({"groups": {n: g.admission.is_open for n, g in self.groups.items()}})
        method = request.method
        if api == _MODELS_PATH and method == "GET":
            scope = [group] if group is not None else list(self.groups.values())
            if not self._key_ok(request.headers.get("Authorization"), scope):
                return self._unauthorized(group, api)
            if group is None and len(self.groups) != 1:
                return await self._models_all(request)
            target = group or next(iter(self.groups.values()), None)
            if target is None:
                return error_response(404, "the gateway serves no engine group yet", "not_found")
            return await self.proxy(request, target, api, b"", conn, admit=False)
        if api not in _API_PATHS:
            return error_response(404 if method in ("GET", "POST") else 405, f"no route {method} {path}", "not_found")
        if method != "POST":
            return error_response(405, f"{api} takes POST", "method_not_allowed")
        auth = request.headers.get("Authorization")
        if not self._key_ok(auth, [group] if group is not None else list(self.groups.values())):
            return self._unauthorized(group, api)
        if request.headers.get("Expect", "").lower() == "100-continue" and request.version >= (1, 1):
            cl = request.content_length
            if cl is not None and cl > self.limits.max_body_bytes:
                self.door.reject("too_large")
                too_large = BodyTooLarge(self.limits.max_body_bytes, chunked=False)
                return _closing(
                    error_response(413, too_large.describe(self.limits.max_body_bytes), "request_too_large")
                )
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # curl waits for it before a body
        try:
            body, held = await self.door.read_body(request, conn)
        except BodyTooLarge as e:
            self.door.reject("too_large")
            return _closing(error_response(413, e.describe(self.limits.max_body_bytes), "request_too_large"))
        except BodyBusy as e:
            self.door.reject("body_budget")
            return _closing(error_response(503, f"{e}; retry later", "body_budget", headers={"Retry-After": "1"}))
        except (asyncio.IncompleteReadError, aiohttp.ClientPayloadError, ConnectionError):
            return _closing(error_response(400, "the request body ended early", "invalid_request_error"))
        try:
            if group is None:
                model = None
                if len(self.groups) != 1:
                    try:
                        model = json.loads(body).get("model")
                    except (ValueError, AttributeError):
                        return error_response(400, "request body is not a JSON object", "invalid_request_error")
                group = self._group_for_model(model)
                if group is None:
                    return error_response(
                        404,
                        f"no engine group serves model {model!r}; use /g/<group>/v1/... "
                        f"with one of {sorted(self.groups)}",
                        "not_found",
                    )
                if not self._key_ok(auth, [group]):
                    return self._unauthorized(group, api)
            return await self.proxy(request, group, api, body, conn)
        finally:
            if held:
                self.door.budget.give(held)

    def _bad_request(self, why: str) -> web.Response:
        self.door.reject("bad_request")
        return _closing(error_response(400, f"the request cannot be forwarded: {why}", "invalid_request_error"))

    def _group_for_model(self, model: str | None) -> EngineGroup | None:
        if len(self.groups) == 1:
            return next(iter(self.groups.values()))
        for g in self.groups.values():
            if model is not None and (model in g.model_names or model == g.name):
                return g
        return None

    async def _models_all(self, request: web.BaseRequest) -> web.StreamResponse:
        data = []
        for g in self.groups.values():
            up = g.pick()
            if up is None:
                continue
            try:
                r = await self._send(up, "GET", _MODELS_PATH, b"", [], b"")
                body = await r.read()
                if r.status == 200:
                    data.extend(json.loads(body).get("data", []))
            except (UpstreamError, ValueError, AttributeError):
                continue
        return web.json_response({"object": "list", "data": data})

    # --- the proxy ------------------------------------------------------------------------

    async def proxy(
        self,
        request: web.BaseRequest,
        group: EngineGroup,
        path: str,
        body: bytes,
        conn: Connection | None = None,
        admit: bool = True,
    ) -> web.StreamResponse:
        arrived = time.monotonic()
        deadline = arrived + group.admission.queue_timeout_s
        queue_s = 0.0
        while True:
            if admit:
                try:
                    await group.admission.acquire(max(0.001, deadline - time.monotonic()))
                except QueueFull as e:
                    return self._refuse(group, None, path, 503, outcomes.QUEUE_FULL, arrived, 0.0, str(e))
                except QueueTimeout as e:
                    return self._refuse(
                        group, None, path, 503, outcomes.QUEUE_TIMEOUT, arrived, time.monotonic() - arrived, str(e)
                    )
                except asyncio.CancelledError:
                    self._finish(group, None, path, 499, _client_gone(conn), arrived, time.monotonic() - arrived)
                    raise
            queue_s = time.monotonic() - arrived
            up = group.pick()
            try:
                if up is None:  # admitted in the instant the last engine went down
                    if time.monotonic() >= deadline:
                        return self._refuse(
                            group,
                            None,
                            path,
                            503,
                            outcomes.QUEUE_TIMEOUT,
                            arrived,
                            queue_s,
                            "no engine of the group became ready in time",
                        )
                else:
                    try:
                        return await self._forward(request, group, up, path, body, arrived, queue_s, conn)
                    except _EngineRefused as e:
                        group.mark_down(up)  # it restarts: wait for it in the queue, within the bound
                        up.resent += 1
                        if time.monotonic() >= deadline:
                            return self._refuse(
                                group, up.name, path, 503, outcomes.ENGINE_ERROR, arrived, queue_s, str(e)
                            )
            finally:
                if admit:
                    group.admission.release()
            # The seat is given back before waiting: a request waiting for an engine holds none.
            await asyncio.sleep(_NOT_READY_RETRY_S)

    def _address(self, up: Upstream) -> tuple[str, int, str]:
        """(host, port, Host header) of an engine's URL, parsed once."""
        addr = self._addrs.get(up.url)
        if addr is None:
            u = urlsplit(up.url)
            host, port = u.hostname or "127.0.0.1", u.port or 80
            name = f"[{host}]" if ":" in host else host
            if len(self._addrs) > 1024:
                self._addrs.clear()
            addr = self._addrs[up.url] = (host, port, f"{name}:{port}")
        return addr

    async def _send(
        self, up: Upstream, method: str, path: str, query: bytes, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> UpstreamResponse:
        """One request to an engine: `path` (one the gateway serves), the client's raw `query`,
        `headers` (see forwarded_headers), the engine's own key, the body as read. UnsafeRequest
        when h11 would not write it."""
        host, port, host_header = self._address(up)
        target = path.encode() + b"?" + query if query else path.encode()
        head = request_head(method, target, host_header, headers, up.api_key, len(body))
        return await self._upstreams().request(host, port, head, body, track=up.inflight)

    async def _forward(
        self,
        request: web.BaseRequest,
        group: EngineGroup,
        up: Upstream,
        path: str,
        body: bytes,
        arrived: float,
        queue_s: float,
        conn: Connection | None,
    ) -> web.StreamResponse:
        headers = forwarded_headers(request.raw_headers)
        query = request.rel_url.raw_query_string.encode("utf-8", "surrogateescape")
        dispatched = time.monotonic()
        up.outstanding += 1
        up.requests += 1
        first_s = None
        chunks = 0
        last = prev = b""
        resp: web.StreamResponse | None = None
        r: UpstreamResponse | None = None
        try:
            try:
                r = await self._send(up, request.method, path, query, headers, body)
            except (UpstreamRefused, UpstreamDown) as e:
                raise _EngineRefused(str(e)) from e
            except UnsafeRequest as e:
                return self._bad_request(str(e))
            try:
                out_headers = CIMultiDict((k, v) for k, v in r.headers if k.lower() not in _DROP_RESPONSE_HEADERS)
                if r.content_type != "text/event-stream":
                    try:
                        data = await r.read()
                    except UpstreamDown as e:
                        raise _EngineRefused(str(e)) from e  # nothing reached the client yet
                    if r.status >= 500 and await self._going_away(up):
                        # Nothing reached the client: the request goes to the group's next engine.
                        raise _EngineRefused(f"engine {up.name} answered {r.status} as it went away")
                    resp = web.Response(body=data, status=r.status, headers=out_headers)
                else:
                    resp = web.StreamResponse(status=r.status, headers=out_headers)
                    await resp.prepare(request)
                    # Written without waiting for the client while the engine generates, up to
                    # client_buffer_bytes: a slow reader then costs memory, not an engine slot.
                    writer = cast(StreamWriter, request.writer)
                    proto = request.protocol
                    cap = self.limits.client_buffer_bytes
                    next_chunk = r.next_chunk
                    while (chunk := await next_chunk()) is not None:
                        if first_s is None:
                            first_s = time.monotonic()
                            group.first_token(first_s - dispatched)
                        chunks += chunk.count(_EVENT)
                        prev, last = last, chunk
                        await writer.write(chunk, drain=False)
                        if proto.writing_paused:
                            transport = request.transport
                            if transport is not None and transport.get_write_buffer_size() > cap:
                                await writer.drain()
            finally:
                r.close()  # an unfinished answer: its connection closes and vLLM aborts the request
        except (asyncio.CancelledError, ConnectionError) as e:
            # The client went away: the server cancelled the handler, or the connection broke
            # under a write before the server noticed.
            self._finish(
                group,
                up.name,
                path,
                499,
                _client_gone(conn),
                arrived,
                queue_s,
                dispatched=dispatched,
                first_s=first_s,
                chunks=chunks,
            )
            if isinstance(e, asyncio.CancelledError):
                raise
            return resp if resp is not None else web.Response(status=499)
        except UpstreamError as e:
            if resp is not None and resp.prepared:
                self._finish(
                    group,
                    up.name,
                    path,
                    502,
                    outcomes.UPSTREAM_DIED,
                    arrived,
                    queue_s,
                    dispatched=dispatched,
                    first_s=first_s,
                    chunks=chunks,
                )
                await self._abort_stream(request, up, e)
                return resp
            died = r is not None and r.status != 0  # the answer had begun
            return self._refuse(
                group,
                up.name,
                path,
                502,
                outcomes.UPSTREAM_DIED if died else outcomes.ENGINE_ERROR,
                arrived,
                queue_s,
                f"engine {up.name}: {e}",
            )
        finally:
            up.outstanding -= 1
        if r.status >= 500:
            outcome = outcomes.ENGINE_ERROR
        elif r.status >= 400:
            outcome = outcomes.CLIENT_ERROR
        else:
            outcome = outcomes.OK
        done = first_s is not None and _DONE in last
        tail = last[-_TAIL_BYTES:] if len(last) >= _TAIL_BYTES else (prev + last)[-_TAIL_BYTES:]
        self._finish(
            group,
            up.name,
            path,
            r.status,
            outcome,
            arrived,
            queue_s,
            dispatched=dispatched,
            first_s=first_s,
            chunks=max(0, chunks - int(done)),
            tokens=completion_tokens(tail) if first_s is not None else None,
        )
        return resp

    async def _going_away(self, up: Upstream) -> bool:
        """Whether an engine that just failed a request is going away: vLLM answers /health with
        503 once its engine core is dead, and nothing once its server has stopped. Its failures
        then were its end (a stop, a crash), not the requests'."""
        try:
            r = await asyncio.wait_for(self._send(up, "GET", "/health", b"", [], b""), _GONE_PROBE_S)
            try:
                await asyncio.wait_for(r.read(), _GONE_PROBE_S)
            finally:
                r.close()
        except (UpstreamError, TimeoutError):
            return True
        return r.status == 503

    async def _abort_stream(self, request: web.BaseRequest, up: Upstream, e: BaseException) -> None:
        """End a stream whose engine died: an error event the OpenAI clients raise, then the
        connection closes without the body's end, so no client can take the text for whole."""
        event = {
            "error": {
                "message": f"engine {up.name} stopped answering mid-stream "
                f"({type(e).__name__}: {e}); the answer is incomplete",
                "type": outcomes.UPSTREAM_DIED,
                "code": 502,
            }
        }
        try:
            await cast(StreamWriter, request.writer).write(
                b"data: " + json.dumps(event).encode() + b"\n\n", drain=False
            )
        except ConnectionError:
            pass
        transport = request.transport
        if transport is not None:
            transport.close()  # after what is buffered: the event goes out, the chunked end does not

    def _finish(
        self,
        group: EngineGroup,
        engine: str | None,
        path: str,
        status: int,
        outcome: str,
        arrived: float,
        queue_s: float,
        *,
        dispatched: float | None = None,
        first_s: float | None = None,
        chunks: int = 0,
        tokens: int | None = None,
    ) -> None:
        """Record the request with its group (and whoever listens for records)."""
        now = time.monotonic()
        rec = RequestRecord(
            group=group.name,
            engine=engine,
            path=path,
            status=status,
            outcome=outcome,
            streamed=first_s is not None,
            finished_at_s=time.time(),
            queue_s=queue_s,
            ttft_s=None if first_s is None else first_s - arrived,
            e2e_s=now - arrived,
            engine_ttft_s=None if first_s is None or dispatched is None else first_s - dispatched,
            engine_e2e_s=None if dispatched is None else now - dispatched,
            output_chunks=chunks,
            output_tokens=tokens,
        )
        group.record(rec)
        if self._on_record is not None:
            self._on_record(rec)

    def _refuse(
        self,
        group: EngineGroup,
        engine: str | None,
        path: str,
        status: int,
        outcome: str,
        arrived: float,
        queue_s: float,
        message: str,
    ) -> web.Response:
        """Record a request that failed before an answer began, and the error its client gets."""
        self._finish(group, engine, path, status, outcome, arrived, queue_s)
        if outcome == outcomes.QUEUE_FULL:
            return error_response(
                503,
                f"engine group {group.name} is saturated: {message}; retry later",
                "queue_full",
                headers={"Retry-After": str(group.retry_after_s())},
                window=group.admission.window,
                queued=group.admission.queued,
            )
        if outcome == outcomes.QUEUE_TIMEOUT:
            return error_response(
                503,
                f"engine group {group.name}: {message}",
                "queue_timeout",
                headers={"Retry-After": str(group.retry_after_s())},
                window=group.admission.window,
                queued=group.admission.queued,
            )
        return error_response(status, message, outcome)


class _EngineRefused(Exception):
    """The engine did not take the request (restarting or gone), or failed it as it went away:
    nothing of an answer reached the client, so another engine may serve it."""


def _client_gone(conn: Connection | None) -> str:
    """Why a request's client went: the door cut it for not reading, or it left."""
    if conn is not None and conn.cut == "write_timeout":
        return outcomes.CLIENT_TIMEOUT
    return outcomes.CLIENT_DISCONNECTED


def state_of(gateway: Gateway) -> dict[str, Any]:
    """The door as the control API shows it."""
    return {
        "url": gateway.url,
        "key_required": gateway.key is not None or any(g.api_keys() for g in gateway.groups.values()),
        **gateway.door.state_json(),
    }
