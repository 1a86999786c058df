"""The dashboard: every engine in a table, and the selected one in detail below it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from textual import getters
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widgets import DataTable

from llmconsole.console.tui.widgets.engine_panel import EnginePanel
from llmconsole.console.tui.widgets.engines_table import EnginesTable
from llmconsole.console.tui.widgets.footer import ConsoleFooter
from llmconsole.console.tui.widgets.panels import AlertStrip, ControllerPanel, DaemonBanner, LogTail, StatusLine

if TYPE_CHECKING:
    from llmconsole.console.tui.app import ConsoleApp

TAIL_BYTES = 6 * 1024


class DashboardScreen(Screen[None]):
    if TYPE_CHECKING:
        app = getters.app(ConsoleApp)  # the console's state, typed (no runtime check)

    def compose(self) -> ComposeResult:
        yield DaemonBanner(id="banner")
        yield StatusLine(id="status-line")
        yield EnginesTable(id="engines")
        yield EnginePanel(id="engine-panel")
        with Horizontal(id="strip"):
            yield AlertStrip(id="alerts")
            yield ControllerPanel(id="controller")
        yield LogTail(id="log-tail")
        yield ConsoleFooter()

    @property
    def selected_name(self) -> str | None:
        return self.query_one(EnginesTable).selected_name

    def log_request(self) -> tuple[str, int | None, int] | None:
        name = self.selected_name
        return (name, None, TAIL_BYTES) if name else None

    def on_resize(self) -> None:
        self.set_class(self.size.height >= 34, "-tall")
        self.set_class(self.size.width >= 110, "-wide")
        self.query_one(EnginesTable).set_wide(self.size.width >= 110)
        if self.app.snapshot is not None:
            self.show_state(self.app)

    def on_screen_resume(self) -> None:
        self.show_state(self.app)

    def show_state(self, app: ConsoleApp) -> None:
        self.query_one(DaemonBanner).show(app.lost_reason, app.retry_s)
        snap = app.snapshot
        self.query_one(StatusLine).show(snap)
        if snap is None:
            return
        table = self.query_one(EnginesTable)
        table.show(snap)
        self._show_selected(app)
        self.query_one(AlertStrip).show(())

    def _show_selected(self, app: ConsoleApp) -> None:
        snap = app.snapshot
        if snap is None:
            return
        name = self.selected_name
        self.query_one(EnginePanel).show(snap.engine(name), snap.host, app.history)
        self.query_one(LogTail).show(name, app.logs.get(name) if name else None)
        self.query_one(ControllerPanel).show(snap.engine(name))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self._show_selected(self.app)
        if self.selected_name not in self.app.logs:
            self.app.poll_soon()  # the new selection's log now, not a second later
        self.app.refresh_bindings_if_changed()

    async def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        await self.app.run_action("show_detail")
