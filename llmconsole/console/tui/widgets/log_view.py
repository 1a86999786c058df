"""The dashboard's log pane (the selected engine's newest lines, quiet by default) and the search
bar that `/` opens over it (and over the log screen)."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import events
from textual.message import Message
from textual.widgets import Input, Log, Static

from llmconsole.console.tui.logfilter import LogView
from llmconsole.console.tui.views.status import LogChunk


class LogTail(Static):
    """The last lines of the selected engine's log that the view keeps, as many as fit."""

    DEFAULT_CSS = """
    LogTail { height: 1fr; min-height: 2; padding: 0 1; border-top: solid $panel; text-wrap: nowrap; text-overflow: ellipsis; }
    """

    def __init__(self, **kw: Any) -> None:
        super().__init__("", **kw)
        self._name: str | None = None
        self._lines: list[str] = []
        self._view = LogView()
        self._shown: tuple[object, ...] = ()

    def show(self, name: str | None, chunk: LogChunk | None, view: LogView) -> None:
        if name != self._name:
            self._name, self._lines = name, []
        if chunk is not None and chunk.name == name:
            self._lines = chunk.text.splitlines()
        self._view = view
        self._paint()

    def on_resize(self) -> None:
        self._paint()

    def _paint(self) -> None:
        rows = max(1, self.content_size.height)
        shown, hidden = self._view.lines(self._lines)
        tail = tuple(shown[-rows:])
        key = (tail, hidden, rows, self.content_size.width, self._view, self._name)
        if key == self._shown:
            return
        self._shown = key
        self.border_title = f"log: {self._name} · {self._view.describe(hidden)}" if self._name else "log"
        if not tail:
            if not self._name:
                self.update("")
            elif self._lines:
                what = "search" if self._view.search else "quiet view"
                self.update(
                    Text(
                        f"(no line of the newest {len(self._lines)} matches the {what}; "
                        "v shows every line, esc clears a search)",
                        style="dim",
                    )
                )
            else:
                self.update(Text("(no log yet)", style="dim"))
            return
        text = Text(no_wrap=True, overflow="ellipsis")
        for i, line in enumerate(tail):
            if i:
                text.append("\n")
            text.append_text(self._view.mark(line))
        self.update(text, layout=False)  # the pane's size is the layout's, not its text's


class FollowLog(Log):
    """A log that keeps its newest line in view until the user scrolls up, and again once they
    scroll back to the end.

    Textual's Log follows only while it already sits at the end when lines arrive; a horizontal
    scrollbar that appears once long lines are measured, or a clear and rewrite (v), leaves it a
    line or more short of the end, and from then on it stops following."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(auto_scroll=False, **kw)
        self.following = True

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        # Only a scroll moves this: lines arriving or the view resizing change the end instead.
        self.following = new_value >= self.max_scroll_y

    def _to_end(self) -> None:
        if self.following and self.scroll_y < self.max_scroll_y:
            self.scroll_end(animate=False, immediate=True, x_axis=False)

    def follow(self) -> None:
        """Bring the end into view now and after the next layout (scrollbars, width, height)."""
        self._to_end()
        self.call_after_refresh(self._to_end)

    def write_lines(self, lines: Any, scroll_end: bool | None = None) -> FollowLog:
        super().write_lines(lines, scroll_end=False)
        self.follow()
        return self

    def clear(self) -> FollowLog:
        super().clear()
        self.follow()
        return self

    def _update_maximum_width(self, updates: int, size: int) -> None:
        super()._update_maximum_width(updates, size)
        self.follow()

    def on_resize(self) -> None:
        self.follow()


class SearchBar(Input):
    """`/` opens it; typing narrows the log as you go; enter keeps the search, esc clears it."""

    DEFAULT_CSS = """
    SearchBar { display: none; height: 1; border: none; padding: 0 1; }
    SearchBar.-open { display: block; }
    """

    class Searched(Message):
        def __init__(self, text: str, done: bool) -> None:
            super().__init__()
            self.text = text
            self.done = done

    def __init__(self, **kw: Any) -> None:
        super().__init__(placeholder="search the log: enter keeps it, esc clears it", compact=True, **kw)

    def open(self, text: str) -> None:
        self.value = text
        self.add_class("-open")
        self.focus()

    def close(self) -> None:
        self.remove_class("-open")

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.post_message(self.Searched(event.value, done=False))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.close()
        self.post_message(self.Searched(event.value, done=True))

    def on_key(self, event: events.Key) -> None:
        if event.key == "escape":
            event.stop()
            self.value = ""
            self.close()
            self.post_message(self.Searched("", done=True))
