"""An engine's OS process: launched in its own process group, adopted back after a daemon restart.

vLLM's API server forks an engine-core process, which forks workers. Each engine is started as
the leader of a new session (so it outlives the daemon and the operator's SSH login, and so the
whole tree can be signalled as one group); stop and crash clean-up act on the group, and wait
until no member is left, so nothing is ever orphaned holding memory or a port.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import psutil

# Seconds of slack when comparing a process's create time with the recorded one (it is
# derived from boot time and clock ticks, so it wobbles by a tick).
_CREATE_TIME_SLACK_S = 1.0

# llmconsole's own variables an engine needs: where the compiled kernels are (read by the kernel
# plugin inside vLLM). LLMCONSOLE_KERNEL itself comes from the spec, never from the daemon.
_ENGINE_NEEDS = frozenset({"LLMCONSOLE_KERNEL_CACHE"})


def engine_environ(daemon_env: Mapping[str, str], spec_env: Mapping[str, str]) -> dict[str, str]:
    """The environment an engine is launched with: the daemon's, less llmconsole's own variables
    (the gateway key, the daemon's settings: a model's code or a plugin running in the engine has
    no business with them), plus the spec's."""
    env = {k: v for k, v in daemon_env.items() if not k.startswith("LLMCONSOLE_") or k in _ENGINE_NEEDS}
    env.update(spec_env)
    return env


@dataclass(frozen=True)
class ProcessRecord:
    """What the daemon persists to find an engine process again after it restarts."""

    pid: int
    create_time: float
    port: int
    argv: tuple[str, ...]
    # The config the process was launched on: after a restart cut short by the daemon's death,
    # the next daemon tells the old config's process from the target's by it. None in records
    # written before it was kept.
    config_id: str | None = None


def _same_command(cmdline: list[str], argv: list[str]) -> bool:
    """Whether a running process's command line is `argv` as launched. A script run through its
    `#!` line (the `vllm` executable is one) shows its interpreter first, and perhaps one
    interpreter option, then the script path and arguments exactly."""
    if cmdline == argv:
        return True
    extra = len(cmdline) - len(argv)
    return 1 <= extra <= 2 and cmdline[extra:] == argv


class EngineProcess:
    def __init__(self, record: ProcessRecord, popen: subprocess.Popen[bytes] | None) -> None:
        self.record = record
        self._popen = popen
        self._exit_code: int | None = None
        self._ps: psutil.Process | None = None

    @property
    def pid(self) -> int:
        return self.record.pid

    @property
    def pgid(self) -> int:
        # The engine was started as a session leader, so its group id is its pid; that stays
        # true (and killpg keeps working on the survivors) even after the leader has died.
        return self.record.pid

    @property
    def adopted(self) -> bool:
        return self._popen is None

    @classmethod
    def launch(
        cls,
        argv: list[str],
        env_extra: dict[str, str],
        log_path: Path,
        port: int,
        config_id: str | None = None,
        base_env: Mapping[str, str] | None = None,
    ) -> EngineProcess:
        """Start `argv` in a session of its own. Its environment is `base_env` (the daemon's own,
        handed down: engine/ never reads the environment itself) through engine_environ, plus
        `env_extra` (the spec's); None: only the spec's."""
        env = engine_environ(base_env or {}, env_extra)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        try:
            # The log is the engine's stdout and stderr directly, never a pipe through the
            # daemon: a pipe would break (and kill the engine with SIGPIPE) if the daemon died.
            popen = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=fd,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
        finally:
            os.close(fd)
        # From here on a process runs: nothing may fail without returning its record (EMFILE
        # reading /proc, say), or it would run on with nobody knowing its pid.
        try:
            create_time = psutil.Process(popen.pid).create_time()
        except (psutil.Error, OSError):
            create_time = time.time()
        return cls(ProcessRecord(popen.pid, create_time, port, tuple(argv), config_id), popen)

    @classmethod
    def adopt(cls, record: ProcessRecord) -> EngineProcess | None:
        """The running engine behind `record`, or None if that pid is now something else.

        A pid can be reused by an unrelated process after a reboot or a long time, so the
        process must match on create time, command line and port before it is adopted.
        """
        try:
            p = psutil.Process(record.pid)
            if p.status() == psutil.STATUS_ZOMBIE:
                return None
            if abs(p.create_time() - record.create_time) > _CREATE_TIME_SLACK_S:
                return None
            cmdline = p.cmdline()
        except psutil.Error:
            return None
        if not _same_command(cmdline, list(record.argv)):
            return None
        if "--port" not in cmdline or cmdline[cmdline.index("--port") + 1] != str(record.port):
            return None
        proc = cls(record, None)
        proc._ps = p
        return proc

    def poll(self) -> int | None:
        """The exit code once the engine's main process has exited, else None.

        An adopted process is not our child, so its exit code is unknowable: -1 stands for it.
        """
        if self._exit_code is not None:
            return self._exit_code
        if self._popen is not None:
            self._exit_code = self._popen.poll()
            return self._exit_code
        try:
            assert self._ps is not None
            if self._ps.is_running() and self._ps.status() != psutil.STATUS_ZOMBIE:
                return None
        except psutil.Error:
            pass
        self._exit_code = -1
        return self._exit_code

    def group_members(self) -> list[int]:
        """Pids still in the engine's process group (the leader included, while alive)."""
        members = []
        for p in psutil.process_iter(["pid"]):
            try:
                if os.getpgid(p.pid) == self.pgid and p.status() != psutil.STATUS_ZOMBIE:
                    members.append(p.pid)
            except (ProcessLookupError, psutil.Error, OSError):
                continue
        return members

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    async def terminate(self, drain_timeout_s: float, kill_timeout_s: float = 10.0) -> int | None:
        """SIGTERM the group, wait up to `drain_timeout_s`, then SIGKILL what is left.

        Returns the main process's exit code. Waits until every member of the group is gone,
        so a port or memory is never still held when a restart comes next.
        """
        self.signal_group(signal.SIGTERM)
        if not await self._wait_group_gone(drain_timeout_s):
            self.signal_group(signal.SIGKILL)
            await self._wait_group_gone(kill_timeout_s)
        return self.poll()

    async def kill_group(self, timeout_s: float = 10.0) -> None:
        """Clean up after a crash: whatever of the group survived its leader is killed."""
        self.signal_group(signal.SIGKILL)
        await self._wait_group_gone(timeout_s)
        self.poll()

    async def _wait_group_gone(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            self.poll()  # reap our own child so it does not linger as a zombie member
            if not self.group_members():
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.1)
