"""Gauges and small figure blocks, drawn as text: cheap to repaint, and N/A when a value is missing."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widget import Widget
from textual.widgets import Static

LABEL_WIDTH = 13  # the longest label (`host memory`) and two spaces: labels never touch their values
CAPTION_WIDTH = 15  # the latency table's first column: `60 s · 999 req`


def level_style(fraction: float) -> str:
    return "green" if fraction < 0.7 else "yellow" if fraction < 0.9 else "red"


class Gauge(Widget):
    """`label  ████░░░░  value`: the bar takes whatever width is left."""

    DEFAULT_CSS = """
    Gauge { height: 1; }
    """

    def __init__(self, label: str, **kw: Any) -> None:
        super().__init__(**kw)
        self._label = label
        self._fraction: float | None = None
        self._text = "N/A"

    def set(self, label: str, fraction: float | None, text: str) -> None:
        if fraction is not None:
            fraction = min(1.0, max(0.0, fraction))
        if (label, fraction, text) != (self._label, self._fraction, self._text):
            self._label, self._fraction, self._text = label, fraction, text
            self.refresh()

    def render(self) -> Text:
        width = self.size.width
        out = Text(self._label[:LABEL_WIDTH].ljust(LABEL_WIDTH), style="bold")
        bar_w = max(0, width - LABEL_WIDTH - len(self._text) - 2)
        if self._fraction is None:
            out.append("·" * bar_w, style="dim")
        else:
            filled = round(self._fraction * bar_w)
            out.append("█" * filled, style=level_style(self._fraction))
            out.append("░" * (bar_w - filled), style="dim")
        out.append(" " + self._text)
        out.no_wrap = True
        out.overflow = "ellipsis"
        return out


class Figures(Static):
    """Rows of `label value` pairs in aligned columns, refreshed only when a figure changes. A label
    and its value always have two spaces between them, and pairs three; a line too long for the
    width is cut at its end, never squeezed together."""

    def __init__(self, **kw: Any) -> None:
        super().__init__("", **kw)
        self._rows: tuple[tuple[tuple[str, str], ...], ...] = ()

    def set_rows(self, rows: list[list[tuple[str, str]]]) -> None:
        key = tuple(tuple(r) for r in rows)
        if key == self._rows:
            return
        self._rows = key
        columns = max((len(r) for r in rows), default=0)
        label_w = [max((len(r[j][0]) for r in rows if j < len(r)), default=0) for j in range(columns)]
        value_w = [max((len(r[j][1]) for r in rows if j < len(r)), default=0) for j in range(columns)]
        text = Text(no_wrap=True, overflow="ellipsis")
        for i, row in enumerate(rows):
            if i:
                text.append("\n")
            for j, (label, value) in enumerate(row):
                # The gap is part of the label's run: a renderer that drops a run's leading spaces
                # (some SVG viewers do) still cannot join a label to its value.
                text.append(("   " if j else "") + label.ljust(label_w[j]) + "  ", style="bold")
                text.append(value.rjust(value_w[j]))
        self.update(text, layout=False)  # a fixed block: a new figure needs no new layout


class LatencyTable(Static):
    """Latency percentiles (p50, p99) over a stated window: its caption says which, and how many
    requests finished in it."""

    def __init__(self, **kw: Any) -> None:
        super().__init__("", **kw)
        self._rows: tuple[object, ...] = ()

    def set_rows(self, caption: str, rows: list[tuple[str, str, str]]) -> None:
        key = (caption, tuple(rows))
        if key == self._rows:
            return
        self._rows = key
        text = Text(no_wrap=True, overflow="ellipsis")
        text.append(caption.ljust(CAPTION_WIDTH), style="bold")
        text.append("p50".rjust(9) + "p99".rjust(10), style="bold")
        for label, p50, p99 in rows:
            text.append("\n" + label.ljust(CAPTION_WIDTH), style="bold")
            text.append(p50.rjust(9) + p99.rjust(10))
        self.update(text, layout=False)
