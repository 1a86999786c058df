"""Every key, generated from the same table as the footer and the command palette."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from llmconsole.console.tui.keys import CONTEXT_TITLES, CONTEXTS, KEYS, KeySpec, bindings_for, effective_key
from llmconsole.console.tui.widgets.footer import ConsoleFooter

_MORE = {
    "start": "Start the selected engine (stopped or failed) on its last spec",
    "stop": "Stop the selected engine (asks first)",
    "restart": "Restart the selected engine on its current spec (asks first)",
    "logs": "The selected engine's whole log, followed",
    "detail": "Spec, changes, startup facts and restarts of the selected engine (Enter on a row too)",
    "history": "Every config the selected engine ran, its verdict and what changed",
    "rollback": "Restart the engine on the selected version (asks first)",
    "new_engine": "The start-engine form",
    "stop_all": "Stop every running engine; the daemon stays (asks first)",
    "help": "Every key, as in this table",
    "palette": "Every action, searchable",
    "quit": "Leave the console; every engine keeps serving",
    "back": "Back to the previous screen (on the log screen a search is cleared first)",
    "clear_search": "Clear the log pane's search (shown while there is one)",
    "mode": "The selected engine's memory mode: a guarded restart, rolled back if it fails",
    "performance": "0.90 of memory (GPU utilization, or the CPU budget): the most KV cache",
    "balanced": "0.85 of memory",
    "aggressive": "0.75 of memory: furthest from an out-of-memory",
    "auto": "The policy picks: memory above 60% balanced, above 80% aggressive",
    "mode_cancel": "Leave the mode as it is",
    "alerts": "The daemon's alerts and the automated responses they caused",
    "undo_response": "Undo the selected response (asks first)",
    "chart_range": "The dashboard's charts: the last 5, 15 or 60 minutes",
    "chart_pick": "The other chart, where the terminal is too short for both (under 30 rows)",
    "full_log": "The log pane: the engine's own lines (quiet), or every line with requests and the daemon's polls",
    "search_log": "Search the log: lines with the text, highlighted; Esc clears (each pane keeps its own)",
    "next_knob": "The tune's knob chart: the next knob of the search against goodput",
    "alerts_close": "Back to the previous screen",
}


class HelpScreen(ModalScreen[None]):
    BINDINGS = bindings_for("help")

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help-box"):
            yield Static(self._tables(), id="help-keys")
        yield ConsoleFooter()

    def on_mount(self) -> None:
        box = self.query_one("#help-box")
        box.border_title = 'keys  (remap by id in console.toml: \\[keys] stop = "x")'
        box.border_subtitle = "esc closes"
        self.call_after_refresh(self._say_if_it_scrolls)

    def on_resize(self) -> None:
        self.call_after_refresh(self._say_if_it_scrolls)

    def _say_if_it_scrolls(self) -> None:
        """Taller than the screen: the box says so, or the keys below its edge go unseen."""
        box = self.query_one("#help-box", VerticalScroll)
        box.border_subtitle = "↑/↓ PgUp/PgDn scroll · esc closes" if box.max_scroll_y > 0 else "esc closes"

    def _key_text(self, spec: KeySpec) -> str:
        keymap = getattr(self.app, "keymap", {})
        display = spec.key_display if spec.id not in keymap else None
        return ", ".join(
            self.app.get_key_display(Binding(k.strip(), spec.action, key_display=display))
            for k in effective_key(spec, keymap).split(",")
        )

    def _tables(self) -> Group:
        tables = []
        for context in CONTEXTS:
            specs = [k for k in KEYS if k.contexts[0] == context]
            if not specs:
                continue
            t = Table(
                title=f"on {CONTEXT_TITLES[context]}",
                title_justify="left",
                title_style="bold",
                box=None,
                pad_edge=False,
                show_edge=False,
                show_header=False,
                expand=True,
            )
            t.add_column("key", style="bold cyan", no_wrap=True, width=10)
            t.add_column("id", style="dim", no_wrap=True, width=14)
            t.add_column("does", ratio=1)
            for spec in specs:
                more = _MORE.get(spec.id, spec.long_name)
                t.add_row(self._key_text(spec), spec.id, f"{more} (on {spec.where})" if spec.where else more)
            tables.append(t)
        return Group(*tables)

    def action_back(self) -> None:
        self.dismiss(None)


def markdown_key_table() -> str:
    """The key table of docs/keys.md, from the same table as the footer, the palette and this screen."""
    names = {"question_mark": "?", "plus": "+", "minus": "-", "escape": "Esc"}
    rows = ["| key | id | where | does |", "| --- | --- | --- | --- |"]
    for spec in KEYS:
        keys = ", ".join(f"`{spec.key_display or names.get(k, k)}`" for k in spec.key.split(","))
        rows.append(
            f"| {keys} | {spec.id} | {spec.where or CONTEXT_TITLES[spec.contexts[0]]} | "
            f"{_MORE.get(spec.id, spec.long_name)} |"
        )
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_key_table())
