"""The footer: Textual's, compact, dropping the palette hint where it would push keys off."""

from __future__ import annotations

from textual import events
from textual.widgets import Footer

PALETTE_HINT_MIN_WIDTH = 96  # below this the keys need the room; help and the palette list ^p


class ConsoleFooter(Footer):
    def __init__(self) -> None:
        super().__init__(compact=True)

    def on_resize(self, event: events.Resize) -> None:
        wide = event.size.width >= PALETTE_HINT_MIN_WIDTH
        if self.show_command_palette != wide:
            self.show_command_palette = wide
