"""What the keys may do now, and what they do: the console's actions.

`check_action` is the single judge: the footer greys out what it refuses (None), hides what does
not belong on the current screen (False), and the command palette asks it before running
anything. Whatever stops an engine asks first, in a modal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.screen import Screen

from llmconsole.console.tui.charts_live import RANGES_S, range_text
from llmconsole.console.tui.keys import KEYS, KeySpec, effective_key
from llmconsole.console.tui.logfilter import LogView
from llmconsole.console.tui.screens.alerts import AlertsScreen
from llmconsole.console.tui.screens.confirm import ConfirmScreen
from llmconsole.console.tui.screens.dashboard import DashboardScreen
from llmconsole.console.tui.screens.engine import DetailScreen, EngineScreen, LogsScreen
from llmconsole.console.tui.screens.form import EngineFormScreen
from llmconsole.console.tui.screens.help import HelpScreen
from llmconsole.console.tui.screens.history import HistoryScreen
from llmconsole.console.tui.screens.mode import ModeScreen
from llmconsole.console.tui.screens.run_base import RunScreen
from llmconsole.console.tui.screens.sweep import SweepScreen
from llmconsole.console.tui.screens.tune import TuneScreen
from llmconsole.console.tui.source import Command, StateSource
from llmconsole.console.tui.view import EngineView, Snapshot, goodbye

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
# measured on a ready engine
_RUN_ACTIONS: dict[str, type[RunScreen[Any, Any, Any]]] = {"sweep_engine": SweepScreen, "tune_engine": TuneScreen}


class ConsoleActions(_AppBase):
    """Mixed into ConsoleApp; `self` is the app."""

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
            if verb is not None and (self.lost_reason is not None or not e.can(verb)):
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
            if e is None or v is None or v["config_id"] == e.config_id or self.lost_reason is not None:
                return None  # nothing chosen, or the version it already runs
            return True
        if action in _WINDOW_ACTIONS:
            if not on_engines:
                return False
            e = self.selected_engine()
            if e is None or e.controller is None or e.controller.window is None or self.lost_reason is not None:
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
            return True if self.screen.one_chart else None  # both show: nothing to switch
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
            if e is None or e.state not in _MODE_STATES or self.lost_reason is not None:
                return None
            return True
        if action in _RUN_ACTIONS:
            if not on_engines:
                return False
            e = self.selected_engine()
            if e is None or e.state != "ready" or self.lost_reason is not None:
                return None
            return True
        if action in _FLEET_ACTIONS:
            if not isinstance(self.screen, DashboardScreen):
                return False
            if self.lost_reason is not None:
                return None
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
            if self.lost_reason is not None:
                why = "the daemon is not answering"
            self.notify(f"{description} is not available now: {why}", severity="warning")
            return
        await self.run_action(action)

    # --- actions ----------------------------------------------------------------------------

    def _engine_or_warn(self) -> EngineView | None:
        e = self.selected_engine()
        if e is None:
            self.notify("no engine selected", severity="warning")
        return e

    def action_start_engine(self) -> None:
        if (e := self._engine_or_warn()) is not None and e.can("start"):
            self.send(Command("start", e.name))

    def action_stop_engine(self) -> None:
        e = self._engine_or_warn()
        if e is None or not e.can("stop"):
            return
        self._ask(
            f"Stop engine {e.name}? Requests in flight get the daemon's drain time to finish; "
            "clients of it get errors until it is started again.",
            Command("stop", e.name),
            "Stop",
        )

    def action_restart_engine(self) -> None:
        e = self._engine_or_warn()
        if e is None or not e.can("restart"):
            return
        self._ask(
            f"Restart engine {e.name} on its current spec? It stops serving until it is ready again.",
            Command("restart", e.name),
            "Restart",
        )

    def action_stop_all(self) -> None:
        serving = self.snapshot.serving if self.snapshot else ()
        if not serving:
            return
        names = ", ".join(e.name for e in serving)
        self._ask(
            f"Stop ALL {len(serving)} running engine(s): {names}? The daemon keeps running.",
            Command("stop_all"),
            "Stop all",
        )

    def _ask(self, question: str, command: Command, yes_label: str) -> None:
        def answered(yes: bool | None) -> None:
            if yes:
                self.send(command)

        self.push_screen(ConfirmScreen(question, yes_label), answered)

    def action_show_detail(self) -> None:
        if (e := self._engine_or_warn()) is not None:
            self.push_screen(DetailScreen(e.name))

    def action_show_history(self) -> None:
        if (e := self._engine_or_warn()) is not None:
            self.push_screen(HistoryScreen(e.name))

    def action_rollback_selected(self) -> None:
        screen = self.screen
        e = self.selected_engine()
        v = screen.selected_version() if isinstance(screen, HistoryScreen) else None
        if e is None or v is None or v["config_id"] == e.config_id:
            return
        warn = "  It was judged known_bad." if v["verdict"] == "known_bad" else ""
        self._ask(
            f"Roll engine {e.name} back from config {e.config_id} to {v['config_id']}? It restarts "
            f"and stops serving until it is ready again.{warn}",
            Command("rollback", e.name, {"to": v["config_id"]}),
            "Roll back",
        )

    def action_show_logs(self) -> None:
        if (e := self._engine_or_warn()) is not None:
            self.push_screen(LogsScreen(e.name))
            self.poll_soon()

    def action_new_engine(self) -> None:
        def submitted(result: tuple[str, dict[str, Any]] | None) -> None:
            if result is not None:
                name, spec = result
                self.send(Command("start", name, spec))

        self.push_screen(EngineFormScreen(), submitted)

    def action_toggle_window_freeze(self) -> None:
        e = self._engine_or_warn()
        if e is not None and e.controller is not None:
            self.send(Command("window", e.name, {"freeze": not e.controller.frozen}))

    def action_nudge_window(self, step: int) -> None:
        """Set the window by hand, one step from where it stands; the controller freezes there."""
        e = self._engine_or_warn()
        if e is None or e.controller is None or e.controller.window is None:
            return
        c, now = e.controller, e.controller.window
        window = min(max(now + step, c.min_window or 1), c.max_window or now + step)
        self.send(Command("window", e.name, {"set": window}))

    def action_choose_mode(self) -> None:
        """The mode menu; a choice is sent as is (the menu says that it restarts the engine)."""
        e = self._engine_or_warn()
        if e is None or e.state not in _MODE_STATES:
            return

        def chosen(mode: str | None) -> None:
            if mode is not None and not (mode == e.mode and not e.mode_auto):
                self.send(Command("mode", e.name, {"mode": mode}))

        self.push_screen(ModeScreen(e.name, e.mode, e.mode_auto), chosen)

    def action_show_alerts(self) -> None:
        def chosen(action_id: int | None) -> None:
            if action_id is not None:
                self._ask(
                    f"Undo automated response #{action_id}? A window goes back to what it was, an "
                    "engine restarts on the config it ran before, or the standby stops.",
                    Command("undo", None, {"action_id": action_id}),
                    "Undo",
                )

        self.push_screen(AlertsScreen(), chosen)

    def _open_run(self, action: str) -> None:
        """The sweep or tune screen; it runs against the live daemon (a recording has none)."""
        e = self._engine_or_warn()
        if e is None or e.state != "ready":
            return
        self.push_screen(_RUN_ACTIONS[action](e.name, getattr(self.source, "paths", None), e.spec))

    def action_sweep_engine(self) -> None:
        self._open_run("sweep_engine")

    def action_tune_engine(self) -> None:
        self._open_run("tune_engine")

    def action_cycle_range(self) -> None:
        """The charts' span: 5, 15, 60 minutes, and round again."""
        at = RANGES_S.index(self.chart_range_s) if self.chart_range_s in RANGES_S else -1
        self.chart_range_s = RANGES_S[(at + 1) % len(RANGES_S)]
        self.notify(f"charts: the {range_text(self.chart_range_s)}", timeout=2)
        if isinstance(self.screen, DashboardScreen):
            self.screen.show_state(self)  # type: ignore[arg-type]  # self is the ConsoleApp

    def action_switch_chart(self) -> None:
        self.chart_pick = "usage" if self.chart_pick == "pid" else "pid"
        if isinstance(self.screen, DashboardScreen):
            self.screen.show_state(self)  # type: ignore[arg-type]  # self is the ConsoleApp

    def action_toggle_full_log(self) -> None:
        self.log_view = dataclasses.replace(self.log_view, full=not self.log_view.full)
        self._log_view_changed()

    def action_search_log(self) -> None:
        if isinstance(self.screen, (DashboardScreen, LogsScreen)):
            self.screen.open_search()

    def set_log_search(self, text: str) -> None:
        self.log_view = dataclasses.replace(self.log_view, search=text.strip())
        self._log_view_changed()

    def _log_view_changed(self) -> None:
        if isinstance(self.screen, (DashboardScreen, LogsScreen)):
            self.screen.show_log_view()

    def action_show_help(self) -> None:
        self.push_screen(HelpScreen())

    async def action_quit(self) -> None:
        if getattr(self.screen, "busy", False):  # an apply whose answer is on its way
            self.notify(
                "a tuned config is being applied: its outcome shows here in a moment; then q quits", severity="warning"
            )
            return
        farewell = goodbye(self.snapshot, daemon_lost=self.lost_reason is not None)
        note = getattr(self.screen, "farewell_note", None)
        self.exit(f"{farewell}; {note}" if note else farewell)
