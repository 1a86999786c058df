"""What the keys do: the console's actions (checks.py says when they may). Whatever stops an
engine asks first, in a modal. Over several hosts every engine is ENGINE@HOST and the source
sends each command to that host; a new engine starts on the host under the cursor.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from llmconsole.console.tui.charts.live import RANGES_S, range_text
from llmconsole.console.tui.checks import _MODE_STATES, ActionChecks
from llmconsole.console.tui.farewell import goodbye
from llmconsole.console.tui.screens.alerts import AlertsScreen
from llmconsole.console.tui.screens.confirm import ConfirmScreen
from llmconsole.console.tui.screens.dashboard import DashboardScreen
from llmconsole.console.tui.screens.engine import DetailScreen, LogsScreen
from llmconsole.console.tui.screens.form import EngineFormScreen
from llmconsole.console.tui.screens.help import HelpScreen
from llmconsole.console.tui.screens.history import HistoryScreen
from llmconsole.console.tui.screens.mode import ModeScreen
from llmconsole.console.tui.screens.run_base import RunScreen
from llmconsole.console.tui.screens.sweep import SweepScreen
from llmconsole.console.tui.screens.tune import TuneScreen
from llmconsole.console.tui.sources.daemon import Command
from llmconsole.console.tui.views.status import EngineView

_RUN_SCREENS: dict[str, type[RunScreen[Any, Any, Any]]] = {"sweep_engine": SweepScreen, "tune_engine": TuneScreen}


class ConsoleActions(ActionChecks):
    """Mixed into ConsoleApp; `self` is the app."""

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
        host = self.selected_host()  # over several hosts: the engine starts on the one under the cursor
        section = self.snapshot.section(host) if self.snapshot is not None else None

        def submitted(result: tuple[str, dict[str, Any]] | None) -> None:
            if result is not None:
                name, spec = result
                self.send(Command("start", name if host is None else f"{name}@{host}", spec))

        self.push_screen(EngineFormScreen(host, remote=section is not None and not section.local), submitted)

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
        def chosen(response: dict[str, Any] | None) -> None:
            if response is not None:
                action_id, host = int(response["id"]), response.get("host")
                where = {} if host is None else {"host": host}
                self._ask(
                    f"Undo automated response #{action_id}{'' if host is None else ' on ' + host}? A window "
                    "goes back to what it was, an engine restarts on the config it ran before, or the standby stops.",
                    Command("undo", None, {"action_id": action_id, **where}),
                    "Undo",
                )

        self.push_screen(AlertsScreen(), chosen)

    def _open_run(self, action: str) -> None:
        """The sweep or tune screen, on the engine's own daemon (a recording has none)."""
        e = self._engine_or_warn()
        if e is None or e.state != "ready":
            return
        dialer = getattr(self.source, "dialer", None)
        name, dial = dialer(e.name) if dialer is not None else (e.name, None)
        self.push_screen(_RUN_SCREENS[action](name, dial, e.spec, shown_as=e.name))

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
