"""The gateway: one OpenAI-compatible front door for the host's engine groups.

  /v1/completions, /v1/chat/completions, /v1/models     routed by the body's "model" (or the
                                                         only group there is)
  /g/<group>/v1/...                                      one group, by name
  /health                                                the gateway itself

Bodies and streamed chunks pass through unchanged, byte for byte. Each request waits for a slot
of its group's admission gate (see admission.py), goes to the group's least-loaded ready engine,
and is measured: queue time, TTFT and end-to-end at the gateway. A client that goes away cancels
its request, queued or running: the server cancels the handler, which closes the upstream
connection, and vLLM aborts a request whose connection closed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web

from llmconsole.engine.gateway.admission import QueueFull, QueueTimeout
from llmconsole.engine.gateway.group import EngineGroup, RequestRecord, Upstream

log = logging.getLogger(__name__)

_API_PATHS = ("/v1/completions", "/v1/chat/completions")
# Hop-by-hop and framing headers are the gateway's own business; everything else passes.
# The usage frame's token count, read from a stream's last bytes (the frame comes just before
# [DONE]); the tail is bounded so that reading it costs the same for any answer length.
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
_TAIL_BYTES = 4096


def completion_tokens(tail: bytes) -> int | None:
    """The last usage frame's completion_tokens in a stream's tail, or None without one."""
    found = _COMPLETION_TOKENS.findall(tail)
    return int(found[-1]) if found else None


_DROP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "server", "date",
                 "upgrade", "proxy-connection", "te", "trailer"}
_NOT_READY_RETRY_S = 0.2


def error_response(status: int, message: str, kind: str, headers: dict[str, str] | None = None,
                   **extra: object) -> web.Response:
    """Errors in the OpenAI shape that clients already parse."""
    body = {"error": {"message": message, "type": kind, "code": status, **extra}}
    return web.json_response(body, status=status, headers=headers)


class Gateway:
    def __init__(self, host: str = "127.0.0.1", port: int = 0,
                 on_record: Callable[[RequestRecord], None] | None = None) -> None:
        self.host = host
        self.port = port
        self.groups: dict[str, EngineGroup] = {}
        self._on_record = on_record
        self._runner: web.AppRunner | None = None
        self._http: aiohttp.ClientSession | None = None

    # --- lifecycle ------------------------------------------------------------------------

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_get("/health", self._health)
        app.router.add_get("/v1/models", self._models_root)
        app.router.add_get("/g/{group}/v1/models", self._models_group)
        for path in _API_PATHS:
            app.router.add_post(path, self._api_root)
            app.router.add_post("/g/{group}" + path, self._api_group)
        return app

    async def start(self) -> str:
        # Unlimited pool with keep-alive: the window, not the connector, bounds concurrency.
        self._http = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5.0),
            auto_decompress=False,
        )
        # handler_cancellation: a client that disconnects cancels its handler (aiohttp >= 3.9
        # leaves handlers running by default), which is what cancels the upstream request.
        self._runner = web.AppRunner(self.make_app(), access_log=None, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        bound: tuple[Any, ...] = self._runner.addresses[0]  # (host, port[, flowinfo, scope_id])
        self.port = int(bound[1])  # the bound port when 0 was asked
        log.info("gateway listening on %s", self.url)
        return self.url

    def _client(self) -> aiohttp.ClientSession:
        if self._http is None:
            raise RuntimeError("the gateway is not started")
        return self._http

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._http is not None:
            await self._http.close()
            self._http = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def group_url(self, group: str) -> str:
        return f"{self.url}/g/{group}"

    def add_group(self, group: EngineGroup) -> EngineGroup:
        self.groups[group.name] = group
        return group

    # --- routes ---------------------------------------------------------------------------

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"groups": {n: g.admission.is_open for n, g in self.groups.items()}})

    def _group_named(self, name: str) -> EngineGroup | None:
        return self.groups.get(name)

    def _group_for_model(self, model: str | None) -> EngineGroup | None:
        if len(self.groups) == 1:
            return next(iter(self.groups.values()))
        for g in self.groups.values():
            if model is not None and (model in g.model_names or model == g.name):
                return g
        return None

    async def _api_group(self, request: web.Request) -> web.StreamResponse:
        group = self._group_named(request.match_info["group"])
        if group is None:
            return error_response(404, f"no engine group named {request.match_info['group']!r}; "
                                  f"groups: {sorted(self.groups)}", "not_found")
        path = request.path.removeprefix(f"/g/{group.name}")
        return await self.proxy(request, group, path)

    async def _api_root(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        model = None
        if len(self.groups) != 1:
            try:
                model = json.loads(body).get("model")
            except (ValueError, AttributeError):
                return error_response(400, "request body is not a JSON object", "invalid_request_error")
        group = self._group_for_model(model)
        if group is None:
            return error_response(404, f"no engine group serves model {model!r}; use /g/<group>/v1/... "
                                  f"with one of {sorted(self.groups)}", "not_found")
        return await self.proxy(request, group, request.path, body)

    async def _models_group(self, request: web.Request) -> web.StreamResponse:
        group = self._group_named(request.match_info["group"])
        if group is None:
            return error_response(404, f"no engine group named {request.match_info['group']!r}", "not_found")
        return await self.proxy(request, group, "/v1/models", admit=False)

    async def _models_root(self, request: web.Request) -> web.StreamResponse:
        if len(self.groups) == 1:
            return await self.proxy(request, next(iter(self.groups.values())), "/v1/models", admit=False)
        data = []
        for g in self.groups.values():
            up = g.pick()
            if up is None or not g.authorized(request.headers.get("Authorization")):
                continue
            try:
                async with self._client().get(f"{up.url}/v1/models", headers=_auth(up)) as r:
                    if r.status == 200:
                        data.extend((await r.json()).get("data", []))
            except (aiohttp.ClientError, OSError):
                continue
        return web.json_response({"object": "list", "data": data})

    # --- the proxy ------------------------------------------------------------------------

    async def proxy(self, request: web.Request, group: EngineGroup, path: str,
                    body: bytes | None = None, admit: bool = True) -> web.StreamResponse:
        arrived = time.monotonic()
        if not group.authorized(request.headers.get("Authorization")):
            return self._refuse(group, None, path, 401, "unauthorized", arrived, 0.0, "bad API key")
        if body is None:
            body = await request.read()
        deadline = arrived + group.admission.queue_timeout_s
        queue_s = 0.0
        while True:
            if admit:
                try:
                    await group.admission.acquire(max(0.001, deadline - time.monotonic()))
                except QueueFull as e:
                    return self._refuse(group, None, path, 503, "queue_full", arrived, 0.0, str(e))
                except QueueTimeout as e:
                    return self._refuse(group, None, path, 503, "queue_timeout", arrived,
                                        time.monotonic() - arrived, str(e))
                except asyncio.CancelledError:
                    self._finish(group, None, path, 499, "cancelled", arrived, time.monotonic() - arrived)
                    raise
            queue_s = time.monotonic() - arrived
            up = group.pick()
            try:
                if up is None:  # admitted in the instant the last engine went down
                    if time.monotonic() >= deadline:
                        return self._refuse(group, None, path, 503, "queue_timeout", arrived, queue_s,
                                            "no engine of the group became ready in time")
                    await asyncio.sleep(_NOT_READY_RETRY_S)
                    continue
                try:
                    return await self._forward(request, group, up, path, body, arrived, queue_s)
                except _EngineRefused:
                    group.mark_down(up)  # it restarts: wait for it in the queue, within the bound
                    if time.monotonic() >= deadline:
                        return self._refuse(group, up.name, path, 503, "queue_timeout", arrived, queue_s,
                                            f"engine {up.name} is not accepting connections")
                    await asyncio.sleep(_NOT_READY_RETRY_S)
            finally:
                if admit:
                    group.admission.release()

    async def _forward(self, request: web.Request, group: EngineGroup, up: Upstream, path: str,
                       body: bytes, arrived: float, queue_s: float) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP_HEADERS}
        headers.update(_auth(up))
        dispatched = time.monotonic()
        up.outstanding += 1
        first_s = None
        chunks = 0
        tail = b""
        resp: web.StreamResponse | None = None
        try:
            try:
                r = await self._client().request(request.method, f"{up.url}{path}", data=body or None,
                                             headers=headers, params=request.query)
            except (aiohttp.ClientConnectorError, aiohttp.ServerDisconnectedError) as e:
                raise _EngineRefused(str(e)) from e
            try:
                out_headers = {k: v for k, v in r.headers.items() if k.lower() not in _DROP_HEADERS}
                if not r.content_type.startswith("text/event-stream"):
                    data = await r.read()
                    resp = web.Response(body=data, status=r.status, headers=out_headers)
                else:
                    resp = web.StreamResponse(status=r.status, headers=out_headers)
                    await resp.prepare(request)
                    async for chunk in r.content.iter_any():
                        if first_s is None:
                            first_s = time.monotonic()
                            group.first_token(first_s - dispatched)
                        chunks += chunk.count(b"data: ")
                        tail = chunk[-_TAIL_BYTES:] if len(chunk) >= _TAIL_BYTES else (tail + chunk)[-_TAIL_BYTES:]
                        await resp.write(chunk)
                    await resp.write_eof()
            except BaseException:
                r.close()  # an unfinished upstream response: close its connection, vLLM aborts
                raise
            finally:
                r.release()
        except asyncio.CancelledError:
            self._finish(group, up.name, path, 499, "cancelled", arrived, queue_s, dispatched=dispatched,
                         first_s=first_s, chunks=chunks)
            raise
        except aiohttp.ClientError as e:
            if resp is not None and resp.prepared:
                self._finish(group, up.name, path, 502, "upstream_error", arrived, queue_s)
                return resp  # headers are gone: the client sees the stream end early
            return self._refuse(group, up.name, path, 502, "upstream_error", arrived, queue_s,
                                f"engine {up.name}: {e}")
        finally:
            up.outstanding -= 1
        done = b"data: [DONE]" in chunk if first_s is not None else False
        self._finish(group, up.name, path, r.status, "ok" if r.status < 400 else "upstream_error", arrived,
                     queue_s, dispatched=dispatched, first_s=first_s, chunks=max(0, chunks - int(done)),
                     tokens=completion_tokens(tail))
        return resp

    def _finish(self, group: EngineGroup, engine: str | None, path: str, status: int, outcome: str,
                arrived: float, queue_s: float, *, dispatched: float | None = None,
                first_s: float | None = None, chunks: int = 0, tokens: int | None = None) -> None:
        """Record the request with its group (and whoever listens for records)."""
        now = time.monotonic()
        rec = RequestRecord(
            group=group.name, engine=engine, path=path, status=status, outcome=outcome,
            streamed=first_s is not None, finished_at_s=time.time(), queue_s=queue_s,
            ttft_s=None if first_s is None else first_s - arrived, e2e_s=now - arrived,
            engine_ttft_s=None if first_s is None or dispatched is None else first_s - dispatched,
            engine_e2e_s=None if dispatched is None else now - dispatched, output_chunks=chunks,
            output_tokens=tokens,
        )
        group.record(rec)
        if self._on_record is not None:
            self._on_record(rec)

    def _refuse(self, group: EngineGroup, engine: str | None, path: str, status: int, outcome: str,
                arrived: float, queue_s: float, message: str) -> web.Response:
        """Record a request that failed before an answer began, and the error its client gets."""
        self._finish(group, engine, path, status, outcome, arrived, queue_s)
        if outcome == "unauthorized":
            return error_response(401, "a valid API key is required (Authorization: Bearer ...)",
                                  "authentication_error")
        if outcome == "queue_full":
            return error_response(503, f"engine group {group.name} is saturated: {message}; retry later",
                                  "queue_full", headers={"Retry-After": str(group.retry_after_s())},
                                  window=group.admission.window, queued=group.admission.queued)
        if outcome == "queue_timeout":
            return error_response(503, f"engine group {group.name}: {message}", "queue_timeout",
                                  headers={"Retry-After": str(group.retry_after_s())},
                                  window=group.admission.window, queued=group.admission.queued)
        return error_response(status, message, outcome)


class _EngineRefused(Exception):
    """The engine did not take the connection (restarting or gone): nothing reached it."""


def _auth(up: Upstream) -> dict[str, str]:
    return {"Authorization": f"Bearer {up.api_key}"} if up.api_key else {}
