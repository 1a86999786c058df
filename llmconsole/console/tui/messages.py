"""What workers tell the UI thread. Each is a past event carrying immutable values."""

from __future__ import annotations

from typing import Any

from textual.message import Message

from llmconsole.console.tui.sources.daemon import Command
from llmconsole.console.tui.views.status import LogChunk, Snapshot


class StatusPolled(Message):
    def __init__(self, snapshot: Snapshot) -> None:
        super().__init__()
        self.snapshot = snapshot


class LogRead(Message):
    """A piece of the selected engine's log (None: the read failed; the next poll asks again)."""

    def __init__(self, name: str, chunk: LogChunk | None) -> None:
        super().__init__()
        self.name = name
        self.chunk = chunk


class HistoryFetched(Message):
    """The daemon's stored history of one engine (GET /v1/engines/{name}/samples), or None."""

    def __init__(self, name: str, range_s: float, answer: dict[str, Any] | None) -> None:
        super().__init__()
        self.name = name
        self.range_s = range_s
        self.answer = answer


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
    def __init__(self, command: Command, reply: dict[str, Any]) -> None:
        super().__init__()
        self.command = command
        self.reply = reply


class CommandFailed(Message):
    def __init__(self, command: Command, error: str) -> None:
        super().__init__()
        self.command = command
        self.error = error


# --- a sweep or tune the daemon runs (screens/run_base.py) -----------------------------------


class RunProgressed(Message):
    def __init__(self, event: Any) -> None:
        super().__init__()
        self.event = event


class RunFinished(Message):
    def __init__(self, outcome: Any, error: str | None) -> None:
        super().__init__()
        self.outcome = outcome
        self.error = error


class RunStarted(Message):
    """The daemon took the run (or the screen found one under way): from now on it is polled."""

    def __init__(self, run: dict[str, Any], found: bool = False) -> None:
        super().__init__()
        self.run = run
        self.found = found


class RunPolled(Message):
    def __init__(self, reply: dict[str, Any] | None, error: str | None = None) -> None:
        super().__init__()
        self.reply = reply
        self.error = error
