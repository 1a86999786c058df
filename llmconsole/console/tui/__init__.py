"""The Textual console: a thin client that renders the daemon's state and sends it commands.

`make_app(source)` builds it around any StateSource: `DaemonSource` for the live daemon,
`RecordedSource` for a recorded status stream (tests, benchmarks).
"""

from llmconsole.console.tui.app import ConsoleApp, make_app
from llmconsole.console.tui.sources.daemon import Command, DaemonSource, RecordedSource, StateSource

__all__ = ["Command", "ConsoleApp", "DaemonSource", "RecordedSource", "StateSource", "make_app"]
