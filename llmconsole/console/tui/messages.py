"""What workers tell the UI thread. Each is a past event carrying immutable values."""

from __future__ import annotations

from textual.message import Message

from llmconsole.console.tui.source import Command
from llmconsole.console.tui.view import LogChunk, Snapshot


class StatusPolled(Message):
    def __init__(self, snapshot: Snapshot, logs: LogChunk | None) -> None:
        super().__init__()
        self.snapshot = snapshot
        self.logs = logs


class DaemonLost(Message):
    def __init__(self, reason: str) -> None:
        super().__init__()
        self.reason = reason


class PollFailed(Message):
    """The daemon answered, but not with something the console could use."""

    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


class CommandSent(Message):
    def __init__(self, command: Command, reply: dict) -> None:
        super().__init__()
        self.command = command
        self.reply = reply


class CommandFailed(Message):
    def __init__(self, command: Command, error: str) -> None:
        super().__init__()
        self.command = command
        self.error = error
