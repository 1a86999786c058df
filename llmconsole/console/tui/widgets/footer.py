"""The footer: every key the screen has, wrapped onto as many lines as the width needs.

Textual's own footer is one line that cuts off what does not fit: on the dashboard it showed 10
of 20 keys. This one lists them all (keys of one description share an entry: `+/- window`),
greys what does nothing now and, below 100 columns, leaves those out to keep to two lines; the
help screen (?) has every key in full.
"""

from __future__ import annotations

import unicodedata

from rich.style import Style
from rich.text import Text
from textual import events
from textual.keys import REPLACED_KEYS, _get_unicode_name_from_key
from textual.screen import Screen
from textual.widgets import Static

NARROW = 100  # below this, keys that do nothing now are left out
PALETTE_MIN_WIDTH = 120


def _character(key: str) -> str | None:
    """The character a key types: Textual's own lookup misses named ones such as `plus` and
    `slash`, so an Input's keys were still offered while it had the focus."""
    if len(key) == 1:
        return key
    try:
        return unicodedata.lookup(_get_unicode_name_from_key(REPLACED_KEYS.get(key, key)))
    except KeyError:
        return None


class ConsoleFooter(Static):
    DEFAULT_CSS = """
    ConsoleFooter { dock: bottom; height: 1; max-height: 3; background: $footer-background; padding: 0 1; }
    """

    def __init__(self) -> None:
        super().__init__("")
        self._shown: tuple[object, ...] = ()

    def on_mount(self) -> None:
        self.screen.bindings_updated_signal.subscribe(self, self._bindings_changed)
        self.call_after_refresh(self.paint)

    def on_unmount(self) -> None:
        self.screen.bindings_updated_signal.unsubscribe(self)

    def _bindings_changed(self, screen: Screen[object]) -> None:
        if self.is_attached and screen is self.screen:
            self.call_after_refresh(self.paint)

    def on_resize(self, event: events.Resize) -> None:
        self.paint()

    def entries(self) -> list[tuple[str, str, bool]]:
        """(keys, description, enabled) for every binding shown, in the screen's order."""
        out: dict[str, tuple[list[str], bool]] = {}
        focused = self.screen.focused
        for key, (_node, binding, enabled, _tip) in self.screen.active_bindings.items():
            if not binding.show or (focused is not None and focused.check_consume_key(key, _character(key))):
                continue  # typing in a search box or a form field: that key types, it does not act
            keys, was = out.get(binding.description, ([], False))
            key = self.app.get_key_display(binding)
            if key not in keys:
                keys.append(key)
            out[binding.description] = (keys, was or enabled)
        return [("/".join(keys), desc, enabled) for desc, (keys, enabled) in out.items()]

    def paint(self) -> None:
        if not self.is_attached:
            return
        width = max(20, self.size.width - 2)
        entries = self.entries()
        if width < NARROW:
            entries = [e for e in entries if e[2]]
        if width >= PALETTE_MIN_WIDTH:
            entries.append(("^p", "palette", True))
        key = (tuple(entries), width, self.app.theme)
        if key == self._shown:
            return
        self._shown = key
        v = self.app.theme_variables
        key_style = Style.parse(f"bold {v.get('footer-key-foreground', v.get('accent', 'yellow'))}")
        text, line = Text(no_wrap=True), 0
        for keys, desc, enabled in entries:
            item = len(keys) + 1 + len(desc)
            if line and line + 2 + item > width:
                text.append("\n")
                line = 0
            elif line:
                text.append("  ")
                line += 2
            text.append(keys, style=key_style if enabled else "dim")
            text.append(" " + desc, style="" if enabled else "dim")
            line += item
        self.update(text)
        self.styles.height = min(3, len(text.plain.splitlines()) or 1)  # a docked auto height can lag
