"""The control API of another host, over the operator's own OpenSSH client.

`ssh DEST llmconsole daemon dial-stdio` joins this process to the remote daemon's control socket
through ssh's stdin and stdout; HTTP/1.1 runs over that pair of pipes exactly as it runs over the
local Unix socket. httpcore drives the HTTP (one request at a time per connection, keep-alive, a
few connections at most); this module only supplies the byte stream: an ssh subprocess.

Nothing here knows a key or a password. ssh runs with BatchMode=yes, so it never prompts: a
host that wants a password, or whose host key is unknown, fails at once with ssh's own reason,
which is what the operator sees. `LLMCONSOLE_SSH_COMMAND` (like GIT_SSH_COMMAND) replaces the
`ssh` that is run, e.g. `ssh -F ~/.ssh/fleet_config`.
"""

from __future__ import annotations

import collections
import os
import select
import shlex
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import httpcore
import httpx

from llmconsole.console.client import DaemonNotRunning, HostUnreachable, send_through
from llmconsole.settings import load as load_settings

SSH_COMMAND_ENV = "LLMCONSOLE_SSH_COMMAND"
EXIT_SSH_FAILED = 255  # ssh's own exit status when the connection itself fails
EXIT_NO_DAEMON = 3  # the CLI's "no daemon is running" (dial-stdio --no-start)

# Never prompt; give up on a host that does not answer; notice a connection that died under a
# long-lived client. Command-line options win over the operator's ssh config for these only.
SSH_OPTIONS = (
    "-o",
    "BatchMode=yes",
    "-o",
    "ConnectTimeout=10",
    "-o",
    "ServerAliveInterval=15",
    "-o",
    "ServerAliveCountMax=3",
)


def ssh_command(env: Mapping[str, str] | None = None) -> list[str]:
    """The ssh_command setting (LLMCONSOLE_SSH_COMMAND or config.toml: llmconsole/settings) split
    as a shell would, else plain `ssh`; `env`, when given, is read instead (tests)."""
    if env is None:
        text = load_settings().settings.ssh_command or ""
    else:
        text = env.get(SSH_COMMAND_ENV, "").strip()
    return shlex.split(text) if text else ["ssh"]


def ssh_argv(
    destination: str, remote_command: str, *, tty: bool = False, env: Mapping[str, str] | None = None
) -> list[str]:
    """The ssh command line that runs `remote_command` (one shell string) on `destination`."""
    return [*ssh_command(env), *SSH_OPTIONS, "-t" if tty else "-T", "--", destination, remote_command]


