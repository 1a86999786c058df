"""What every `llmconsole` subcommand shares: exit codes, the error type, the daemon client of
the host the command acts on, confirmation before anything destructive, and how a missing value
prints."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from llmconsole.console.client import DaemonClient, ensure_daemon
from llmconsole.console.hosts import LOCAL_HOST, Host, client_for
from llmconsole.paths import resolve

EXIT_FAILED, EXIT_USAGE, EXIT_NO_DAEMON, EXIT_UNREACHABLE = 1, 2, 3, 4

# The host this invocation's command acts on: `--host DEST`, or ENGINE@HOST where an engine is
# named (cli.main sets it before the command runs). The local host unless one was given.
_host: Host = LOCAL_HOST


def use_host(host: Host) -> None:
    global _host
    _host = host


def current_host() -> Host:
    return _host


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_FAILED):
        super().__init__(message)
        self.code = code


def na(value: Any, fmt: str = "{}") -> str:
    return "N/A" if value is None else fmt.format(value)


def daemon_client() -> DaemonClient:
    """A client of the running daemon of the host the command acts on; none running is an error
    (exit 3) that says how to start one. A host ssh cannot reach raises HostUnreachable."""
    host = _host
    if host.is_local:
        client = DaemonClient(resolve())
        if client.ping() is None:
            raise CliError("no llmconsole daemon is running (start one with `llmconsole daemon start`)", EXIT_NO_DAEMON)
        return client
    client = client_for(host)
    try:
        if client.ping() is None:
            raise CliError(
                f"no llmconsole daemon is running on {host.name} "
                f"(start one with `llmconsole --host {host.name} daemon start`)",
                EXIT_NO_DAEMON,
            )
    except BaseException:
        client.close()
        raise
    return client


def started_daemon_client(daemon_args: Sequence[str] = ()) -> tuple[DaemonClient, bool]:
    """A client of the host's daemon, started if none runs (with `daemon_args`, its --set flags):
    (client, whether this started it; over SSH dial-stdio starts it, unseen from here, so always
    False)."""
    host = _host
    if host.is_local:
        return ensure_daemon(resolve(), daemon_args=daemon_args)
    client = client_for(host, start_daemon=True)
    try:
        client.daemon_info()
    except BaseException:
        client.close()
        raise
    return client, False


def confirm(question: str, yes: bool) -> None:
    if yes:
        return
    if not sys.stdin.isatty():
        raise CliError(f"{question} Refusing without a terminal to ask on; pass --yes to confirm.", EXIT_USAGE)
    answer = input(f"{question} [y/N] ").strip().lower()
    if answer not in ("y", "yes"):
        raise CliError("cancelled; nothing was changed", EXIT_FAILED)
