"""Where llmconsole keeps its state on a host.

`LLMCONSOLE_HOME` moves everything (socket, logs, database, state) under one directory, which is
how tests and two side-by-side consoles stay out of each other's way. Without it the XDG
locations apply: data under $XDG_DATA_HOME/llmconsole, the control socket under
$XDG_RUNTIME_DIR/llmconsole (or a private directory in /tmp when no runtime dir exists).

Each of these directories must be the user's own: a directory in /tmp can be created first by
anyone, who could then answer on the control socket or redirect the pid file. A directory owned
by someone else, writable by others, or that is a symbolic link is refused with its path and the
fix; it is never used, and never followed.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

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
