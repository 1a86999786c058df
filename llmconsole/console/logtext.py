"""An engine's log as the daemon hands out pieces of it: shared by `engine logs` and the console."""

from __future__ import annotations


def from_line_start(text: str, cut: bool) -> str:
    """A log's tail less the partial line it began in, when the read began past the file's
    start (`cut`): such a read lands mid-line, and half a line reads as a wrong one."""
    if not cut:
        return text
    _partial, newline, rest = text.partition("\n")
    return rest if newline else ""
