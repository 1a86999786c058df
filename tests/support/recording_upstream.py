"""An engine stand-in for tests of what the gateway forwards: it keeps the raw bytes of every
connection and parses them with h11 (an HTTP/1.1 parser of its own, not the gateway's), so a
request smuggled inside another shows up as a second request, and anything that is not HTTP as
an error. It answers every request at once with a small JSON body, or not at all (`frozen`)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import h11


@dataclass
class Received:
    """One request as the upstream parsed it; `seen` is what `on_request` said at its head."""

    method: bytes
    target: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes = b""
    seen: Any = None

    def header(self, name: bytes) -> list[bytes]:
        return [v for k, v in self.headers if k == name.lower()]


@dataclass
class Recording:
    on_request: Callable[[], Any] | None = None  # called at each request's head, e.g. to read the window
    frozen: bool = False  # accept and read, never answer
    raw: list[bytearray] = field(default_factory=list)  # per connection
    requests: list[Received] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    connections: int = 0
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        return self.url

    async def stop(self) -> None:
        self.server.close()
        for w in list(self._writers):
            w.transport.abort()
        await self.server.wait_closed()

    def all_bytes(self) -> bytes:
        return b"".join(bytes(r) for r in self.raw)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        raw = bytearray()
        self.raw.append(raw)
        conn = h11.Connection(h11.SERVER)
        current: Received | None = None
        try:
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await reader.read(65536)
                    raw += data
                    conn.receive_data(data)
                elif isinstance(event, h11.Request):
                    current = Received(event.method, event.target, list(event.headers))
                    self.requests.append(current)
                    if self.on_request is not None:
                        current.seen = self.on_request()
                elif isinstance(event, h11.Data):
                    assert current is not None
                    current.body += bytes(event.data)
                elif isinstance(event, h11.EndOfMessage):
                    if self.frozen:
                        await reader.read()  # until the gateway gives up on it
                        return
                    assert current is not None
                    writer.write(self._answer(conn, current))
                    await writer.drain()
                    conn.start_next_cycle()
                elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                    return
        except h11.RemoteProtocolError as e:
            self.errors.append(f"{type(e).__name__}: {e}")
        except (ConnectionError, h11.LocalProtocolError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    @staticmethod
    def _answer(conn: h11.Connection, req: Received) -> bytes:
        if req.target.split(b"?")[0] == b"/v1/models":
            body = json.dumps({"object": "list", "data": [{"id": "e"}]}).encode()
        else:
            body = json.dumps({"id": "x", "object": "text_completion", "choices": []}).encode()
        headers = [("Content-Type", "application/json"), ("Content-Length", str(len(body)))]
        out = conn.send(h11.Response(status_code=200, headers=headers))
        out += conn.send(h11.Data(data=body)) + conn.send(h11.EndOfMessage())
        return out
