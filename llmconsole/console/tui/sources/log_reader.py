"""The selected engine's log, read by a worker of its own.

The poll refreshes every host; reading a log is one host's business. Were the read inside the
poll, a host that takes it and never answers would hold up every host's refresh for the read's
whole timeout. So the log is asked for after each poll is shown, in its own thread worker, at
most one read per engine at a time, and what it brings (`LogRead`) is shown when it comes. A
read still out when the next poll comes is not doubled: it is asked again once it ends, so the
log shown is never older than the newest poll before it. An engine selected meanwhile (on
another host, say) has its log read at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual import work

from llmconsole.console.tui.messages import LogRead
from llmconsole.console.tui.views.status import LogChunk, Snapshot

if TYPE_CHECKING:
    from textual.app import App

    from llmconsole.console.tui.sources.daemon import StateSource

    _AppBase = App[str]  # what ConsoleApp, which this is mixed into, derives from
else:
    _AppBase = object


class LogReading(_AppBase):
    """Mixed into ConsoleApp; `self` is the app."""

    if TYPE_CHECKING:  # ConsoleApp's state and methods that the log reading uses
        source: StateSource
        snapshot: Snapshot | None
        logs: dict[str, LogChunk]
        log_reads_done: int
        _logs_out: set[str]
        _logs_again: set[str]
        _polling: bool

        def report_failure(self, what: str, error: BaseException) -> None: ...

    @property
    def log_reading(self) -> bool:
        """A log read is out."""
        return bool(self._logs_out)

    @property
    def settled(self) -> bool:
        """No poll and no log read is out: what the screen shows is all that was asked for."""
        return not self._polling and not self._logs_out

    def _show_log(self, chunk: LogChunk) -> None:
        """Only the log's pane is repainted: the rest of the screen showed the poll already."""
        take = getattr(self.screen, "take_logs", None)  # a log screen follows its own offset
        if take is not None:
            take(chunk)
            return
        repaint = getattr(self.screen, "show_log_view", None)  # the dashboard's tail of the log
        if repaint is not None:
            repaint()

    def _want_log(self) -> None:
        """Read the selected engine's log, unless a read of it is still out (a slow host's): then
        the newest poll shows without it, and a later poll asks again. Selecting an engine of
        another host reads its log at once, whatever the first one's host does."""
        if self.snapshot is None:
            return
        try:
            request = getattr(self.screen, "log_request", None)
            wanted = request() if request else None
        except Exception:  # a screen still composing has no selection yet
            wanted = None
        if wanted is None or self.snapshot.engine(wanted[0]) is None:
            return
        if wanted[0] in self._logs_out:
            self._logs_again.add(wanted[0])  # once the read out now ends
            return
        self._logs_out.add(wanted[0])
        self._read_log(wanted)

    @work(thread=True, group="logs", exit_on_error=False)
    def _read_log(self, request: tuple[str, int | None, int]) -> None:
        name, offset, max_bytes = request
        try:
            d = self.source.logs(name, offset=offset, max_bytes=max_bytes)
            chunk = LogChunk(name, str(d.get("text", "")), int(d.get("offset", 0)), int(d.get("size", 0)), offset)
        except Exception:
            chunk = None  # the log is a nicety; the next poll tries again
        self.post_message(LogRead(name, chunk))

    def on_log_read(self, message: LogRead) -> None:
        self._logs_out.discard(message.name)
        self.log_reads_done += 1
        chunk = message.chunk
        try:
            if chunk is not None and self.snapshot is not None and self.snapshot.engine(chunk.name) is not None:
                if chunk.from_offset is None:
                    self.logs[chunk.name] = chunk
                self._show_log(chunk)
        except Exception as e:
            self.report_failure("showing the log", e)
        if message.name in self._logs_again:  # a poll came while it was out: read what is newer
            self._logs_again.discard(message.name)
            self._want_log()
