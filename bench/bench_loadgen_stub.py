"""A fast stand-in for an OpenAI completions server, for measuring the load generator itself.

It answers every POST with a streamed completion of `max_tokens` one-token chunks plus a usage
chunk, on raw asyncio (no HTTP framework), so it costs far less per request than the generator
and the generator's own ceiling shows. With --first-delay-ms / --gap-ms it paces the chunks, so
the generator's measured TTFT and gaps can be set against the true ones (its timing overhead).

    python bench/bench_loadgen_stub.py --port 0      # prints "listening on PORT", serves until killed
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket

_HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\nconnection: keep-alive\r\n\r\n"
_CHUNK = b'data: {"id":"c","object":"text_completion","choices":[{"index":0,"text":"x","finish_reason":null}]}\n\n'
_USAGE = b'data: {"id":"c","object":"text_completion","choices":[],"usage":{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}}\n\n'
_DONE = b"data: [DONE]\n\n"


def _pieces(prompt_tokens: int, max_tokens: int) -> list[bytes]:
    usage = _USAGE % (prompt_tokens, max_tokens, prompt_tokens + max_tokens)
    return [_CHUNK] * max_tokens + [usage + _DONE]


class _Conn(asyncio.Protocol):
    def __init__(self, first_delay_s: float, gap_s: float, prompt_tokens: int):
        self.buf = b""
        self.first_delay_s, self.gap_s, self.prompt_tokens = first_delay_s, gap_s, prompt_tokens
        self.transport = None
        self.busy = False

    def connection_made(self, transport) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end].lower()
            length = 0
            for line in head.split(b"\r\n"):
                if line.startswith(b"content-length:"):
                    length = int(line[15:])
            end = head_end + 4 + length
            if len(self.buf) < end:
                return
            body, self.buf = self.buf[head_end + 4 : end], self.buf[end:]
            max_tokens = int(json.loads(body or b"{}").get("max_tokens", 16)) if length else 16
            pieces = _pieces(self.prompt_tokens, max_tokens)
            head_bytes = _HEAD % sum(map(len, pieces))
            if self.first_delay_s <= 0 and self.gap_s <= 0:
                self.transport.write(head_bytes + b"".join(pieces))
            else:
                asyncio.ensure_future(self._paced(head_bytes, pieces))

    async def _paced(self, head: bytes, pieces: list[bytes]) -> None:
        self.transport.write(head)
        await asyncio.sleep(self.first_delay_s)
        for k, p in enumerate(pieces):
            if k and k < len(pieces) - 1:
                await asyncio.sleep(self.gap_s)
            if self.transport.is_closing():
                return
            self.transport.write(p)


async def serve(
    port: int, first_delay_ms: float = 0.0, gap_ms: float = 0.0, prompt_tokens: int = 16, ready=None
) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: _Conn(first_delay_ms / 1000.0, gap_ms / 1000.0, prompt_tokens), "127.0.0.1", port, backlog=4096
    )
    bound = server.sockets[0].getsockname()[1]
    if ready is not None:
        ready(bound)
    else:
        print(f"listening on {bound}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--first-delay-ms", type=float, default=0.0)
    ap.add_argument("--gap-ms", type=float, default=0.0)
    ap.add_argument("--prompt-tokens", type=int, default=16)
    a = ap.parse_args()
    try:
        import uvloop  # noqa: F401  (used when present: vLLM's own environment usually has it)

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(serve(a.port, a.first_delay_ms, a.gap_ms, a.prompt_tokens))


if __name__ == "__main__":
    main()
