"""Where llmconsole keeps its state on a host.

`LLMCONSOLE_HOME` moves everything (socket, logs, database, state) under one directory, which is
how tests and two side-by-side consoles stay out of each other's way. Without it the XDG
locations apply: data under $XDG_DATA_HOME/llmconsole, the control socket under
$XDG_RUNTIME_DIR/llmconsole (or a private directory in /tmp when no runtime dir exists).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# sun_path is 108 bytes on Linux, including the terminating NUL.
_MAX_SOCKET_PATH_BYTES = 107


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

    def ensure(self) -> "Paths":
        """Create the directories private to the user (0700): logs can hold prompts."""
        for d in (self.data_dir, self.runtime_dir, self.logs_dir):
            d.mkdir(parents=True, exist_ok=True, mode=0o700)
        if len(os.fsencode(self.socket)) > _MAX_SOCKET_PATH_BYTES:
            raise ValueError(
                f"control socket path is too long for a Unix socket ({self.socket}); "
                "set LLMCONSOLE_HOME to a shorter directory"
            )
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
