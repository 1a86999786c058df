"""The dashboard's smaller parts: the status line, the daemon-lost banner, the alerts strip and
the batch-window strip."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import Static

from llmconsole.console.commands.window import no_samples_text
from llmconsole.console.tui.charts.live import SIGNALS
from llmconsole.console.tui.views.status import EngineView, Snapshot, fmt_bytes, na


class StatusLine(Static):
    DEFAULT_CSS = """
    StatusLine { height: 1; background: $panel; padding: 0 1; text-wrap: nowrap; text-overflow: ellipsis; }
    """

    def show(self, snapshot: Snapshot | None) -> None:
        if snapshot is None:
            self.update(Text.assemble(("llmconsole", "bold"), "  ·  waiting for the daemon"))
            return
        if snapshot.hosts:
            self.update(fleet_line(snapshot), layout=False)
            return
        h = snapshot.host
        gpus = f"{len(h.gpus)} GPU(s)" if h.gpus else "no GPU"
        line = Text(
            f"llmconsole · daemon pid {na(snapshot.daemon_pid)} v{na(snapshot.daemon_version)} · "
            f"host CPU {na(h.cpu_pct, '{:.0f}%')}, mem {fmt_bytes(h.memory_used_bytes)} / "
            f"{fmt_bytes(h.memory_total_bytes)} · {gpus} · {len(snapshot.engines)} engine(s)",
            no_wrap=True,
            overflow="ellipsis",
        )
        if snapshot.wire_note:  # a daemon of another llmconsole: shown as far as both know
            line.append(f" · {snapshot.wire_note}", style="yellow")
        self.update(layout=False, content=line)


def fleet_line(snapshot: Snapshot) -> Text:
    """The status line of a console over several hosts: how many answer, and the engines."""
    states = [h.state for h in snapshot.hosts]
    counts = [f"{states.count(s)} {s}" for s in dict.fromkeys(states) if s != "up"]
    up = f"{states.count('up')} of {len(states)} hosts up"
    out = Text.assemble(("llmconsole", "bold"), f" · {up}", no_wrap=True, overflow="ellipsis")
    if counts:
        out.append(" · " + ", ".join(counts), style="bold red" if "unreachable" in states else "yellow")
    out.append(f" · {len(snapshot.engines)} engine(s)")
    return out


class DaemonBanner(Static):
    """Shown while the daemon does not answer; the console keeps the last state and retries."""

    DEFAULT_CSS = """
    DaemonBanner { display: none; height: auto; background: $error; color: $text; padding: 0 1; }
    DaemonBanner.-lost { display: block; }
    """

    def show(self, reason: str | None, retry_s: float) -> None:
        self.set_class(reason is not None, "-lost")
        if reason is not None:
            self.update(
                Text.assemble(
                    ("daemon lost", "bold"),
                    f": {reason}\n",
                    f"retrying every {retry_s:.0f} s; the figures below are the last ones it sent",
                )
            )


class AlertStrip(Static):
    DEFAULT_CSS = """
    AlertStrip { height: 1; width: auto; padding: 0 1; }
    """

    def show(self, alerts: tuple[str, ...] = ()) -> None:
        text = "; ".join(alerts) if alerts else "no alerts"
        self.update(Text.assemble(("alerts  ", "bold"), (text, "red" if alerts else "green")))


def pack(parts: list[Text], width: int, sep: str = " · ") -> Text:
    """Parts on as few lines as `width` allows, breaking only between parts."""
    out, line = Text(no_wrap=True, overflow="ellipsis"), 0
    for part in parts:
        n = part.cell_len
        if line and line + len(sep) + n > width:
            out.append("\n")
            line = 0
        elif line:
            out.append(sep, style="dim")
            line += len(sep)
        out.append_text(part)
        line += n
    return out


def window_parts(engine: EngineView | None) -> list[Text]:
    """The selected engine's batch window at the gateway: the window and its bounds, whether the
    controller steers it or it is frozen, the measured signal against the target (or why there
    is no measurement), and the group's requests in flight and queued."""
    c = engine.controller if engine is not None else None
    if c is None:
        return [Text.assemble(("batch window  ", "bold"), ("none: the engine is not behind the gateway", "dim"))]
    state = (
        Text("frozen (f resumes it)", style="bold yellow")
        if c.frozen
        else Text(f"controlled ({c.action})" if c.action else "controlled", style="green")
    )
    signal = SIGNALS.get(c.signal or "", c.signal or "signal")
    measured, target = c.measured_now_ms, c.target_ms
    if measured is None:
        signal_text = Text.assemble(
            (no_samples_text(c.signal, c.recent_ok, c.recent_streamed), "yellow"),
            f" (target {na(target, '{:.0f}')} ms)",
        )
    else:
        over = target is not None and measured > 1.1 * target
        signal_text = Text.assemble(
            f"{signal} ", (f"{measured:.0f} ms", "red" if over else "green"), f" / target {na(target, '{:.0f}')} ms"
        )
    return [
        Text.assemble(("batch window  ", "bold"), f"{na(c.window)} in {na(c.min_window)}-{na(c.max_window)}"),
        state,
        signal_text,
        Text(f"in flight {na(c.in_flight)}, queued {na(c.queued)}"),
    ]


class WindowStrip(Static):
    """The batch window's state in one line where the width allows, two where it does not: it
    never cuts off whether the controller is frozen."""

    DEFAULT_CSS = """
    WindowStrip { height: auto; width: 1fr; padding: 0 1; }
    """

    def __init__(self, **kw: Any) -> None:
        super().__init__("", **kw)
        self._engine: EngineView | None = None
        self._shown: tuple[object, ...] = ()
        self._lines = 0

    def on_mount(self) -> None:
        self.show(None)

    def show(self, engine: EngineView | None) -> None:
        self._engine = engine
        self._paint()

    def on_resize(self) -> None:
        self._paint()

    def _paint(self) -> None:
        parts = window_parts(self._engine)
        width = max(20, self.size.width - 2)
        key = (tuple(p.plain for p in parts), width)
        if key != self._shown:
            text = pack(parts, width)
            lines = len(text.plain.splitlines())
            # A new layout only when the strip needs another number of lines.
            self.update(text, layout=not self._shown or lines != self._lines)
            self._shown, self._lines = key, lines
