"""`llmconsole daemon dial-stdio`: this host's control socket on stdin and stdout.

The far end of a console on another host: that console runs `ssh HOST llmconsole daemon
dial-stdio` and speaks the control API's HTTP into the pipe. Nothing is parsed here; bytes go
both ways until either side closes. The daemon is started first if none runs (unless
--no-start), as a local console would start it. The peer the daemon sees (SO_PEERCRED) is this
process, so its audit log names the SSH login's user.
"""

from __future__ import annotations

import os
import socket
import sys
import threading

from llmconsole.paths import Paths

EXIT_NO_DAEMON = 3
_CHUNK = 64 * 1024


def _stdin_to_socket(sock: socket.socket, fd_in: int) -> None:
    try:
        while True:
            data = os.read(fd_in, _CHUNK)
            if not data:
                break
            sock.sendall(data)
    except OSError:
        pass
    try:
        sock.shutdown(socket.SHUT_WR)  # the client is done: the daemon finishes and closes
    except OSError:
        pass


def bridge(sock: socket.socket, fd_in: int, fd_out: int) -> None:
    """Copy fd_in to the socket and the socket to fd_out until the socket's side ends."""
    threading.Thread(target=_stdin_to_socket, args=(sock, fd_in), daemon=True, name="stdin").start()
    try:
        while True:
            data = sock.recv(_CHUNK)
            if not data:
                return
            view = memoryview(data)
            while view:
                view = view[os.write(fd_out, view) :]
    except OSError:  # the client went away (broken pipe) or the daemon did
        return


def _connect(paths: Paths) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(paths.socket))
    except OSError:
        sock.close()
        return None
    return sock


def dial_stdio(paths: Paths, start: bool = True) -> int:
    sock = _connect(paths)
    if sock is None and start:
        from llmconsole.console.client import DaemonNotRunning, ensure_daemon

        try:
            client, _ = ensure_daemon(paths)
            client.close()
        except DaemonNotRunning as e:
            print(f"llmconsole: {e}", file=sys.stderr)
            return EXIT_NO_DAEMON
        sock = _connect(paths)
    if sock is None:
        print(f"llmconsole: no llmconsole daemon is running for {paths.data_dir}", file=sys.stderr)
        return EXIT_NO_DAEMON
    with sock:
        bridge(sock, sys.stdin.fileno(), sys.stdout.fileno())
    return 0
