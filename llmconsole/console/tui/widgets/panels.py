"""The dashboard's smaller parts: the status line, the daemon-lost banner, the alerts strip, the
batch-window controller panel and the engine's log tail."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import Static

from llmconsole.console.tui.view import EngineView, LogChunk, Snapshot, fmt_bytes, na


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


_SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: tuple[int, ...], lo: int | None, hi: int | None, width: int = 24) -> str:
    """The newest `width` windows, scaled over the controller's [min, max]."""
    values = values[-width:]
    if not values:
        return ""
    lo = min(values) if lo is None else lo
    hi = max(values) if hi is None else hi
    span = max(1, hi - lo)
    return "".join(_SPARK[min(7, max(0, round((v - lo) / span * 7)))] for v in values)


class ControllerPanel(Static):
    """The selected engine's batch window at the gateway: the window and its recent history,
    the measured signal against the target, and whether the controller is frozen."""

    DEFAULT_CSS = """
    ControllerPanel { height: 1; width: 1fr; padding: 0 1; text-wrap: nowrap; text-overflow: ellipsis; }
    """

    def on_mount(self) -> None:
        self.show(None)

    def show(self, engine: EngineView | None) -> None:
        c = engine.controller if engine is not None else None
        if c is None:
            self.update(Text.assemble(("batch window ", "bold"), ("not running", "dim"),
                                      (" (no gateway)", "dim")))
            return
        measured, target = c.last_measured_ms, c.target_ms
        over = measured is not None and target is not None and measured > 1.1 * target
        self.update(Text.assemble(
            ("batch window ", "bold"), (na(c.window), "bold"), " ",
            (sparkline(c.windows, c.min_window, c.max_window), "cyan"),
            f" · p99 {c.signal or 'N/A'} ", (na(measured, "{:.0f}"), "red" if over else "green"),
            f"/{na(target, '{:.0f}')} ms · in flight {na(c.in_flight)}, queued {na(c.queued)} · ",
            ("frozen", "bold yellow") if c.frozen else ("controlled", "green"),
            no_wrap=True, overflow="ellipsis",
        ))


class LogTail(Static):
    """The last lines of the selected engine's log, as many as fit."""

    DEFAULT_CSS = """
    LogTail { height: 1fr; min-height: 3; padding: 0 1; border-top: solid $panel; text-wrap: nowrap; text-overflow: ellipsis; }
    """

    def __init__(self, **kw: Any) -> None:
        super().__init__("", **kw)
        self._name: str | None = None
        self._lines: list[str] = []
        self._shown: tuple[tuple[str, ...], int, int] | tuple[()] = ()

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
