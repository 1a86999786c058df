"""The mode menu: pick an engine's memory mode, or let the auto policy pick it.

A switch restarts the engine, so the menu says what each mode means and what happens: the
gateway holds requests while the engine restarts, and a config that does not come up is rolled
back on its own. Escape changes nothing.
"""

from __future__ import annotations

from rich.table import Table
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

from llmconsole.console.tui.keys import bindings_for
from llmconsole.console.tui.widgets.footer import ConsoleFooter

CHOICES = (
    ("performance", "0.90 of memory: the most KV cache"),
    ("balanced", "0.85 of memory"),
    ("aggressive", "0.75 of memory: furthest from an out-of-memory"),
    ("auto", "the policy picks: >60% memory in use balanced, >80% aggressive"),
)


def _option(mode: str, description: str) -> Table:
    """A mode and what it means, in two columns: a description that wraps stays in its own
    column, where it cannot be read as another option."""
    grid = Table.grid(padding=(0, 2), expand=True)
    grid.add_column(width=11, no_wrap=True)
    grid.add_column(ratio=1)
    grid.add_row(mode, description)
    return grid


class ModeScreen(ModalScreen[str | None]):
    BINDINGS = bindings_for("mode")

    def __init__(self, engine: str, current: str | None, auto: bool) -> None:
        super().__init__()
        self.engine = engine
        self.current = current
        self.auto = auto

    def compose(self) -> ComposeResult:
        now = "auto" if self.auto else (self.current or "none (memory set by hand)")
        with Vertical(id="mode-box"):
            yield Static(f"Memory mode of {self.engine} (now: {now})", id="mode-title")
            yield OptionList(*(Option(_option(mode, text), id=mode) for mode, text in CHOICES), id="mode-options")
            yield Static(
                "A switch restarts the engine; the gateway holds its requests meanwhile, and a "
                "config that does not come up is rolled back by itself.",
                id="mode-note",
            )
        yield ConsoleFooter()

    def on_mount(self) -> None:
        options = self.query_one(OptionList)
        chosen = "auto" if self.auto else self.current
        ids = [mode for mode, _ in CHOICES]
        options.highlighted = ids.index(chosen) if chosen in ids else 0
        options.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        event.stop()
        self.dismiss(event.option.id)

    def action_pick(self, mode: str) -> None:
        self.dismiss(mode)

    def action_cancel_mode(self) -> None:
        self.dismiss(None)
