"""`llmconsole daemon dial-stdio`: this host's control socket on stdin and stdout.

The far end of a console on another host: that console runs `ssh HOST llmconsole daemon
dial-stdio` and speaks the control API's HTTP into the pipe. Nothing is parsed here; bytes go
both ways until either side closes. The daemon is started first if none runs (unless
--no-start), as a local console would start it. The peer the daemon sees (SO_PEERCRED) is this
process, so its audit log names the SSH login's user.

The socket is the one of the SSH login's user, often in /tmp (XDG_RUNTIME_DIR is unset in many
SSH sessions), where anyone could have made the folder and a socket first. So the bridge is
opened only after the same checks as a local client's (paths.py `connect_control`): the folders
are the user's own, and so are the socket and the process listening on it. Anything else is
refused with exit status 2 and its reason on stderr, before a byte of the console's is read or sent.
"""

from __future__ import annotations

import os
import socket
import sys
import threading

from llmconsole.paths import Paths, UnsafeDirectory

EXIT_UNSAFE = 2
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
    """The checked connection (UnsafeDirectory when it is not the user's), or None: no daemon."""
    try:
        sock = paths.connect_control()
    except UnsafeDirectory:
        raise
    except OSError:
        return None
    sock.settimeout(None)
    return sock


def dial_stdio(paths: Paths, start: bool = True) -> int:
    try:
        return _dial(paths, start)
    except UnsafeDirectory as e:
        print(f"llmconsole: {e}", file=sys.stderr)
        return EXIT_UNSAFE


def _dial(paths: Paths, start: bool) -> int:
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
