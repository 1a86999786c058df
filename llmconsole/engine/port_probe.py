"""Who holds an engine's port: before a launch (is it free?) and while it runs (is it the engine?).

An answer on the engine's port counts only when the socket listening there belongs to the
engine's own process tree: a stranger on the port (or another engine started on it) is never
taken for the engine.
"""

from __future__ import annotations

import asyncio
import errno
import socket
import time

from llmconsole.engine.host import listening_socket_inodes, socket_holders, tree_socket_inodes
from llmconsole.engine.ports import pick_port


def connect_host(host: str) -> str:
    """Where to reach an engine that binds `host` (a wildcard is reached on loopback)."""
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


def free_port(host: str = "127.0.0.1") -> int:
    """A port for an engine that was given none: below the ephemeral range (engine/ports.py), so
    that no client connection takes it while the engine restarts."""
    return pick_port(host)


def port_holder(host: str, port: int) -> str | None:
    """Who already listens where an engine would bind `host`:`port`, or None when it is free.

    The probe binds as vLLM does (SO_REUSEADDR, so connections left in TIME_WAIT by an engine
    that just stopped do not count) and never listens.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                return None  # e.g. an address this host does not have: vLLM will say so itself
            inodes = listening_socket_inodes(port, host)
            holders = socket_holders(inodes) if inodes else []
            return ", ".join(holders) if holders else "another process"
    return None


def moved_port_note(name: str, old: int, new: int, holder: str) -> str:
    """What an engine's status says when the port picked for it before was someone else's at its
    launch, and it moved. Moving changes its URL: this host's groups follow at their next sync,
    another host's group that holds it does not, so the move is said loudly."""
    return (
        f"port {old}, picked for it before, was held by {holder} at "
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime())}: it moved to {new}. "
        f"This host's groups follow; a group on another host that holds {name} keeps "
        f"http://...:{old} until it is set again (`llmconsole group set`), or give the "
        f"engine a fixed --port"
    )


class ListenerOwnership:
    """Whether what listens on an engine's port is the engine, remembered between health checks.

    Every socket listening on the port on an address that overlaps the engine's must belong to
    its process tree. Another engine or a stranger on the engine's address and port is never the
    engine; a listener on another address with the same port number (127.0.0.2:PORT beside
    127.0.0.1:PORT) is no one's business here.

    The kernel's tables and /proc are read in a thread: the gateway shares the event loop, and
    those reads block for milliseconds (more while a flood holds many connections)."""

    def __init__(self) -> None:
        self._owned: frozenset[int] | None = None

    def forget(self) -> None:
        """A new process runs: the sockets found to be the last one's prove nothing."""
        self._owned = None

    async def problem(self, pid: int, port: int, host: str) -> str | None:
        """Why what listens on `host`:`port` is not the process tree of `pid`; None when it is
        (or this host cannot tell: no /proc, and the answer is all there is)."""
        listening = await asyncio.to_thread(listening_socket_inodes, port, host)
        if listening is None:
            return None
        if listening and listening == self._owned:
            return None  # the same sockets as last time, already found to be ours: no fd scan
        foreign = listening - await asyncio.to_thread(tree_socket_inodes, pid)
        if listening and not foreign:
            self._owned = listening
            return None
        self._owned = None
        who = ", ".join(await asyncio.to_thread(socket_holders, foreign)) or "a process of another user"
        if foreign:
            return f"port {port} is answered by {who}, not by this engine (pid {pid})"
        return f"nothing listens on port {port}"
