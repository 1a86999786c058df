"""Asking before anything that stops an engine."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from llmconsole.console.tui.keys import bindings_for
from llmconsole.console.tui.widgets.footer import ConsoleFooter


class ConfirmScreen(ModalScreen[bool]):
    """A yes/no question; "no" has the focus, so a stray Enter changes nothing."""

    BINDINGS = bindings_for("confirm")

    def __init__(self, question: str, yes_label: str = "Yes") -> None:
        super().__init__()
        self.question = question
        self.yes_label = yes_label

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm-box"):
            yield Static(self.question, id="confirm-question")
            with Horizontal(id="confirm-buttons"):
                yield Button(f"{self.yes_label} (y)", variant="error", id="confirm-yes")
                yield Button("No (n)", variant="primary", id="confirm-no")
        yield ConsoleFooter()

    def on_mount(self) -> None:
        self.query_one("#confirm-no", Button).focus()

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        event.stop()
        self.dismiss(event.button.id == "confirm-yes")
