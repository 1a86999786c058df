"""The gateway's door: what a connection may take before any of its requests reaches a group.

Every limit is a setting (`DoorLimits`, the "limits" object in the data directory's
gateway.json) with a safe default, and every refusal is counted by reason
(`llmconsole_gateway_rejected_total{reason=...}` on the daemon's /metrics):

  connections     open connections are capped at what the process's descriptor limit leaves
                  after a reserve for supervision (health checks, scrapes, launches, the control
                  socket, the database) and for the gateway's own connections to engines. At the
                  cap, the connection idle the longest is closed to make room; with none idle the
                  door stops accepting (new clients wait in the kernel's backlog), so the gateway
                  never takes a descriptor from the reserve. Clients on one host share one
                  address: nothing here counts per address.
  header_timeout  a connection gets `header_timeout_s` to send a complete request header, from
                  when it opened or its last answer ended: idle sockets and slow headers go. (On
                  Linux a socket that has sent nothing at all waits in the kernel first, for as
                  long, without the daemon ever seeing it: TCP_DEFER_ACCEPT.)
  too_large       a body over `max_body_bytes` is refused with 413 before it is read (from
                  Content-Length). A body without one (chunked) can only be refused once it has
                  been read past its cap, so its cap is lower, `max_chunked_body_bytes`: a
                  client with a larger body says its length, and a flood of chunked bodies
                  costs the door a sixteenth of what it would at the full cap.
  body_timeout    a body must arrive within `body_timeout_s` of its header.
  body_budget     bodies over 64 KiB share `body_budget_bytes` of memory (held until their
                  request ends); one that finds no room within `body_timeout_s` is answered 503.
                  Ordinary prompts are smaller and never wait for it.
  write_timeout   a client that reads nothing for `write_timeout_s` while the gateway has bytes
                  for it is cut, and its request ends (its admission slot is released then at
                  the latest; see `client_buffer_bytes`).
  host            the Host header must name loopback (or one of `allowed_hosts`) when the
                  gateway listens on loopback: a browser page cannot reach it by DNS rebinding.
                  Loopback is an IP literal (any of 127.0.0.0/8, ::1) or `localhost`; a name
                  is never judged by its prefix (`127.attacker.example` resolves wherever its
                  owner wants).
  bad_request     a CR, LF or NUL anywhere in the request line or a header, or a space in the
                  method, path, query or a header name, once percent-decoded or as sent: 400.
                  Such a request is never forwarded, whatever an engine's parser would make of
                  it (a decoded CRLF in a query once ended the gateway's upstream request line
                  and started a second request, with the engine's key, on a path of its choosing).
  upstream        not a refusal of the door's but its limits on the engines' side:
                  `upstream_first_byte_timeout_s` from sending a request to the first byte of its
                  answer's body (a stream's first token, or a whole answer that is not
                  streamed), `upstream_idle_timeout_s` between a stream's chunks after that;
                  either ends the request with a 502 (see upstream.py).
  unauthorized    the gateway key, when one is required (see proxy.py).
  descriptors     accept() itself ran out of descriptors (the limit was lowered under us).

The door keeps no timer per request: a sweep four times a second walks the idle connections
oldest first (stopping at the first that is young enough, and after 64 closes, so that sockets
opened together do not all close, and reconnect, in one go) and the busy ones, so the request path
pays for none of this but two dictionary moves.

Everything here runs on the event loop that relays every first token, and what one turn of the
loop does is what a first token may wait behind. So the door's work comes in small pieces: 4
accepts per turn (each connection then costs its turns to be read, refused and closed: about a
millisecond of CPU for a refused 60 MiB body), 8 closes per turn of a sweep, 16 KiB per read
until a body is let in. A burst of clients (a hundred refusals at once) is then spread over
many short turns, with the streams' events between them, instead of one long turn. Under
bench/bench_gateway_attack.py turns of 100-190 ms were measured with batches of 64 accepts and
256 closes and 256 KiB reads.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import errno
import ipaddress
import logging
import re
import resource
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

log = logging.getLogger(__name__)

MiB = 1024 * 1024
SMALL_BODY_BYTES = 64 * 1024  # bodies up to this size never wait for the body budget
_ACCEPT_BATCH = 4  # connections accepted per wake-up of the listening socket (per turn of the loop)
_SWEEP_S = 0.25
_DESCRIPTOR_RETRY_S = 0.5
# A connection idle for less than this is not closed to make room: a client that has just
# connected, or just had its answer, is about to send its request.
_EVICT_GRACE_S = 0.5
# Idle connections closed per sweep at most: connections opened together (a flood of idle
# sockets) expire together, and closing thousands at once (and accepting their reconnections)
# would stall the event loop for everyone else; the rest go in the next sweeps (256 a second).
# A sweep closes them a few per turn of the loop (each close frees what the client had queued).
_CLOSES_PER_SWEEP = 64
_CLOSES_PER_TURN = 8
# Bytes a client connection's transport reads at a time until its request has been let in. A
# client that sends its header and a 60 MiB body in one go fills the socket; each read hands the
# event loop that much (and, over loopback, the kernel's work of sending more) before the header
# can be refused. With asyncio's 256 KiB a refusal cost the door 1.5 ms of CPU and its loop's
# turns reached 70 ms under 90 such clients; at 16 KiB, 0.7 ms and 11-24 ms. A body that is
# let in (and holds the body budget) is read 256 KiB at a time again.
_FIRST_READ_BYTES = 16 * 1024
_BODY_READ_BYTES = 256 * 1024

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1", "[::1]", "ip6-localhost"})
# What no part of a request line may hold, decoded or not: each ends the line, a field or a
# string wherever a parser downstream of the gateway would not expect it.
_LINE_BREAKERS = re.compile(r"[\x00\r\n ]")
_FIELD_BREAKERS = re.compile(rb"[\x00\r\n]")
_NOT_TARGET = re.compile(r"[^\x21-\x7e]")  # a request target as sent is visible ASCII only


@dataclass(frozen=True)
class DoorLimits:
    """The door's settings. `max_connections` None sizes the cap from the descriptor limit."""

    max_body_bytes: int = 16 * MiB  # a 128K-token prompt is under 1 MiB of JSON; room for images
    # Bodies sent without a Content-Length (the OpenAI SDKs, curl and requests all send one);
    # never more than max_body_bytes.
    max_chunked_body_bytes: int = 1 * MiB
    body_budget_bytes: int = 64 * MiB  # bodies over 64 KiB held at once
    max_connections: int | None = None
    reserved_fds: int = 256  # kept for supervision, whatever clients do
    upstream_connections: int = 256  # the gateway's own connections to its engines
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    write_timeout_s: float = 30.0
    client_buffer_bytes: int = 1 * MiB  # a stream's bytes held for a slow client before it waits
    allowed_hosts: tuple[str, ...] = ()  # Host names accepted beside loopback's
    # From a request sent to an engine to its answer's first body byte: a stream's first token
    # (its queue wait and prefill, which a busy engine stretches to tens of seconds), or the
    # whole answer of a request that does not stream. Raise it for long unstreamed generations.
    upstream_first_byte_timeout_s: float = 300.0
    # Between a stream's chunks once it has begun (vLLM sends every few tokens; a preempted
    # request may wait its turn for some seconds). Time the client is slow to read does not count.
    upstream_idle_timeout_s: float = 60.0

    def __post_init__(self) -> None:
        for name in (
            "max_body_bytes",
            "max_chunked_body_bytes",
            "body_budget_bytes",
            "reserved_fds",
            "upstream_connections",
            "client_buffer_bytes",
        ):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"{name} must be a positive integer, not {getattr(self, name)!r}")
        if self.body_budget_bytes < self.max_body_bytes:
            raise ValueError(
                f"body_budget_bytes ({self.body_budget_bytes}) must hold at least one body of "
                f"max_body_bytes ({self.max_body_bytes})"
            )
        if self.max_connections is not None and (not isinstance(self.max_connections, int) or self.max_connections < 1):
            raise ValueError(f"max_connections must be a positive integer or null, not {self.max_connections!r}")
        for name in (
            "header_timeout_s",
            "body_timeout_s",
            "write_timeout_s",
            "upstream_first_byte_timeout_s",
            "upstream_idle_timeout_s",
        ):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0 < value <= 3600:
                raise ValueError(f"{name} must be in (0, 3600] seconds, not {value!r}")

    @classmethod
    def from_json(cls, data: Any) -> DoorLimits:
        """Limits from gateway.json's "limits" (any subset); unknown names are refused."""
        if data is None:
            return cls()
        if not isinstance(data, dict):
            raise ValueError("limits must be an object")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown gateway limits: {', '.join(sorted(unknown))}")
        fields = dict(data)
        if "allowed_hosts" in fields:
            hosts = fields["allowed_hosts"]
            if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
                raise ValueError("allowed_hosts must be a list of host names")
            fields["allowed_hosts"] = tuple(h.lower() for h in hosts)
        return cls(**fields)

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["allowed_hosts"] = list(self.allowed_hosts)
        return out


