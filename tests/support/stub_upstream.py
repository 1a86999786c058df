"""A local stand-in for an engine's OpenAI-shaped HTTP surface, for the gateway's component tests:
it only streams canned chunks and records what reached it."""

from __future__ import annotations

import asyncio

from aiohttp import web


class Stub:
    """An OpenAI-shaped upstream: streams `chunks` SSE events `delay_s` apart (or one JSON body)."""

    def __init__(self, name="stub", chunks=5, delay_s=0.01, api_key=None):
        self.name, self.chunks, self.delay_s, self.api_key = name, chunks, delay_s, api_key
        self.active = self.peak = self.started = self.cancelled = self.finished = 0
        self.auth_seen: list[str | None] = []
        self.healthy = True  # what /health answers: 200, else 503
        self.health_checks = 0

    async def completions(self, request: web.Request) -> web.StreamResponse:
        self.auth_seen.append(request.headers.get("Authorization"))
        body = await request.json()
        self.active += 1
        self.started += 1
        self.peak = max(self.peak, self.active)
        try:
            if not body.get("stream"):
                await asyncio.sleep(self.delay_s * self.chunks)
                self.finished += 1
                return web.json_response(
                    {"id": "x", "from": self.name, "echo": body.get("prompt")}, headers={"X-Stub": self.name}
                )
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "X-Stub": self.name})
            await resp.prepare(request)
            for k in range(self.chunks):
                await asyncio.sleep(self.delay_s)
                await resp.write(f'data: {{"from": "{self.name}", "k": {k}, "text": "t\\u00e9"}}\n\n'.encode())
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            self.finished += 1
            return resp
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.active -= 1

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": self.name}]})

    async def health(self, request: web.Request) -> web.Response:
        self.health_checks += 1
        return web.Response(status=200 if self.healthy else 503)

    async def start(self, port: int = 0) -> str:
        """Listen on `port` (0: a free one); a stub stopped with `stop` can start again on its port."""
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        self.runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.1)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", port, reuse_address=True)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        return self.url

    async def stop(self) -> None:
        """Go away as an engine that is stopped does: the port closes, requests in flight end unanswered."""
        await self.runner.cleanup()
