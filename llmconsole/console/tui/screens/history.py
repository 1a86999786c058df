"""One engine's config history: every version it ran, its verdict, what changed, and rollback.

The versions come from the daemon's store (GET /v1/engines/{name}/history) in a thread worker;
they are fetched again whenever the engine's config changes, so a rollback shows up here as
soon as the daemon reports it.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.message import Message
from textual.widgets import DataTable, Static

from llmconsole.console.tui.keys import bindings_for
from llmconsole.console.tui.screens.engine import EngineScreen
from llmconsole.console.tui.widgets.footer import ConsoleFooter
from llmconsole.console.tui.widgets.panels import DaemonBanner

if TYPE_CHECKING:
    from llmconsole.console.tui.console_state import ConsoleState

_VERDICT_STYLE = {"known_good": "green", "known_bad": "bold red", "pending": "yellow"}


class HistoryLoaded(Message):
    def __init__(self, engine: str, versions: tuple[dict[str, Any], ...], error: str | None) -> None:
        super().__init__()
        self.engine = engine
        self.versions = versions
        self.error = error


def diff_text(diff: list[dict[str, Any]], limit: int = 3) -> str:
    if not diff:
        return "-"
    parts = [f"{d['field']}: {json.dumps(d['before'])}→{json.dumps(d['after'])}" for d in diff[:limit]]
    return "; ".join(parts) + (f"; +{len(diff) - limit} more" if len(diff) > limit else "")


class HistoryScreen(EngineScreen):
    BINDINGS = bindings_for("screen") + bindings_for("history")

    def __init__(self, engine_name: str) -> None:
        super().__init__(engine_name)
        self.versions: tuple[dict[str, Any], ...] = ()
        self._loaded_for: str | None = None  # the config id the shown history was fetched at

    def compose(self) -> ComposeResult:
        yield DaemonBanner()
        yield Static(Text.assemble(("config history of ", "bold"), (self.engine_name, "bold")), id="history-title")
        yield DataTable(id="history-table", cursor_type="row", zebra_stripes=True)
        yield Static(id="history-note")
        yield ConsoleFooter()

    def on_mount(self) -> None:
        t = self.query_one(DataTable)
        for label, key in (
            ("", "mark"),
            ("config", "config"),
            ("verdict", "verdict"),
            ("runs", "runs"),
            ("last used", "used"),
            ("from", "parent"),
            ("what changed", "diff"),
        ):
            t.add_column(label, key=key)

    def on_screen_resume(self) -> None:
        self.show_state(self.app)

    def show_state(self, app: ConsoleState) -> None:
        self.query_one(DaemonBanner).show(app.lost_reason, app.retry_s)
        e = app.snapshot.engine(self.engine_name) if app.snapshot else None
        current = e.config_id if e else None
        if current is not None and current != self._loaded_for and app.lost_reason is None:
            self._loaded_for = current
            self._load()

    @work(thread=True, group="history", exclusive=True, exit_on_error=False)
    def _load(self) -> None:
        try:
            reply = self.app.source.history(self.engine_name)
            versions = tuple(reply.get("versions", ()))
            self.post_message(HistoryLoaded(self.engine_name, versions, None))
        except Exception as e:  # shown in the note; the next config change tries again
            self.post_message(HistoryLoaded(self.engine_name, (), f"{type(e).__name__}: {e}"))

    def on_history_loaded(self, message: HistoryLoaded) -> None:
        note = self.query_one("#history-note", Static)
        if message.error is not None:
            self._loaded_for = None
            note.update(Text(f"history could not be read: {message.error}", style="red"))
            return
        self.versions = message.versions
        t = self.query_one(DataTable)
        t.clear()
        for v in self.versions:
            t.add_row(
                "*" if v.get("in_use") else "",
                v["config_id"],
                Text(v["verdict"], style=_VERDICT_STYLE.get(v["verdict"], "")),
                str(v.get("runs", 0)),
                time.strftime("%m-%d %H:%M", time.localtime(v["last_used_at"])),
                v.get("derived_from") or "-",
                diff_text(v.get("diff_from_parent", v.get("diff_from_previous", []))),  # an older daemon: previous
                key=v["config_id"],
            )
        note.update(
            Text(
                "* in use  ·  b rolls the engine back to the selected version (asks first)"
                if self.versions
                else "no recorded versions yet",
                style="dim",
            )
        )
        self.app.refresh_bindings()

    def selected_version(self) -> dict[str, Any] | None:
        t = self.query_one(DataTable)
        if not self.versions or t.cursor_row is None or not 0 <= t.cursor_row < len(self.versions):
            return None
        return self.versions[t.cursor_row]

    def on_data_table_row_highlighted(self, _event: DataTable.RowHighlighted) -> None:
        self.app.refresh_bindings()
