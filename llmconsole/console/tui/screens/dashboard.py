"""The dashboard: every engine in a table, and the selected one in detail below it: its figures,
its batch window, the PID trace and its history as charts, and its log, quiet by default."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Protocol, cast

from textual import getters
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import DataTable

from llmconsole.console.tui.keys import bindings_for
from llmconsole.console.tui.logfilter import LogView
from llmconsole.console.tui.views.status import Snapshot
from llmconsole.console.tui.widgets.dash_charts import DashCharts
from llmconsole.console.tui.widgets.engine_panel import EnginePanel
from llmconsole.console.tui.widgets.engines_table import EnginesTable
from llmconsole.console.tui.widgets.footer import ConsoleFooter
from llmconsole.console.tui.widgets.log_view import LogTail, SearchBar
from llmconsole.console.tui.widgets.panels import AlertStrip, DaemonBanner, StatusLine, WindowStrip

if TYPE_CHECKING:
    from llmconsole.console.tui.console_state import ConsoleAppType, ConsoleState

SHORT_HEIGHT = 30  # below this the panel keeps three rows and one chart shows at a time (g switches)
TAIL_BYTES = 32 * 1024  # enough of the log that the quiet view still has lines between the polls


class EngineList(Protocol):
    """The engines' list: one daemon's table, or the hosts' grouped list (widgets/hosts_table.py)."""

    @property
    def selected_name(self) -> str | None: ...
    def show(self, snapshot: Snapshot) -> None: ...
    def set_wide(self, wide: bool) -> None: ...
    def focus(self, scroll_visible: bool = True) -> Widget: ...


class DashboardScreen(Screen[None]):
    BINDINGS = bindings_for("dashboard")
    log_search = ""  # the log pane's own search: the log screen keeps another
    if TYPE_CHECKING:
        app = getters.app(ConsoleAppType)  # the console's state, typed (no runtime check)

    def engine_list(self) -> Widget:
        return EnginesTable(id="engines")

    @property
    def engines(self) -> EngineList:
        return cast(EngineList, self.query_one("#engines"))

    def compose(self) -> ComposeResult:
        yield DaemonBanner(id="banner")
        yield StatusLine(id="status-line")
        yield self.engine_list()
        yield EnginePanel(id="engine-panel")
        with Horizontal(id="strip"):
            yield AlertStrip(id="alerts")
            yield WindowStrip(id="controller")
        yield DashCharts(id="charts")
        yield LogTail(id="log-tail")
        yield SearchBar(id="search")
        yield ConsoleFooter()

    @property
    def selected_name(self) -> str | None:
        return self.engines.selected_name

    def log_request(self) -> tuple[str, int | None, int] | None:
        name = self.selected_name
        return (name, None, TAIL_BYTES) if name else None

    def on_resize(self) -> None:
        self.set_class(self.size.height >= 34, "-tall")
        self.set_class(self.size.width >= 110, "-wide")
        self.query_one(EnginePanel).set_short(self.size.height < SHORT_HEIGHT)
        self.engines.set_wide(self.size.width >= 110)
        if self.app.snapshot is not None:
            self.show_state(self.app)

    def on_screen_resume(self) -> None:
        self.show_state(self.app)

    def show_state(self, app: ConsoleState) -> None:
        self.query_one(DaemonBanner).show(app.lost_reason, app.retry_s)
        snap = app.snapshot
        self.query_one(StatusLine).show(snap)
        if snap is None:
            return
        self.engines.show(snap)
        self._show_selected(app)
        self.query_one(AlertStrip).show(())

    def _show_selected(self, app: ConsoleState) -> None:
        snap = app.snapshot
        if snap is None:
            return
        name = self.selected_name
        engine = snap.engine(name)
        self.query_one(EnginePanel).show(engine, snap.host_of(engine), app.switch_of(name))
        self.query_one(WindowStrip).show(engine)
        only = app.chart_pick if self.size.height < SHORT_HEIGHT else None
        self.query_one(DashCharts).show(app.history, engine, app.chart_range_s, only)
        self.query_one(LogTail).show(name, app.logs.get(name) if name else None, self.log_view)
        if name is not None:
            app.want_history(name)

    @property
    def one_chart(self) -> bool:
        return self.size.height < SHORT_HEIGHT

    @property
    def log_view(self) -> LogView:
        """The app's quiet/full choice, narrowed by this pane's own search."""
        return dataclasses.replace(self.app.log_view, search=self.log_search)

    def show_log_view(self) -> None:
        """The log view changed (quiet/full, a search): repaint the pane at once."""
        name = self.selected_name
        self.query_one(LogTail).show(name, self.app.logs.get(name) if name else None, self.log_view)
        self.refresh_bindings()  # Esc clears a search only while there is one

    def open_search(self) -> None:
        self.query_one(SearchBar).open(self.log_search)

    def on_search_bar_searched(self, event: SearchBar.Searched) -> None:
        self.log_search = event.text.strip()
        self.show_log_view()
        if event.done:
            self.engines.focus()

    def action_clear_search(self) -> None:
        self.log_search = ""
        self.show_log_view()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "clear_search":
            return bool(self.log_search)
        return True

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        self.selection_moved()

    def selection_moved(self) -> None:
        self._show_selected(self.app)
        if self.selected_name not in self.app.logs:
            self.app.poll_soon()  # the new selection's log now, not a second later
        self.app.refresh_bindings_if_changed()

    async def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        await self.app.run_action("show_detail")
