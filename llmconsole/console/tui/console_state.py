"""What the screens read of the console app, as a Protocol.

The app (app.py, actions.py) opens the screens, and a screen reads the app's state back: the
newest snapshot, the histories behind the charts, whether the daemon answers. Screens name that
state through `ConsoleState`, never `ConsoleApp` itself, so the app's module and the screens'
do not import each other; mypy checks that ConsoleApp has all of it (app.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from llmconsole.console.tui.charts.series import SeriesHistory
from llmconsole.console.tui.logfilter import LogView
from llmconsole.console.tui.sources.daemon import StateSource
from llmconsole.console.tui.views.config_memory import SpecMemory
from llmconsole.console.tui.views.status import LogChunk, Snapshot
from llmconsole.console.tui.widgets.engine_panel import Switch

if TYPE_CHECKING:
    from textual.app import App


class ConsoleState(Protocol):
    """The console's state as screens read it (read-only: screens change it through actions)."""

    @property
    def source(self) -> StateSource: ...
    @property
    def snapshot(self) -> Snapshot | None: ...
    @property
    def lost_reason(self) -> str | None: ...
    @property
    def retry_s(self) -> float: ...
    @property
    def specs(self) -> SpecMemory: ...
    @property
    def history(self) -> SeriesHistory: ...
    @property
    def chart_range_s(self) -> float: ...
    @property
    def chart_pick(self) -> str: ...
    @property
    def logs(self) -> dict[str, LogChunk]: ...
    @property
    def log_view(self) -> LogView: ...
    @property
    def cursor_blink(self) -> bool: ...

    def switch_of(self, name: str | None) -> Switch | None: ...
    def want_history(self, name: str) -> None: ...
    def poll_soon(self) -> None: ...
    def refresh_bindings_if_changed(self) -> None: ...


if TYPE_CHECKING:

    class ConsoleAppType(App[str], ConsoleState):
        """For type checking only: a screen's `self.app`, a Textual app with the console's state."""
