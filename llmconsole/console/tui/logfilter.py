"""Which log lines the log panes show: quiet by default, everything on request, and a search.

An engine's log is mostly access lines: the daemon's own polls (GET /metrics and GET /health from
127.0.0.1, twice a second) and one line per client request. Quiet leaves both out and keeps the
engine's own lines (start-up, warnings, errors, vLLM's periodic throughput lines); full shows
every line. A search keeps the lines that contain its text (any case) and marks the matches.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from rich.text import Text

# uvicorn's access line: `INFO:     127.0.0.1:59624 - "POST /v1/completions HTTP/1.1" 200 OK`
_ACCESS = re.compile(r'(?P<host>\d{1,3}(?:\.\d{1,3}){3}|\[[0-9a-f:]+\]):\d+ - "(?P<method>[A-Z]+) (?P<path>\S+) HTTP/')
_POLLED = ("/metrics", "/health")
_LOCAL = ("127.0.0.1", "[::1]")


def kind(line: str) -> str:
    """`poll` (the daemon's own GET /metrics or /health), `access` (a client's request) or `own`."""
    m = _ACCESS.search(line)
    if m is None:
        return "own"
    path = m["path"].split("?", 1)[0]
    if m["method"] == "GET" and path in _POLLED and m["host"] in _LOCAL:
        return "poll"
    return "access"


@dataclass(frozen=True)
class LogView:
    full: bool = False  # every line, or the engine's own only
    search: str = ""  # keep lines containing this (any case)

    def keep(self, line: str) -> bool:
        if not self.full and kind(line) != "own":
            return False
        return not self.search or self.search.lower() in line.lower()

    def lines(self, lines: Iterable[str]) -> tuple[list[str], int]:
        """The lines shown, and how many the quiet view left out."""
        shown, hidden = [], 0
        for line in lines:
            if self.keep(line):
                shown.append(line)
            elif not self.full and kind(line) != "own":
                hidden += 1
        return shown, hidden

    def describe(self, hidden: int) -> str:
        """What the pane's title says about the view: `quiet: 180 request lines hidden (v: all)`."""
        parts = ["full log" if self.full else f"quiet: {hidden} request/poll line(s) hidden (v shows them)"]
        if self.search:
            parts.append(f"search {self.search!r} (esc clears)")
        return " · ".join(parts)

    def mark(self, line: str) -> Text:
        """The line with the search's matches highlighted."""
        text = Text(line)
        if self.search:
            text.highlight_regex(re.compile(re.escape(self.search), re.IGNORECASE), "black on yellow")
        return text
