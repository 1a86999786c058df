"""Where llmconsole keeps its state on a host.

`LLMCONSOLE_HOME` moves everything (socket, logs, database, state) under one directory, which is
how tests and two side-by-side consoles stay out of each other's way. Without it the XDG
locations apply: data under $XDG_DATA_HOME/llmconsole, the control socket under
$XDG_RUNTIME_DIR/llmconsole (or a private directory in /tmp when no runtime dir exists).

Each of these directories must be the user's own: a directory in /tmp can be created first by
anyone, who could then answer on the control socket or redirect the pid file. A directory owned
by someone else, writable by others, or that is a symbolic link is refused with its path and the
fix; it is never used, and never followed.

The control socket itself is trusted only after two more checks, made by every client before it
sends a byte (the local client, `daemon dial-stdio` on the far side of an SSH session, the
console's sources): the socket file is a socket owned by this user, and the process listening on
it (SO_PEERCRED) runs as this user. Root is trusted too: it can read and replace anything of the
user's already.
"""

from __future__ import annotations

import os
import socket
import stat
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

Socket = socket.socket  # Paths has a `socket` of its own (the path): the type, by another name

# sun_path is 108 bytes on Linux, including the terminating NUL.
_MAX_SOCKET_PATH_BYTES = 107


class UnsafeDirectory(ValueError):
    """A directory llmconsole keeps private state in is not safely the user's own."""


def check_private_dir(path: Path, fix: str | None = None) -> None:
    """Refuse (UnsafeDirectory) `path` unless it is a real directory (not a symbolic link),
    owned by this user, that nobody else may write to. A missing directory is fine. `fix` is what
    the message tells the user to do instead (default: about llmconsole's own directories)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    uid = os.getuid()
    fix = fix or (
        "remove it (as its owner) so llmconsole can create its own, or point LLMCONSOLE_HOME "
        "(or XDG_RUNTIME_DIR) at a directory of yours"
    )
    if stat.S_ISLNK(st.st_mode):
        raise UnsafeDirectory(f"{path} is a symbolic link, which llmconsole does not follow; {fix}")
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirectory(f"{path} is not a directory; {fix}")
    if st.st_uid != uid:
        raise UnsafeDirectory(f"{path} belongs to uid {st.st_uid}, not to you (uid {uid}); {fix}")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeDirectory(
            f"{path} is writable by others (mode {stat.S_IMODE(st.st_mode):04o}); "
            f"run `chmod go-w {path}` (llmconsole makes its directories 0700)"
        )


class UntrustedSocket(UnsafeDirectory):
    """The control socket, or the process answering on it, is not this user's: whoever it is
    could read every request (API keys among them) and answer with anything."""


def trusted_uid(uid: int) -> bool:
    """This user, or root (who can act as anyone here anyway)."""
    return uid in (os.getuid(), 0)


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process on the other end of a connected Unix socket (the kernel's word)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


def check_control_socket(path: Path) -> None:
    """Refuse (UntrustedSocket) a control socket file that is not a socket owned by this user (or
    root). A missing one is fine: connecting to it then fails as "no daemon"."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise UntrustedSocket(f"{path} is not a socket; nothing was sent to it. Remove it and start the daemon again")
    if not trusted_uid(st.st_uid):
        raise UntrustedSocket(
            f"{path} belongs to uid {st.st_uid}, not to you (uid {os.getuid()}); nothing was sent to it. "
            "Someone else's process may be posing as your daemon: remove it (as its owner)"
        )


def check_control_peer(sock: socket.socket, path: Path) -> None:
    """Refuse (UntrustedSocket) a connection whose listening process is not this user's (or
    root's): checked after connect, before the first byte is sent."""
    uid = peer_uid(sock)
    if not trusted_uid(uid):
        raise UntrustedSocket(
            f"the process answering on {path} runs as uid {uid}, not as you (uid {os.getuid()}); "
            "nothing was sent to it. Someone else's process may be posing as your daemon"
        )


@dataclass(frozen=True)
class Paths:
    data_dir: Path
    runtime_dir: Path

    @property
    def socket(self) -> Path:
        return self.runtime_dir / "control.sock"

    @property
    def lock_file(self) -> Path:
        return self.runtime_dir / "daemon.lock"

    @property
    def daemon_pid_file(self) -> Path:
        return self.runtime_dir / "daemon.pid"

    @property
    def state_file(self) -> Path:
        return self.data_dir / "engines.json"

    @property
    def logs_dir(self) -> Path:
        return self.data_dir / "logs"

    @property
    def daemon_log(self) -> Path:
        return self.logs_dir / "daemon.log"

    @property
    def database(self) -> Path:
        return self.data_dir / "llmconsole.db"

    def engine_log(self, name: str) -> Path:
        return self.logs_dir / f"engine-{name}.log"

    def ensure(self) -> Paths:
        """Create the directories private to the user (0700): logs can hold prompts. Refuses
        (UnsafeDirectory) any of them that is not safely the user's own (see check_private_dir)."""
        for d in (self.data_dir, self.runtime_dir, self.logs_dir):
            check_private_dir(d)  # before mkdir: a link there must not be followed even to create
            try:
                d.mkdir(parents=True, mode=0o700)
            except FileExistsError:
                pass
            check_private_dir(d)  # whoever created it, it must be ours now
        if len(os.fsencode(self.socket)) > _MAX_SOCKET_PATH_BYTES:
            raise ValueError(
                f"control socket path is too long for a Unix socket ({self.socket}); "
                "set LLMCONSOLE_HOME to a shorter directory"
            )
        return self

    def verify(self) -> Paths:
        """Refuse (UnsafeDirectory) the directories that exist but are not safely the user's own,
        creating nothing: a client must not talk to a socket in someone else's directory."""
        for d in (self.data_dir, self.runtime_dir, self.logs_dir):
            check_private_dir(d)
        return self

    def connect_control(self, timeout_s: float | None = None) -> Socket:
        """A connection to the control socket, made only once the directories, the socket file
        and the process listening on it are known to be this user's (UnsafeDirectory or
        UntrustedSocket otherwise, with nothing sent). OSError when no daemon listens."""
        self.verify()
        check_control_socket(self.socket)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout_s)
            sock.connect(str(self.socket))
            check_control_peer(sock, self.socket)
        except BaseException:
            sock.close()
            raise
        return sock


def config_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where the operator's own files are (config.toml, console.toml, hosts.toml): beside the rest
    under LLMCONSOLE_HOME when that is set, else $XDG_CONFIG_HOME/llmconsole. Never created here."""
    env = os.environ if env is None else env
    if env.get("LLMCONSOLE_HOME"):
        return Path(env["LLMCONSOLE_HOME"]).expanduser()
    return Path(env.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "llmconsole"


def resolve(env: dict[str, str] | None = None) -> Paths:
    env = dict(os.environ if env is None else env)
    home = env.get("LLMCONSOLE_HOME")
    if home:
        root = Path(home).expanduser().resolve()
        return Paths(data_dir=root, runtime_dir=root / "run")
    data_home = Path(env.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    runtime = env.get("XDG_RUNTIME_DIR")
    runtime_dir = Path(runtime) / "llmconsole" if runtime else Path(f"/tmp/llmconsole-{os.getuid()}")
    return Paths(data_dir=data_home / "llmconsole", runtime_dir=runtime_dir)
