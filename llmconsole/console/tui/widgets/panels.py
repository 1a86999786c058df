"""The dashboard's smaller parts: the status line, the daemon-lost banner, the alerts strip, the
batch-window controller panel and the engine's log tail."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import Static

from llmconsole.console.tui.view import LogChunk, Snapshot, fmt_bytes, na


class StatusLine(Static):
    DEFAULT_CSS = """
    StatusLine { height: 1; background: $panel; padding: 0 1; text-wrap: nowrap; text-overflow: ellipsis; }
    """

    def show(self, snapshot: Snapshot | None) -> None:
        if snapshot is None:
            self.update(Text.assemble(("llmconsole", "bold"), "  ·  waiting for the daemon"))
            return
        h = snapshot.host
        gpus = f"{len(h.gpus)} GPU(s)" if h.gpus else "no GPU"
        self.update(Text(
            f"llmconsole · daemon pid {na(snapshot.daemon_pid)} v{na(snapshot.daemon_version)} · "
            f"host CPU {na(h.cpu_pct, '{:.0f}%')}, mem {fmt_bytes(h.memory_used_bytes)} / "
            f"{fmt_bytes(h.memory_total_bytes)} · {gpus} · {len(snapshot.engines)} engine(s)",
            no_wrap=True, overflow="ellipsis",
        ))


class DaemonBanner(Static):
    """Shown while the daemon does not answer; the console keeps the last state and retries."""

    DEFAULT_CSS = """
    DaemonBanner { display: none; height: auto; background: $error; color: $text; padding: 0 1; }
    DaemonBanner.-lost { display: block; }
    """

    def show(self, reason: str | None, retry_s: float) -> None:
        self.set_class(reason is not None, "-lost")
        if reason is not None:
            self.update(Text.assemble(
                ("daemon lost", "bold"), f": {reason}\n",
                f"retrying every {retry_s:.0f} s; the figures below are the last ones it sent",
            ))


class AlertStrip(Static):
    DEFAULT_CSS = """
    AlertStrip { height: 1; width: 1fr; padding: 0 1; }
    """

    def show(self, alerts: tuple[str, ...] = ()) -> None:
        text = "; ".join(alerts) if alerts else "no alerts"
        self.update(Text.assemble(("alerts ", "bold"), (text, "red" if alerts else "green")))


class ControllerPanel(Static):
    """The batch-window controller's trace. The gateway that runs it is not part of the daemon
    yet, so the panel says so rather than showing an empty chart."""

    DEFAULT_CSS = """
    ControllerPanel { height: 1; width: 1fr; padding: 0 1; }
    """

    def on_mount(self) -> None:
        self.update(Text.assemble(("batch window ", "bold"), ("not running", "dim"),
                                  (" (no gateway)", "dim")))


class LogTail(Static):
    """The last lines of the selected engine's log, as many as fit."""

    DEFAULT_CSS = """
    LogTail { height: 1fr; min-height: 3; padding: 0 1; border-top: solid $panel; text-wrap: nowrap; text-overflow: ellipsis; }
    """

    def __init__(self, **kw) -> None:
        super().__init__("", **kw)
        self._name: str | None = None
        self._lines: list[str] = []
        self._shown: tuple = ()

    def show(self, name: str | None, chunk: LogChunk | None) -> None:
        if name != self._name:
            self._name, self._lines = name, []
        if chunk is not None and chunk.name == name:
            self._lines = chunk.text.splitlines()[-200:]
        self.border_title = f"log: {name}" if name else "log"
        self._paint()

    def on_resize(self) -> None:
        self._paint()

    def _paint(self) -> None:
        rows = max(1, self.content_size.height)
        lines = tuple(self._lines[-rows:])
        key = (lines, rows, self.content_size.width)
        if key == self._shown:
            return
        self._shown = key
        if not lines:
            self.update(Text("(no log yet)" if self._name else "", style="dim"))
            return
        self.update(Text("\n".join(lines), no_wrap=True, overflow="ellipsis"))
