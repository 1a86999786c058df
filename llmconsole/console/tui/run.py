"""`llmconsole` with no subcommand: the console, on the daemon of this host (started if need be),
or over several hosts' daemons (`--host` given, or `console --all-hosts`)."""

from __future__ import annotations

import sys

from llmconsole.console.client import DaemonNotRunning, ensure_daemon
from llmconsole.console.hosts import Host
from llmconsole.console.tui.keys import KeymapError, config_path, load_keymap
from llmconsole.paths import resolve

EXIT_USAGE, EXIT_NO_DAEMON = 2, 3


def _keymap() -> dict[str, str] | None:
    try:
        return load_keymap(config_path())
    except KeymapError as e:
        print(f"llmconsole: {e}", file=sys.stderr)
        return None


def run_console() -> int:
    from llmconsole.console.tui.app import make_app
    from llmconsole.console.tui.sources.daemon import DaemonSource

    keymap = _keymap()
    if keymap is None:
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


def run_fleet_console(hosts: list[Host]) -> int:
    """One console over `hosts` (each once, in the order given). No daemon is started to look:
    a host without one says so, and an engine started there from the console starts it."""
    from llmconsole.console.tui.app import make_app
    from llmconsole.console.tui.sources.hosts import HostsSource

    keymap = _keymap()
    if keymap is None:
        return EXIT_USAGE
    unique = list({h.name: h for h in hosts}.values())
    source = HostsSource(unique)
    app = make_app(source, keymap=keymap, fleet=True)
    try:
        farewell = app.run()
    finally:
        source.close()
    print(farewell or "engines keep serving; nothing was stopped")
    return 0