# --- descriptors ----------------------------------------------------------------------------


def descriptor_limit() -> int:
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return 1 << 20 if soft == resource.RLIM_INFINITY else int(soft)


def raise_descriptor_limit() -> tuple[int, int]:
    """Raise this process's soft descriptor limit to its hard limit; returns (before, after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as e:
            log.warning("could not raise the descriptor limit from %d to %d: %s", soft, hard, e)
    return int(soft), descriptor_limit()


def connection_cap(limits: DoorLimits, nofile: int | None = None) -> int:
    """Client connections the door keeps open at most: the descriptor limit less the reserve for
    supervision and the engines' side, and never more than `max_connections`."""
    room = (descriptor_limit() if nofile is None else nofile) - limits.reserved_fds - limits.upstream_connections
    cap = max(16, room)
    return cap if limits.max_connections is None else min(cap, limits.max_connections)


# --- Host ---------------------------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    """Whether `host` is a loopback name or IP literal (any of 127.0.0.0/8, ::1). A name that only
    starts like one (`127.attacker.example`) is not: its owner's DNS says where it points."""
    h = host.lower()
    if h in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(h[1:-1] if h.startswith("[") and h.endswith("]") else h).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The name in a Host header, without its port: `[::1]:8000` -> `[::1]`, `a.b:80` -> `a.b`."""
    h = header.strip().lower()
    if h.startswith("["):
        end = h.find("]")
        return h[: end + 1] if end > 0 else h
    if h.count(":") == 1:
        h = h.split(":", 1)[0]
    return h.rstrip(".")


def host_allowed(header: str | None, allowed: frozenset[str] | None) -> bool:
    """Whether a request's Host header may reach a door that listens on loopback. `allowed` None
    means any (the operator bound elsewhere). No header at all is not a browser: allowed."""
    if allowed is None or header is None:
        return True
    name = host_name(header)
    return name in allowed or is_loopback(name)


def allowed_hosts(bound_host: str, limits: DoorLimits) -> frozenset[str] | None:
    """The Host names a door bound to `bound_host` accepts: loopback's, or any when bound elsewhere."""
    if not is_loopback(bound_host):
        return None if not limits.allowed_hosts else frozenset(limits.allowed_hosts) | {bound_host.lower()}
    return LOOPBACK_NAMES | frozenset(limits.allowed_hosts)


