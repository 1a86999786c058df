"""What the gateway forwards, read by an HTTP parser of its own (h11, in
tests/support/recording_upstream.py): a query or header crafted to end the request early never
makes a second request reach the engine, and every request the engine gets is exactly one, on a
path the gateway allows, admitted through the window, with the engine's key and never the
client's. The property test runs a bounded number of examples here; `make fuzz` runs thousands."""

from __future__ import annotations

import asyncio
import os
import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmconsole.engine.gateway.group import EngineGroup, Upstream
from llmconsole.engine.gateway.pid import PidSettings
from llmconsole.engine.gateway.proxy import Gateway
from tests.support.recording_upstream import Recording

ENGINE_KEY = "engine-key-0123"
GATEWAY_KEY = "gateway-key-4567"
ALLOWED = {b"/v1/completions", b"/v1/chat/completions", b"/v1/models", b"/health"}
WINDOWED = {b"/v1/completions", b"/v1/chat/completions"}
# The smuggling query: percent-decoded, it ends the request line and starts a second request.
SMUGGLE = "?x%20HTTP/1.1%0D%0AHost:%20a%0D%0AContent-Length:%200%0D%0A%0D%0APOST%20/sleep?level=1%20HTTP/1.1%0D%0AX:"

settings.register_profile(
    "fast", max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
settings.register_profile(
    "fuzz", max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


class Rig:
    """A gateway (with a key) and one group of one recording engine (with a key of its own)."""

    def __init__(self) -> None:
        self.up = Recording(on_request=self._window)

    def _window(self) -> int:
        return self.group.admission.in_flight

    async def start(self) -> None:
        await self.up.start()
        self.gw = Gateway("127.0.0.1", key=GATEWAY_KEY)
        self.group = EngineGroup(
            "g",
            [Upstream("e", self.up.url, ENGINE_KEY)],
            settings=PidSettings(start_window=4, min_window=1),
            controlled=False,
            queue_timeout_s=10.0,
        )
        self.group.model_names = {"e"}
        self.gw.add_group(self.group)
        await self.gw.start()

    async def close(self) -> None:
        await self.gw.close()
        await self.up.stop()

    async def send(self, data: bytes, timeout_s: float = 10.0) -> bytes:
        """Send raw bytes (one request, with Connection: close) on a new connection; everything
        the gateway answers until it closes."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.gw.port)
        try:
            writer.write(data)
            await writer.drain()
            got = b""
            while True:
                try:
                    chunk = await asyncio.wait_for(reader.read(65536), timeout_s)
                except ConnectionResetError:
                    return got
                if not chunk:
                    return got
                got += chunk
        finally:
            writer.close()


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def check_forwarded(rig: Rig, sent: bytes, before: int) -> None:
    """The property: what the engine got from one client request."""
    new = rig.up.requests[before:]
    assert not rig.up.errors, rig.up.errors
    assert len(new) <= 1, [r.target for r in new]
    for r in new:
        path = r.target.split(b"?", 1)[0]
        assert path in ALLOWED, r.target
        if path in WINDOWED:
            assert r.method == b"POST"
            assert r.seen is not None and r.seen >= 1, "reached the engine outside the window"
        assert r.header(b"authorization") == [f"Bearer {ENGINE_KEY}".encode()]
        assert len(r.header(b"host")) == 1
    assert GATEWAY_KEY.encode() not in rig.up.all_bytes()


def run_rig(body) -> None:
    async def main():
        rig = Rig()
        await rig.start()
        try:
            await body(rig)
        finally:
            await rig.close()

    asyncio.run(main())


# --- the smuggling query ------------------------------------------------------------------------


def _post(target: str, extra: bytes = b"", body: bytes = b'{"prompt": "hi"}', key: str = GATEWAY_KEY) -> bytes:
    return (
        (
            f"POST {target} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nConnection: close\r\nContent-Length: {len(body)}\r\n"
        ).encode()
        + extra
        + b"\r\n"
        + body
    )


def test_a_query_that_decodes_to_a_second_request_is_refused_and_reaches_no_engine():
    async def body(rig: Rig) -> None:
        answer = await rig.send(_post("/g/g/v1/completions" + SMUGGLE))
        assert status_of(answer) == 400, answer[:200]
        assert b"invalid_request" in answer
        assert rig.up.requests == [] and rig.up.errors == []
        assert rig.gw.door.rejected["bad_request"] == 1
        assert rig.group.admission.stats().admitted_total == 0
        # A query that is only percent-encoded text goes through as it came, still encoded.
        answer = await rig.send(_post("/g/g/v1/completions?tag=a%2Fb%3Dc"))
        assert status_of(answer) == 200, answer[:200]
        [r] = rig.up.requests
        assert r.target == b"/v1/completions?tag=a%2Fb%3Dc"
        check_forwarded(rig, b"", 0)

    run_rig(body)


@pytest.mark.parametrize(
    "target",
    [
        "/g/g/v1/completions?a=%0D%0AX:%20y",
        "/g/g/v1/completions?a=%00",
        "/g/g/v1/completions?a=b%20c",
        "/g/g/v1%0D%0A/completions",
        "/g/g/v1/completions%20HTTP/1.1",
    ],
)
def test_cr_lf_nul_or_space_in_a_path_or_query_is_a_counted_400(target):
    async def body(rig: Rig) -> None:
        answer = await rig.send(_post(target))
        assert status_of(answer) == 400, answer[:200]
        assert rig.up.requests == []
        assert rig.gw.door.rejected["bad_request"] == 1

    run_rig(body)


# --- the property -------------------------------------------------------------------------------

_TOKEN = "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_PATHS = [
    "/v1/completions",
    "/v1/chat/completions",
    "/v1/models",
    "/g/g/v1/completions",
    "/g/g/v1/chat/completions",
    "/g/g/v1/models",
    "/health",
    "/sleep",
    "/g/g/sleep",
    "/g/g/../sleep",
    "/g/g/v1/../../sleep",
    "/metrics",
    "/g/nope/v1/completions",
]


def _encode(text: str, data) -> str:
    """Percent-encode some characters of `text` (all of those that cannot stand in a target)."""
    out = []
    for ch in text:
        raw = ch.encode()
        must = not all(0x21 <= b <= 0x7E for b in raw) or ch in "%#?"
        if must or data.draw(st.booleans()):
            out.append("".join(f"%{b:02X}" for b in raw))
        else:
            out.append(ch)
    return "".join(out)


@st.composite
def requests(draw) -> bytes:
    method = draw(st.sampled_from(["POST", "GET", "PUT", "DELETE", "OPTIONS", "PATCH", "HEAD"]))
    path = draw(st.sampled_from(_PATHS))
    path = "/".join(_encode(seg, _Draw(draw)) if draw(st.booleans()) else seg for seg in path.split("/"))
    query = ""
    if draw(st.booleans()):
        text = draw(st.one_of(st.text(max_size=40), st.sampled_from([SMUGGLE[1:], "x=1&y=%0d%0a", "a=\x00"])))
        query = "?" + (text if text.startswith("x%20") else _encode(text, _Draw(draw)))
    key = draw(st.sampled_from([GATEWAY_KEY, ENGINE_KEY, "wrong", None]))
    headers = [("Host", draw(st.sampled_from(["127.0.0.1", "localhost:8", "[::1]", "127.attacker.example"])))]
    if key is not None:
        headers.append(("Authorization", f"Bearer {key}"))
    for _ in range(draw(st.integers(0, 4))):
        name = draw(st.text(alphabet=_TOKEN, min_size=1, max_size=12))
        value = draw(
            st.one_of(
                st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=30),
                st.sampled_from(["a\r\nX-Injected: 1", "v\x00", "x HTTP/1.1", "a\rb", "a\nb"]),
            )
        )
        headers.append((name, value))
    if draw(st.booleans()):  # a second key header: neither may reach the engine
        headers.append(("authorization", f"Bearer {draw(st.sampled_from([GATEWAY_KEY, 'other']))}"))
    payload = draw(st.sampled_from([b'{"prompt": "hi"}', b"", b'{"model": "e", "prompt": "POST /sleep HTTP/1.1"}']))
    framing = draw(st.sampled_from(["length", "chunked", "none"]))
    headers.append(("Connection", "close"))
    head = f"{method} {path}{query} HTTP/1.1\r\n".encode("utf-8", "surrogateescape")
    for name, value in headers:
        head += name.encode() + b": " + value.encode("utf-8", "surrogateescape") + b"\r\n"
    if framing == "length":
        return head + f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload
    if framing == "chunked":
        cut = draw(st.integers(0, len(payload)))
        parts = [p for p in (payload[:cut], payload[cut:]) if p]
        chunks = b"".join(f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in parts)
        return head + b"Transfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n"
    return head + b"\r\n"


class _Draw:
    """Lets a helper draw from inside a composite strategy."""

    def __init__(self, draw) -> None:
        self._draw = draw

    def draw(self, strategy):
        return self._draw(strategy)


@settings(settings.get_profile(os.environ.get("LLMCONSOLE_HYPOTHESIS_PROFILE", "fast")))
@given(st.lists(requests(), min_size=1, max_size=3))
def test_every_forwarded_request_is_one_allowed_admitted_request_with_the_engines_key(batch):
    async def body(rig: Rig) -> None:
        for sent in batch:
            before = len(rig.up.requests)
            await rig.send(sent)
            check_forwarded(rig, sent, before)

    run_rig(body)


def test_the_recording_upstream_sees_a_smuggled_request_as_a_second_one():
    """The property's parser is able to see what it looks for: bytes that carry two requests
    are two requests to it."""

    async def main():
        up = Recording()
        await up.start()
        try:
            data = (
                b"POST /v1/completions?x HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n"
                b"POST /sleep?level=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n"
            )
            with socket.create_connection(("127.0.0.1", up.port)) as s:
                s.sendall(data)
                s.shutdown(socket.SHUT_WR)
                await asyncio.get_running_loop().run_in_executor(None, lambda: s.recv(65536))
                while len(up.requests) < 2:
                    await asyncio.sleep(0.01)
            assert [r.target for r in up.requests] == [b"/v1/completions?x", b"/sleep?level=1"]
        finally:
            await up.stop()

    asyncio.run(main())