def resolved_hostname(destination: str, env: Mapping[str, str] | None = None) -> str | None:
    """The host name or address ssh would connect to for `destination`, after the operator's ssh
    config (`ssh -G`: config only, no connection); None when ssh cannot say."""
    try:
        r = subprocess.run(
            [*ssh_command(env), "-G", "--", destination],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0:
        return None
    for line in r.stdout.splitlines():
        key, _, value = line.partition(" ")
        if key == "hostname" and value.strip():
            return value.strip()
    return None


def ssh_reason(stderr: str) -> str:
    """What ssh said, without its chatter: the last few lines that carry words."""
    lines = [ln.strip() for ln in stderr.replace("\r", "\n").splitlines() if ln.strip()]
    return " / ".join(lines[-3:])


class Backoff:
    """When to try a host again after it failed: 1 s, 2 s, 4 s ... up to `max_s`, and at once
    again after any success. Long-lived clients (a console's poll) ask before every call, so a
    host that is down costs one ssh attempt per backoff step, not one per poll."""

    def __init__(
        self,
        first_s: float = 1.0,
        factor: float = 2.0,
        max_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.first_s, self.factor, self.max_s, self.clock = first_s, factor, max_s, clock
        self.failures = 0
        self.reason: str | None = None
        self._next_try = 0.0
        self._lock = threading.Lock()

    def failed(self, reason: str) -> float:
        """Record a failure; returns the wait before the next attempt."""
        with self._lock:
            self.failures += 1
            self.reason = reason
            delay = min(self.max_s, self.first_s * self.factor ** (self.failures - 1))
            self._next_try = self.clock() + delay
            return delay

    def succeeded(self) -> None:
        with self._lock:
            self.failures, self.reason, self._next_try = 0, None, 0.0

    def wait_s(self) -> float:
        """Seconds before the next attempt may be made (0: now)."""
        with self._lock:
            return max(0.0, self._next_try - self.clock()) if self.failures else 0.0


class _StderrTail:
    """The end of what the ssh process writes to stderr, read by a thread so it never blocks."""

    def __init__(self, stream: Any):
        self._lines: collections.deque[str] = collections.deque(maxlen=40)
        self._thread = threading.Thread(target=self._drain, args=(stream,), daemon=True, name="ssh-stderr")
        self._thread.start()

    def _drain(self, stream: Any) -> None:
        for raw in iter(stream.readline, b""):
            self._lines.append(raw.decode("utf-8", "replace"))
        stream.close()

    def text(self, wait_s: float = 1.0) -> str:
        self._thread.join(wait_s)
        return "".join(self._lines)


class SshStream(httpcore.NetworkStream):
    """One ssh subprocess running dial-stdio: its stdout is what the daemon says, its stdin what
    it is told. An end of stream before any answer is explained by ssh's exit status."""

    def __init__(self, proc: subprocess.Popen[bytes], host: str):
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        self.proc, self.host = proc, host
        self._in, self._out = proc.stdin.fileno(), proc.stdout.fileno()
        self._stderr = _StderrTail(proc.stderr)
        self._answered = False

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        ready, _, _ = select.select([self._out], [], [], timeout)
        if not ready:
            raise httpcore.ReadTimeout(f"{self.host} sent nothing for {timeout} s")
        data = os.read(self._out, max_bytes)
        if data:
            self._answered = True
            return data
        self._ended()
        return b""

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        view = memoryview(buffer)
        try:
            while view:
                n = os.write(self._in, view)
                view = view[n:]
        except OSError as e:  # the ssh process is gone: say why, if it said
            self._ended()
            raise httpcore.WriteError(f"the connection to {self.host} closed ({e})") from None

    def _ended(self) -> None:
        """The stream ended: raise what it means. ssh's own failure (the host or the network went
        away, now or mid-conversation) is the host being unreachable; a remote side that ended
        before saying anything says why in its exit status; a clean end is for HTTP to judge."""
        try:
            code = self.proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            return
        if code == EXIT_SSH_FAILED:
            reason = ssh_reason(self._stderr.text())
            raise HostUnreachable(self.host, reason or f"ssh exited with status {code}")
        if self._answered:
            return
        reason = ssh_reason(self._stderr.text())
        if code == EXIT_NO_DAEMON:
            raise DaemonNotRunning(
                f"no llmconsole daemon is running on {self.host}" + (f" ({reason})" if reason else "")
            )
        if code != 0:
            raise HostUnreachable(
                self.host, f"llmconsole could not run there (exit status {code}): {reason or 'no message'}"
            )

    def close(self) -> None:
        """Close our end: the remote dial-stdio sees the end of its input and exits, then ssh."""
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                if f is not None:
                    f.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=2.0)
        except subprocess.TimeoutExpired:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        raise httpcore.UnsupportedProtocol("the SSH channel is already private; no TLS inside it")

    def get_extra_info(self, info: str) -> Any:
        if info == "is_readable":  # an idle connection that is readable has been closed
            try:
                return bool(select.select([self._out], [], [], 0)[0])
            except (OSError, ValueError):
                return True
        return None


class SshBackend(httpcore.NetworkBackend):
    """httpcore's 'network': every connection is a new ssh process running `argv`."""

    def __init__(self, argv: list[str], host: str):
        self.argv, self.host = argv, host

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        try:
            # A session of its own: ssh must never read the operator's terminal (no prompts, no
            # Ctrl-C meant for the console) and must not share its process group.
            proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                bufsize=0,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as e:
            raise HostUnreachable(
                self.host,
                f"cannot run {self.argv[0]!r}: {e.strerror} (install OpenSSH's client, or set LLMCONSOLE_SSH_COMMAND)",
            ) from None
        return SshStream(proc, self.host)

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore.NetworkStream:
        raise httpcore.UnsupportedProtocol("an SSH backend connects to one host only")

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class SshTransport(httpx.BaseTransport):
    """An httpx transport to one remote host's daemon through ssh, with backoff after failures."""

    def __init__(self, argv: list[str], host: str, *, max_connections: int = 4, backoff: Backoff | None = None):
        self.host = host
        self.backoff = backoff or Backoff()
        self._pool = httpcore.ConnectionPool(
            network_backend=SshBackend(argv, host),
            max_connections=max_connections,
            max_keepalive_connections=2,
            retries=0,
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        wait = self.backoff.wait_s()
        if wait > 0:
            raise HostUnreachable(self.host, self.backoff.reason or "it failed a moment ago", retry_in_s=wait)
        try:
            resp = send_through(self._pool, request)
        except HostUnreachable as e:
            self.backoff.failed(e.reason)
            raise
        self.backoff.succeeded()
        return resp

    def close(self) -> None:
        self._pool.close()


def run_remote(
    destination: str, remote_command: str, *, host: str, tty: bool = False, env: Mapping[str, str] | None = None
) -> int:
    """Run a command on the host with this terminal's stdin, stdout and stderr; its exit status.
    A connection that fails is said as such (ssh exits 255 and has said why on stderr)."""
    argv = ssh_argv(destination, remote_command, tty=tty, env=env)
    try:
        return subprocess.run(argv, check=False).returncode
    except OSError as e:
        raise HostUnreachable(host, f"cannot run {argv[0]!r}: {e.strerror}") from None


def capture_remote(
    destination: str,
    remote_command: str,
    *,
    host: str,
    stdout: Any,
    env: Mapping[str, str] | None = None,
    timeout_s: float | None = None,
) -> None:
    """Run a command on the host with its stdout into `stdout` (a file); HostUnreachable, or
    RuntimeError with the command's own stderr, when it fails."""
    argv = ssh_argv(destination, remote_command, env=env)
    try:
        r = subprocess.run(
            argv, stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.PIPE, timeout=timeout_s, check=False
        )
    except OSError as e:
        raise HostUnreachable(host, f"cannot run {argv[0]!r}: {e.strerror}") from None
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{host}: no answer within {timeout_s:.0f} s") from None
    reason = ssh_reason(r.stderr.decode("utf-8", "replace"))
    if r.returncode == EXIT_SSH_FAILED:
        raise HostUnreachable(host, reason or "ssh exited with status 255")
    if r.returncode != 0:
        raise RuntimeError(f"{host}: exit status {r.returncode}: {reason or 'no message'}")
