"""Ports the daemon picks for itself: below the kernel's ephemeral range.

The daemon keeps the ports it once picked (the gateway's, the metrics exporter's, an engine's) so
that clients and other hosts' groups find them again after a restart. A port the kernel hands out
for `bind(port 0)` comes from the ephemeral range, the same range every outgoing connection on the
host takes its local port from: while the daemon is down (a crash, an upgrade), any client
connection may take the kept port, and the daemon then cannot come back on it. Ports below that
range are never handed out by the kernel on its own, so only a process that asks for one by number
can take it.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LINUX_EPHEMERAL_RANGE = (32768, 60999)  # the kernel's default where the file cannot be read
PICK_FLOOR = 20000  # above the ports services are commonly configured on (3000, 8000, 9090 ...)
MIN_PICK_SPAN = 1000  # a narrower gap below the ephemeral range: let the kernel choose
PICK_TRIES = 64


def ephemeral_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (inclusive)."""
    try:
        low, high = (int(x) for x in path.read_text().split())
    except (OSError, ValueError):
        return LINUX_EPHEMERAL_RANGE
    return low, high


def pick_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int] | None:
    """The ports this module picks from (inclusive), or None when the gap below the ephemeral
    range is too small to pick from (the kernel then chooses, as before)."""
    low, _ = ephemeral_range(path)
    if low - 1 - PICK_FLOOR < MIN_PICK_SPAN:
        return None
    return PICK_FLOOR, low - 1


def _bindable(host: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def pick_port(host: str = "127.0.0.1", *, path: Path = EPHEMERAL_RANGE_FILE, rng: random.Random | None = None) -> int:
    """A port free on `host` now, below the ephemeral range where there is room, else one the
    kernel picks. Free now only: whoever binds it next must still handle EADDRINUSE."""
    span = pick_range(path)
    if span is not None:
        choose = rng or random.SystemRandom()
        for _ in range(PICK_TRIES):
            port = choose.randint(*span)
            if _bindable(host, port):
                return port
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        picked: int = s.getsockname()[1]
        return picked
