"""What every `llmconsole` subcommand shares: exit codes, the error type, the daemon client,
confirmation before anything destructive, and how a missing value prints."""

from __future__ import annotations

import sys
from typing import Any

from llmconsole.console.client import DaemonClient
from llmconsole.paths import resolve

EXIT_FAILED, EXIT_USAGE, EXIT_NO_DAEMON = 1, 2, 3


class CliError(Exception):
    def __init__(self, message: str, code: int = EXIT_FAILED):
        super().__init__(message)
        self.code = code


def na(value: Any, fmt: str = "{}") -> str:
    return "N/A" if value is None else fmt.format(value)


def daemon_client() -> DaemonClient:
    client = DaemonClient(resolve())
    if client.ping() is None:
        raise CliError("no llmconsole daemon is running (start one with `llmconsole daemon start`)", EXIT_NO_DAEMON)
    return client


def confirm(question: str, yes: bool) -> None:
    if yes:
        return
    if not sys.stdin.isatty():
        raise CliError(f"{question} Refusing without a terminal to ask on; pass --yes to confirm.", EXIT_USAGE)
    answer = input(f"{question} [y/N] ").strip().lower()
    if answer not in ("y", "yes"):
        raise CliError("cancelled; nothing was changed", EXIT_FAILED)