# --- what may be forwarded ---------------------------------------------------------------------


def request_fault(request: web.BaseRequest) -> str | None:
    """What in a request could end a line of the request the gateway makes from it, or None.
    Checked as sent and as percent-decoded: the engine gets the raw form, but no honest client
    needs a CR, LF or NUL in either, and refusing them here keeps them from every parser and
    log behind the door."""
    url = request.rel_url
    for what, text in (("path", url.raw_path), ("query", url.raw_query_string)):
        if _NOT_TARGET.search(text):
            return f"the {what} holds a character that must be percent-encoded"
    for what, text in (("method", request.method), ("path", request.path), ("query", request.query_string)):
        if _LINE_BREAKERS.search(text):
            return f"the {what} holds a CR, LF, NUL or space"
    for name, value in request.raw_headers:
        if _FIELD_BREAKERS.search(name) or b" " in name or b"\t" in name:
            return "a header name holds a CR, LF, NUL or space"
        if _FIELD_BREAKERS.search(value):
            return f"header {name.decode('latin-1')!r} holds a CR, LF or NUL"
    return None


# --- the body budget ----------------------------------------------------------------------------


class BodyTooLarge(Exception):
    """The body is over its cap: `limit_bytes`, the cap it passed, and whether it came without a
    Content-Length (held to the lower cap for chunked bodies)."""

    def __init__(self, limit_bytes: int, chunked: bool) -> None:
        super().__init__(limit_bytes, chunked)
        self.limit_bytes = limit_bytes
        self.chunked = chunked

    def describe(self, max_body_bytes: int) -> str:
        if self.chunked:
            return (
                f"the request body, sent without a Content-Length, is over the gateway's limit of "
                f"{self.limit_bytes} bytes for such bodies; send its Content-Length (bodies up to "
                f"{max_body_bytes} bytes)"
            )
        return f"the request body is over the gateway's limit of {self.limit_bytes} bytes"


