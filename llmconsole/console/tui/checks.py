"""What the keys may do now: `check_action` is the single judge. The footer greys out what it
refuses (None), hides what does not belong on the current screen (False), and the command palette
asks it before running anything. Over several hosts, what acts on an engine is refused while
its host does not answer (the engine is shown as last seen).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen

from llmconsole.console.tui.keys import KEYS, KeySpec, effective_key
from llmconsole.console.tui.logfilter import LogView
from llmconsole.console.tui.screens.dashboard import DashboardScreen
from llmconsole.console.tui.screens.engine import DetailScreen, EngineScreen, LogsScreen
from llmconsole.console.tui.screens.history import HistoryScreen
from llmconsole.console.tui.sources.daemon import Command, StateSource
from llmconsole.console.tui.views.status import EngineView, Snapshot

if TYPE_CHECKING:
    _AppBase = App[str]  # what ConsoleApp, which this is mixed into, derives from
else:
    _AppBase = object

_VERB_OF = {"start_engine": "start", "stop_engine": "stop", "restart_engine": "restart"}
_ENGINE_ACTIONS = set(_VERB_OF) | {"show_logs", "show_detail", "show_history"}
_FLEET_ACTIONS = {"stop_all", "new_engine"}
_WINDOW_ACTIONS = {"toggle_window_freeze", "nudge_window"}
_LOG_ACTIONS = {"toggle_full_log", "search_log"}  # the dashboard's log pane and the log screen
_MODE_STATES = ("ready", "unhealthy")  # a switch needs a serving engine to fall back to
_RUN_ACTIONS = {"sweep_engine", "tune_engine"}  # measured on a ready engine


class ActionChecks(_AppBase):
    """Mixed into ConsoleApp (through ConsoleActions); `self` is the app."""

    if TYPE_CHECKING:  # ConsoleApp's state and methods that the actions use
        source: StateSource
        keymap: dict[str, str]
        snapshot: Snapshot | None
        lost_reason: str | None
        chart_range_s: float
        chart_pick: str
        log_view: LogView

        def send(self, command: Command) -> None: ...
        def poll_soon(self) -> None: ...
        def want_history(self, name: str) -> None: ...

    # --- what the keys may do now -----------------------------------------------------------

    def selected_engine(self) -> EngineView | None:
        screen = self.screen
        name: str | None
        if isinstance(screen, EngineScreen):
            name = screen.engine_name
        elif isinstance(screen, DashboardScreen):
            name = screen.selected_name
        else:
            return None
        return self.snapshot.engine(name) if self.snapshot else None

    def selected_host(self) -> str | None:
        """Over several hosts: the host under the dashboard's cursor (its row, or its engine's)."""
        return getattr(self.screen, "selected_host", None)

    def not_answering(self, e: EngineView | None) -> str | None:
        """Why a command about `e` cannot be sent now: no daemon answers, or not its host's."""
        if self.lost_reason is not None:
            return "the daemon is not answering"
        return self.snapshot.unreachable(e) if self.snapshot is not None and e is not None else None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """True: allowed now. None: shown greyed (not in this state). False: not on this screen."""
        on_engines = isinstance(self.screen, (DashboardScreen, EngineScreen))
        if action in _ENGINE_ACTIONS:
            if not on_engines:
                return False
            e = self.selected_engine()
            if e is None:
                return None
            verb = _VERB_OF.get(action)
            if verb is not None and (self.not_answering(e) is not None or not e.can(verb)):
                return None
            if action == "show_detail" and isinstance(self.screen, DetailScreen):
                return None
            if action == "show_logs" and isinstance(self.screen, LogsScreen):
                return None
            if action == "show_history" and isinstance(self.screen, HistoryScreen):
                return None
            return True
        if action == "rollback_selected":
            if not isinstance(self.screen, HistoryScreen):
                return False
            e, v = self.selected_engine(), self.screen.selected_version()
            if e is None or v is None or v["config_id"] == e.config_id or self.not_answering(e) is not None:
                return None  # nothing chosen, or the version it already runs
            return True
        if action in _WINDOW_ACTIONS:
            if not on_engines:
                return False
            e = self.selected_engine()
            if e is None or e.controller is None or e.controller.window is None or self.not_answering(e):
                return None  # no gateway window for it (or no daemon to ask)
            if action == "nudge_window" and parameters and isinstance(step := parameters[0], int):
                c, w = e.controller, e.controller.window + step
                if (c.min_window is not None and w < c.min_window) or (c.max_window is not None and w > c.max_window):
                    return None
            return True
        if action == "cycle_range":
            return isinstance(self.screen, DashboardScreen)
        if action == "switch_chart":
            if not isinstance(self.screen, DashboardScreen):
                return False
            return self.screen.one_chart  # where both charts show there is nothing to switch: hidden
        if action in _LOG_ACTIONS:
            return isinstance(self.screen, (DashboardScreen, LogsScreen))
        if action == "show_alerts":
            if not on_engines:
                return False
            return None if self.lost_reason is not None else True
        if action == "choose_mode":
            if not on_engines:
                return False
            e = self.selected_engine()
            if e is None or e.state not in _MODE_STATES or self.not_answering(e) is not None:
                return None
            return True
        if action in _RUN_ACTIONS:
            if not on_engines:
                return False
            e = self.selected_engine()
            if e is None or e.state != "ready" or self.not_answering(e) is not None:
                return None
            return True
        if action in _FLEET_ACTIONS:
            if not isinstance(self.screen, DashboardScreen):
                return False
            if self.lost_reason is not None:
                return None
            host = self.selected_host()
            section = self.snapshot.section(host) if self.snapshot is not None and host is not None else None
            if action == "new_engine" and section is not None and not section.reachable:
                return None  # the host under the cursor is not reached: nothing can start there
            if action == "stop_all" and not (self.snapshot and self.snapshot.serving):
                return None
            return True
        return True

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        for spec in KEYS:
            if not spec.palette:
                continue
            key = self.get_key_display(self._binding_for(spec))
            yield SystemCommand(
                spec.long_name,
                f"key {key}  ·  id {spec.id}",
                lambda spec=spec: self._from_palette(spec.action, spec.long_name),
            )
        for cmd in super().get_system_commands(screen):
            if cmd.title == "Theme":  # Textual's own; its quit and key panel would bypass ours
                yield cmd

    def _binding_for(self, spec: KeySpec) -> Binding:
        key = effective_key(spec, self.keymap).split(",")[0]
        return Binding(key, spec.action, key_display=None if spec.id in self.keymap else spec.key_display)

    async def _from_palette(self, action: str, description: str) -> None:
        if self.check_action(action, ()) is not True:
            e = self.selected_engine()
            why = f"engine {e.name} is {e.state}" if e else "no engine is selected here"
            why = self.not_answering(e) or why
            self.notify(f"{description} is not available now: {why}", severity="warning")
            return
        await self.run_action(action)
