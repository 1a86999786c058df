"""What the console prints on the way out: the engines do not depend on it, and clients reach
them through the gateway."""

from __future__ import annotations

from llmconsole.console.tui.views.status import EngineView, Snapshot


def goodbye(snapshot: Snapshot | None, daemon_lost: bool = False) -> str:
    """What the console prints on the way out: the engines do not depend on it."""
    if snapshot is None:
        return "the console never reached the daemon; nothing on this host was changed"
    serving = snapshot.serving
    if not serving:
        return "no engines were running; nothing was stopped"
    seen = " (as last seen; the daemon was not answering)" if daemon_lost else ""
    parts = [_where_to_reach(e) for e in serving]
    return "engines keep serving: " + ", ".join(parts) + seen


def _where_to_reach(e: EngineView) -> str:
    """`t1 (ready, clients use http://127.0.0.1:33971/g/t1/v1; direct http://127.0.0.1:48325)`:
    clients belong on the gateway, whose window guards the engine and holds requests over its
    restarts; the engine's own port is beside it, for debugging."""
    if e.gateway_url:
        direct = f"; direct {e.url}" if e.url else ""
        return f"{e.name} ({e.state}, clients use {e.gateway_url}/v1{direct})"
    return f"{e.name} ({e.state}{', ' + e.url if e.url else ''})"
