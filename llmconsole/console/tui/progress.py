"""Progress as text: a bar, where the work is, the time it has taken and the time it may still take.

Used for sweeps, tunes, engine starts and mode switches alike, so every long wait reads the
same: `[██████░░░░░░] loading weights · 12 s elapsed · ~38 s left`.
"""

from __future__ import annotations

from rich.text import Text

from llmconsole.console.tui.views.run import fmt_duration


def bar(fraction: float | None, width: int) -> Text:
    """A bar `width` cells wide; unknown progress is a dotted bar."""
    width = max(1, width)
    if fraction is None:
        return Text("·" * width, style="dim")
    filled = round(min(1.0, max(0.0, fraction)) * width)
    return Text.assemble(("█" * filled, "green"), ("░" * (width - filled), "dim"))


def left_text(elapsed_s: float | None, expected_s: float | None) -> str:
    """`~38 s left`, `taking longer than the last start (50 s)`, or nothing to go on."""
    if elapsed_s is None or expected_s is None:
        return "no earlier run to estimate from"
    if elapsed_s <= expected_s:
        return f"~{fmt_duration(expected_s - elapsed_s)} left"
    return f"longer than last time ({fmt_duration(expected_s)})"


def timed(
    label: str, elapsed_s: float | None, expected_s: float | None, bar_width: int = 16, room: int | None = None
) -> Text:
    """`[bar] label · 12 s elapsed · ~38 s left` for a wait whose length is known from before. With
    `room` (cells) the bar shrinks (to 4) so that the words fit, and then the words shorten."""
    fraction = None if elapsed_s is None or not expected_s else min(0.99, elapsed_s / expected_s)
    words = f" {label} · {fmt_duration(elapsed_s)} elapsed · {left_text(elapsed_s, expected_s)}"
    if room is not None:
        if room - len(words) < 4:
            words = f" {label} · {fmt_duration(elapsed_s)} · {left_text(elapsed_s, expected_s)}"
        bar_width = max(4, min(bar_width, room - len(words)))
    return Text.assemble(bar(fraction, bar_width), words)


def counted(
    done: int, total: int | None, label: str, elapsed_s: float, left_s: float | None, bar_width: int = 16
) -> Text:
    """`[bar] 2 of 4 points · 1 min 01 s elapsed · ~20 s left` for work counted in steps."""
    fraction = None if not total else done / total
    left = "time left after the first one" if left_s is None else f"~{fmt_duration(left_s)} left"
    return Text.assemble(bar(fraction, bar_width), f" {label} · {fmt_duration(elapsed_s)} elapsed · {left}")