class BodyBusy(Exception):
    """Large bodies already hold the whole budget and none finished within the body timeout."""


class BodyBudget:
    """Bytes of large bodies held at once, granted whole and in arrival order."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    async def take(self, n: int, timeout_s: float) -> None:
        if not self._waiters and self.used + n <= self.capacity:
            self.used += n
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (n, fut)
        self._waiters.append(entry)
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout_s)
        except (TimeoutError, asyncio.CancelledError) as e:
            if fut.done() and not fut.cancelled():
                self.give(n)  # granted in the same instant: hand it on
            else:
                fut.cancel()
                with contextlib.suppress(ValueError):
                    self._waiters.remove(entry)
                self._grant()
            if isinstance(e, TimeoutError):
                raise BodyBusy(f"large request bodies hold all {self.capacity // MiB} MiB of the body budget") from None
            raise

    def give(self, n: int) -> None:
        self.used -= n
        self._grant()

    def _grant(self) -> None:
        while self._waiters and self.used + self._waiters[0][0] <= self.capacity:
            n, fut = self._waiters.popleft()
            if fut.done():
                continue
            self.used += n
            fut.set_result(None)


# --- connections ----------------------------------------------------------------------------


def _read_size(transport: asyncio.BaseTransport, n: int) -> None:
    """Set how many bytes a socket transport reads at a time: `max_size` of CPython's selector
    transport (a class attribute, 256 KiB, shadowed here per connection); a loop whose
    transports have none keeps its own."""
    if isinstance(getattr(transport, "max_size", None), int):
        with contextlib.suppress(AttributeError):
            transport.max_size = n  # type: ignore[attr-defined]


@dataclass(eq=False)
class Connection:
    """One client connection as the door keeps it."""

    transport: asyncio.Transport
    opened_at: float
    idle_since: float | None  # None while a request is being handled or answered
    requests: int = 0
    body_since: float | None = None
    paused_at: float | None = None
    draining: bool = False  # the handler is done; its answer still sits in the buffer
    cut: str | None = None  # why the door closed it, once it did


class _DoorServer(web.Server):
    """aiohttp's low-level server, telling the door about each connection it serves."""

    def __init__(self, handler: Any, door: Door, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self._door = door

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        self._door.opened(handler, transport)

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        super().connection_lost(handler, exc)
        self._door.lost(handler)


class Door:
    """The listening socket, its accept loop and every open connection of one gateway."""

    def __init__(self, limits: DoorLimits | None = None) -> None:
        self.limits = limits or DoorLimits()
        self.rejected: collections.Counter[str] = collections.Counter()
        self.conns: dict[RequestHandler, Connection] = {}
        self._idle: dict[RequestHandler, None] = {}  # oldest idle first
        self._busy: set[RequestHandler] = set()
        self.budget = BodyBudget(self.limits.body_budget_bytes)
        self.cap = 0
        self.peak_connections = 0
        self.server: _DoorServer | None = None
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending = 0  # accepted, not yet handed to the server
        self._cutting = 0  # closed by the door, not yet gone
        self._paused = False
        self._out_of_descriptors = False
        self._retry: asyncio.TimerHandle | None = None
        self._adopting: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self.loop_lag_max_s = 0.0

    # --- lifecycle --------------------------------------------------------------------------

    def make_server(self, handler: Callable[[web.BaseRequest], Any]) -> _DoorServer:
        lim = self.limits
        # aiohttp's own keep-alive timer stays as a backstop behind the sweep's; no lingering
        # read of a body the gateway refused.
        self.server = _DoorServer(
            handler,
            self,
            handler_cancellation=True,
            access_log=None,
            keepalive_timeout=lim.header_timeout_s + 5.0,
            lingering_time=0.0,
        )
        return self.server

    async def listen(self, host: str, port: int, backlog: int = 4096) -> int:
        """Bind and start accepting; returns the bound port. OSError when the port is taken."""
        if self.server is None:
            raise RuntimeError("make_server() first")
        self._loop = asyncio.get_running_loop()
        infos = await self._loop.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, _, _, _, addr = infos[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if hasattr(socket, "TCP_DEFER_ACCEPT"):
                # Linux keeps a connection that has sent nothing in the kernel for up to the
                # header timeout: idle sockets cost the daemon nothing until then.
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_DEFER_ACCEPT, max(1, int(self.limits.header_timeout_s)))
            sock.bind(addr)
            sock.listen(backlog)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self.cap = connection_cap(self.limits)
        self._loop.add_reader(sock.fileno(), self._accept)
        self._sweeper = asyncio.create_task(self._sweep_forever(), name="gateway-door-sweep")
        return int(sock.getsockname()[1])

    async def close(self, timeout_s: float = 2.0) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        if self._retry is not None:
            self._retry.cancel()
        if self._sock is not None and self._loop is not None:
            if not self._paused:
                self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
        for t in list(self._adopting):
            t.cancel()
        if self.server is not None:
            self.server.pre_shutdown()
            await self.server.shutdown(timeout_s)

    # --- accepting --------------------------------------------------------------------------

    @property
    def open_connections(self) -> int:
        return len(self.conns)

    def _accept(self) -> None:
        sock, loop = self._sock, self._loop
        if sock is None or loop is None:
            return
        for _ in range(_ACCEPT_BATCH):
            # A connection the door cut holds its descriptor until its transport is gone (a turn
            # of the loop later), so it counts against the cap until `lost`. At the cap a client
            # that is waiting is taken in place of the connection idle the longest, one at a time:
            # counting a cut as free at once let a burst hold a batch of descriptors past the cap.
            full = len(self.conns) + self._pending >= self.cap
            if full:
                wait_s = self._evictable_in()
                if wait_s or self._cutting:  # nothing to make room with yet: clients wait in the backlog
                    self._pause(wait_s or _EVICT_GRACE_S)  # `lost` resumes sooner
                    return
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    self.rejected["descriptors"] += 1
                    log.warning(
                        "the gateway ran out of descriptors accepting a connection (%s); pausing accepts for %.1f s",
                        e,
                        _DESCRIPTOR_RETRY_S,
                    )
                    self._pause(_DESCRIPTOR_RETRY_S, out_of_descriptors=True)
                    return
                if e.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EPERM):
                    continue
                log.error("accept on the gateway's socket failed: %s", e)
                return
            conn.setblocking(False)
            self._pending += 1
            task = loop.create_task(self._adopt(conn))
            self._adopting.add(task)
            task.add_done_callback(self._adopting.discard)
            if full:
                self._evict()
                self._pause(_EVICT_GRACE_S)  # until the evicted one is gone (`lost` resumes)
                return

    async def _adopt(self, conn: socket.socket) -> None:
        assert self._loop is not None and self.server is not None
        try:
            await self._loop.connect_accepted_socket(self.server, conn)
        except (OSError, asyncio.CancelledError):
            conn.close()
        finally:
            self._pending -= 1

    def _pause(self, retry_s: float, out_of_descriptors: bool = False) -> None:
        """Stop accepting for `retry_s` (a connection that closes resumes it sooner, unless the
        process ran out of descriptors)."""
        if not self._paused and self._sock is not None and self._loop is not None:
            self._loop.remove_reader(self._sock.fileno())
            self._paused = True
        self._out_of_descriptors = out_of_descriptors
        if self._loop is not None:
            if self._retry is not None:
                self._retry.cancel()
            self._retry = self._loop.call_later(retry_s, self._resume)

    def _resume(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        self._out_of_descriptors = False
        if self._paused and self._sock is not None and self._loop is not None:
            self._paused = False
            self._loop.add_reader(self._sock.fileno(), self._accept)
            self._accept()

    def _evictable_in(self) -> float | None:
        """At the cap: None when the connection idle the longest may be closed now, else how
        long until it may (or until something changes, with none idle)."""
        h = next(iter(self._idle), None)
        if h is None:
            return _EVICT_GRACE_S
        since = self.conns[h].idle_since
        age = time.monotonic() - (since if since is not None else 0.0)
        return None if age >= _EVICT_GRACE_S else max(0.02, _EVICT_GRACE_S - age)

    def _evict(self) -> None:
        """At the cap: close the connection idle the longest to make room."""
        h = next(iter(self._idle), None)
        if h is not None:
            self._cut(h, self.conns[h], "connections")

    # --- what the server and the gateway tell the door ---------------------------------------

    def opened(self, h: RequestHandler, transport: asyncio.Transport) -> None:
        _read_size(transport, _FIRST_READ_BYTES)
        now = time.monotonic()
        self.conns[h] = Connection(transport, now, now)
        self._idle[h] = None
        if len(self.conns) > self.peak_connections:
            self.peak_connections = len(self.conns)

    def lost(self, h: RequestHandler) -> None:
        c = self.conns.pop(h, None)
        if c is None:
            return
        self._idle.pop(h, None)
        self._busy.discard(h)
        if c.cut is not None:
            self._cutting -= 1
        if self._paused and not self._out_of_descriptors:
            self._resume()

    def begin(self, h: RequestHandler) -> Connection | None:
        """A request's header arrived on `h`: the connection is busy until `end`."""
        c = self.conns.get(h)
        if c is not None:
            self._idle.pop(h, None)
            self._busy.add(h)
            c.idle_since = None
            c.draining = False
            c.requests += 1
        return c

    def end(self, h: RequestHandler, c: Connection | None) -> None:
        """The handler returned. An answer still in the buffer keeps the connection busy (the
        write timeout watches it) until it is sent."""
        if c is None or c.cut is not None or h not in self.conns:
            return
        c.body_since = None
        _read_size(c.transport, _FIRST_READ_BYTES)  # the next request on it starts over
        if c.transport.get_write_buffer_size():
            c.draining = True
            return
        self._busy.discard(h)
        c.idle_since = time.monotonic()
        c.paused_at = None
        self._idle[h] = None

    def reject(self, reason: str) -> None:
        self.rejected[reason] += 1

    def _cut(self, h: RequestHandler, c: Connection, reason: str, counted: bool = True) -> None:
        if c.cut is not None:
            return
        c.cut = reason
        self._cutting += 1
        if counted:
            self.rejected[reason] += 1
        self._idle.pop(h, None)
        self._busy.discard(h)
        if c.transport.get_write_buffer_size() or reason in ("write_timeout", "body_timeout"):
            c.transport.abort()  # what is buffered will never be read: drop it with the socket
        else:
            c.transport.close()

    # --- bodies -----------------------------------------------------------------------------

    async def read_body(self, request: web.BaseRequest, c: Connection | None) -> tuple[bytes, int]:
        """The request's body and the bytes of the body budget it holds (give them back with
        `budget.give` when the request ends). BodyTooLarge, BodyBusy; a client that leaves
        mid-body raises what aiohttp raises (the handler is cancelled)."""
        lim = self.limits
        length = request.content_length
        if length is not None and length > lim.max_body_bytes:
            raise BodyTooLarge(lim.max_body_bytes, chunked=False)
        if c is not None:
            c.body_since = time.monotonic()
        held = 0
        try:
            if length is not None:
                if length > SMALL_BODY_BYTES:
                    await self.budget.take(length, lim.body_timeout_s)
                    held = length
                    if c is not None:
                        _read_size(c.transport, _BODY_READ_BYTES)
                body = await request.content.readexactly(length) if length else b""
            else:
                cap = min(lim.max_chunked_body_bytes, lim.max_body_bytes)
                parts: list[bytes] = []
                size = 0
                async for chunk in request.content.iter_any():
                    size += len(chunk)
                    if size > cap:
                        raise BodyTooLarge(cap, chunked=True)
                    if size > SMALL_BODY_BYTES and not held:
                        await self.budget.take(cap, lim.body_timeout_s)
                        held = cap
                    parts.append(chunk)
                body = b"".join(parts)
                if held:
                    self.budget.give(held - len(body))
                    held = len(body)
        except BaseException:
            if held:
                self.budget.give(held)
            raise
        finally:
            if c is not None:
                c.body_since = None
        return body, held

    # --- the sweep --------------------------------------------------------------------------

    async def _sweep_forever(self) -> None:
        while True:
            due = time.monotonic() + _SWEEP_S
            await asyncio.sleep(_SWEEP_S)
            # How late the event loop ran this: what everything on it (supervision too) waited.
            self.loop_lag_max_s = max(self.loop_lag_max_s, time.monotonic() - due)
            now = time.monotonic()
            try:
                self.sweep_busy(now)
                for _ in range(_CLOSES_PER_SWEEP // _CLOSES_PER_TURN):
                    if self.sweep_idle(now, _CLOSES_PER_TURN) < _CLOSES_PER_TURN:
                        break
                    await asyncio.sleep(0)  # a turn of the loop between batches: streams go on
            except Exception:  # the door must keep sweeping whatever one connection does
                log.exception("gateway door sweep failed")

    def sweep_idle(self, now: float, most: int) -> int:
        """Close up to `most` connections idle past the header timeout, oldest first; returns
        how many it closed."""
        expired = now - self.limits.header_timeout_s
        idle_out: list[RequestHandler] = []
        for h in self._idle:
            since = self.conns[h].idle_since
            if since is not None and since > expired or len(idle_out) >= most:
                break
            idle_out.append(h)
        for h in idle_out:
            c = self.conns[h]
            # A connection that never completed a request header is a refusal; one that waited
            # for its next request is only a keep-alive that ended.
            self._cut(h, c, "header_timeout" if c.requests == 0 else "idle", counted=c.requests == 0)
        return len(idle_out)

    def sweep_busy(self, now: float) -> None:
        """Cut busy connections past their body or write timeout."""
        for h in list(self._busy):
            b = self.conns.get(h)
            if b is None:
                self._busy.discard(h)
                continue
            self._check_busy(h, b, now)

    def _check_busy(self, h: RequestHandler, c: Connection, now: float) -> None:
        lim = self.limits
        if c.body_since is not None and now - c.body_since > lim.body_timeout_s:
            self._cut(h, c, "body_timeout")
        elif h.writing_paused or (c.draining and c.transport.get_write_buffer_size()):
            if c.paused_at is None:
                c.paused_at = now
            elif now - c.paused_at > lim.write_timeout_s:
                self._cut(h, c, "write_timeout")
        elif c.draining:
            self.end(h, c)  # the answer went out since
        else:
            c.paused_at = None

    def state_json(self) -> dict[str, Any]:
        return {
            "connections": len(self.conns),
            "connection_cap": self.cap,
            "peak_connections": self.peak_connections,
            "descriptor_limit": descriptor_limit(),
            "body_budget_used": self.budget.used,
            "loop_lag_max_s": round(self.loop_lag_max_s, 4),
            "rejected": dict(self.rejected),
            "limits": self.limits.to_json(),
        }
