"""The daemon's alerts and the automated responses they caused, and undoing one.

Fetched from the daemon (GET /v1/alerts; every host's, over several) in a thread worker when
the screen opens. `u` on a response that took effect returns it (its id, and its host over
several); the app asks before sending the undo (which puts the window back, rolls the engine
back to its previous config, or stops the standby).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from textual import getters, work
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import DataTable, Static

from llmconsole.console.tui.keys import bindings_for
from llmconsole.console.tui.widgets.footer import ConsoleFooter

if TYPE_CHECKING:
    from llmconsole.console.tui.console_state import ConsoleAppType


class AlertsLoaded(Message):
    def __init__(self, data: dict[str, Any] | None, error: str | None) -> None:
        super().__init__()
        self.data = data
        self.error = error


def undoable(response: dict[str, Any]) -> bool:
    return response.get("outcome") == "applied" and not response.get("detail", {}).get("undone_by")


class AlertsScreen(ModalScreen[dict[str, Any] | None]):
    BINDINGS = bindings_for("alerts")

    if TYPE_CHECKING:
        app = getters.app(ConsoleAppType)  # the console's state, typed (no runtime check)

    def __init__(self) -> None:
        super().__init__()
        self.responses: list[dict[str, Any]] = []

    def compose(self) -> ComposeResult:
        with Vertical(id="alerts-box"):
            yield Static("Alerts", id="alerts-title")
            yield Static("loading ...", id="alerts-active")
            yield DataTable(id="alerts-table", cursor_type="row", zebra_stripes=True)
            yield Static(id="alerts-note")
        yield ConsoleFooter()

    def on_mount(self) -> None:
        t = self.query_one(DataTable)
        for label in ("#", "at", "response", "engine", "trigger", "outcome"):
            t.add_column(label, key=label)
        self._load()

    @work(thread=True, group="alerts", exclusive=True, exit_on_error=False)
    def _load(self) -> None:
        try:
            self.post_message(AlertsLoaded(self.app.source.alerts(), None))
        except Exception as e:  # the screen says so; the console keeps running
            self.post_message(AlertsLoaded(None, f"{type(e).__name__}: {e}"))

    def on_alerts_loaded(self, message: AlertsLoaded) -> None:
        active = self.query_one("#alerts-active", Static)
        if message.data is None:
            active.update(f"the daemon did not answer: {message.error}")
            return
        firing = [f"{a['rule']} on {a['engine']} ({a['state']})" for a in message.data.get("active", [])]
        notes = [f"; {n}" for n in message.data.get("notes", [])]  # hosts that did not answer
        active.update("active: " + (", ".join(firing) if firing else "none") + "".join(notes))
        self.responses = list(reversed(message.data.get("responses", [])))  # newest first
        t = self.query_one(DataTable)
        t.clear()
        for i, r in enumerate(self.responses):
            d = r.get("detail", {})
            outcome = f"undone (#{d['undone_by']})" if d.get("undone_by") else r.get("outcome", "?")
            t.add_row(
                str(r["id"]),
                time.strftime("%H:%M:%S", time.localtime(r["at"])),
                r["kind"].removeprefix("response:"),
                r.get("engine") or "-",
                d.get("trigger") or "-",
                outcome,
                key=str(i),  # over several hosts ids repeat: each host numbers its own
            )
        enabled = message.data.get("settings", {}).get("responses", {})
        self.query_one("#alerts-note", Static).update(
            "responses enabled: "
            + (
                "; ".join(f"{k}: {', '.join(v)}" for k, v in enabled.items())
                or "none (llmconsole alerts --enable RULE=ACTION)"
            )
        )

    def selected(self) -> dict[str, Any] | None:
        t = self.query_one(DataTable)
        if not self.responses or t.cursor_row is None or t.cursor_row >= len(self.responses):
            return None
        return self.responses[t.cursor_row]

    def action_undo_selected(self) -> None:
        r = self.selected()
        if r is None or not undoable(r):
            self.notify("choose a response that took effect and is not undone yet", severity="warning")
            return
        self.dismiss(r)

    def action_close_alerts(self) -> None:
        self.dismiss(None)
