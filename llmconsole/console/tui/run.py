"""`llmconsole` with no subcommand: the console, on the daemon of this host (started if need be)."""

from __future__ import annotations

import sys

from llmconsole.console.client import DaemonNotRunning, ensure_daemon
from llmconsole.console.tui.keys import KeymapError, config_path, load_keymap
from llmconsole.paths import resolve

EXIT_USAGE, EXIT_NO_DAEMON = 2, 3


def run_console() -> int:
    from llmconsole.console.tui.app import make_app
    from llmconsole.console.tui.source import DaemonSource

    try:
        keymap = load_keymap(config_path())
    except KeymapError as e:
        print(f"llmconsole: {e}", file=sys.stderr)
        return EXIT_USAGE
    paths = resolve()
    try:
        client, started = ensure_daemon(paths)
        client.close()
    except (DaemonNotRunning, ValueError) as e:
        print(f"llmconsole: {e}", file=sys.stderr)
        return EXIT_NO_DAEMON
    source = DaemonSource(paths)
    source.begin_session()
    app = make_app(source, keymap=keymap)
    try:
        farewell = app.run()
    finally:
        source.close()
    if started:
        print(f"started the llmconsole daemon for {paths.data_dir}; it keeps running")
    print(farewell or "engines keep serving; nothing was stopped")
    return 0
