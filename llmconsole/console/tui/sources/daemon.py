"""Where the console's state comes from and where its commands go.

The app sees only `StateSource`: `poll()` returns one status (the daemon's GET /v1/status
JSON), `logs()` a piece of an engine's log, `send()` carries out a command. `DaemonSource`
talks to the live daemon; `RecordedSource` replays a recording and keeps the commands it was
sent, so tests can check exactly what the console would have asked for. Both are blocking:
the app calls them from thread workers, never from the UI thread.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from llmconsole.console.client import DaemonClient, DaemonNotRunning
from llmconsole.console.tui.sources.recording import load_recording
from llmconsole.paths import Paths

Dial = Callable[[float], DaemonClient]  # a new client of one daemon, with this timeout (seconds)
VERBS = ("start", "stop", "restart", "stop_all", "window", "rollback", "mode", "undo")


@dataclass(frozen=True)
class Command:
    verb: str  # one of VERBS
    engine: str | None = None
    spec: dict[str, Any] | None = field(default=None, compare=True, hash=False)

    def __str__(self) -> str:
        return self.verb.replace("_", " ") + (f" {self.engine}" if self.engine else "")

    @property
    def target(self) -> str:
        """The engine a verb about one engine acts on."""
        if self.engine is None:
            raise ValueError(f"{self.verb!r} needs an engine; none was named")
        return self.engine


class StateSource(Protocol):
    def poll(self) -> dict[str, Any]:
        """The daemon's status; raises DaemonNotRunning when it does not answer."""

    def logs(self, name: str, offset: int | None = None, max_bytes: int = 4096) -> dict[str, Any]:
        """{"text", "offset", "size"} as GET /v1/engines/{name}/logs returns it."""

    def send(self, command: Command) -> dict[str, Any]:
        """Carry out a command; raises DaemonError (refused) or DaemonNotRunning."""

    def history(self, name: str) -> dict[str, Any]:
        """{"engine", "versions": [...]} as GET /v1/engines/{name}/history returns it."""

    def samples(self, name: str, since_s: float = 900.0, points: int = 600) -> dict[str, Any]:
        """The stored figures and window trace, as GET /v1/engines/{name}/samples returns them."""

    def alerts(self) -> dict[str, Any]:
        """{"active", "alerts", "responses", "settings"} as GET /v1/alerts returns it."""

    def close(self) -> None: ...


def carry_out(c: DaemonClient, command: Command) -> dict[str, Any]:
    """Send `command` through `c`, the client of the daemon its engine belongs to."""
    if command.verb == "start":
        return c.start_engine(command.target, spec=command.spec)
    if command.verb == "stop":
        return c.stop_engine(command.target)
    if command.verb == "restart":
        return c.restart_engine(command.target)
    if command.verb == "rollback":
        return c.rollback(command.target, (command.spec or {}).get("to"))
    if command.verb == "undo":  # spec: {"action_id": N}, an automated response
        return c.undo_response(int((command.spec or {})["action_id"]))
    if command.verb == "mode":  # spec: {"mode": "performance|balanced|aggressive|auto"}
        return c.set_mode(command.target, (command.spec or {})["mode"])
    if command.verb == "window":  # spec carries the change: {"freeze": bool} or {"set": n}
        return c.change_window(command.target, **(command.spec or {}))
    if command.verb == "stop_all":
        stopped = []
        for e in c.status_answer().engines:
            if e.state in ("starting", "ready", "unhealthy", "crashed"):
                c.stop_engine(e.name)
                stopped.append(e.name)
        return {"stopped": stopped}
    raise ValueError(f"unknown command {command.verb!r}")


class DaemonSource:
    """The live daemon. Polls and commands use separate clients: a stop that drains for 30 s
    must not hold up the 1 Hz status poll, and each client is used from one thread at a time."""

    POLL_TIMEOUT_S = 3.0

    def __init__(self, paths: Paths):
        self.paths = paths
        self._poll = DaemonClient(paths, timeout_s=self.POLL_TIMEOUT_S)
        self._commands = DaemonClient(paths, timeout_s=180.0)
        self._command_lock = threading.Lock()
        self.session_id: int | None = None

    def poll(self) -> dict[str, Any]:
        return self._poll.status()

    def history(self, name: str) -> dict[str, Any]:
        return self._poll.history(name)

    def samples(self, name: str, since_s: float = 900.0, points: int = 600) -> dict[str, Any]:
        return self._poll.samples(name, since_s=since_s, points=points)

    def alerts(self) -> dict[str, Any]:
        return self._poll.alerts()

    def begin_session(self) -> None:
        """Record this console as an operator session; its commands carry the session's id."""
        try:
            self.session_id = self._commands.begin_session("tui")
        except Exception:  # an older daemon, or none yet: the console works all the same
            self.session_id = None
        self._commands.set_session(self.session_id)

    def logs(self, name: str, offset: int | None = None, max_bytes: int = 4096) -> dict[str, Any]:
        return self._poll.logs(name, offset=offset, max_bytes=max_bytes)

    def send(self, command: Command) -> dict[str, Any]:
        with self._command_lock:
            return carry_out(self._commands, command)

    def dialer(self, name: str) -> tuple[str, Dial]:
        """The engine's name as its daemon knows it, and a way to open a client of that daemon
        (a sweep or tune screen's own, closed when the screen goes)."""
        return name, lambda timeout_s: DaemonClient(self.paths, timeout_s=timeout_s)

    def close(self) -> None:
        if self.session_id is not None:
            try:
                self._commands.end_session(self.session_id)
            except Exception:
                pass  # the daemon went first; the session stays open-ended in the store
        self._poll.close()
        self._commands.close()


LOST = "daemon_lost"  # a frame {"daemon_lost": "reason"} replays as a daemon that went away


class RecordedSource:
    """Replays recorded frames, one per poll, then holds the last one.

    A frame is {"status": {...}, "logs": {name: text}}, or {"daemon_lost": reason}. Commands
    are kept in `commands`, in order, and answered {"accepted": true}.
    """

    def __init__(self, frames: list[dict[str, Any]], samples: dict[str, dict[str, Any]] | None = None):
        if not frames:
            raise ValueError("a recording needs at least one frame")
        self.frames = list(frames)
        self.stored = dict(samples or {})  # the daemon's stored history per engine, as recorded
        self.position = 0
        self.commands: list[Command] = []
        self._lock = threading.Lock()

    @classmethod
    def from_file(cls, path: Path | str) -> RecordedSource:
        return cls(*load_recording(Path(path)))

    @property
    def exhausted(self) -> bool:
        return self.position >= len(self.frames)

    def _frame(self) -> dict[str, Any]:
        return self.frames[min(self.position, len(self.frames)) - 1] if self.position else self.frames[0]

    def poll(self) -> dict[str, Any]:
        with self._lock:
            frame = self.frames[min(self.position, len(self.frames) - 1)]
            self.position += 1
        if LOST in frame:
            raise DaemonNotRunning(frame[LOST])
        status: dict[str, Any] = frame["status"]
        return status

    def logs(self, name: str, offset: int | None = None, max_bytes: int = 4096) -> dict[str, Any]:
        with self._lock:
            frame = self._frame()
        text = frame.get("logs", {}).get(name, "")
        data = text.encode()
        start = max(0, len(data) - max_bytes) if offset is None else min(offset, len(data))
        piece = data[start : start + max_bytes]
        return {"text": piece.decode(errors="replace"), "offset": start + len(piece), "size": len(data)}

    def history(self, name: str) -> dict[str, Any]:
        with self._lock:
            frame = self._frame()
        return {"engine": name, "versions": frame.get("history", {}).get(name, [])}

    def samples(self, name: str, since_s: float = 900.0, points: int = 600) -> dict[str, Any]:
        """The recorded answer, cut to `since_s` before its own "now" (404-like when none)."""
        answer = self.stored.get(name)
        if answer is None:
            raise KeyError(f"no stored history of {name} in this recording")
        start = float(answer["now_s"]) - since_s

        def cut(cols: dict[str, Any] | None) -> dict[str, Any] | None:
            if not cols:
                return cols
            keep = [i for i, t in enumerate(cols["at_s"]) if t >= start]
            return {k: ([v[i] for i in keep] if isinstance(v, list) else v) for k, v in cols.items()}

        return dict(answer, since_s=since_s, metrics=cut(answer.get("metrics")), window=cut(answer.get("window")))

    def alerts(self) -> dict[str, Any]:
        with self._lock:
            frame = self._frame()
        alerts: dict[str, Any] = frame.get(
            "alerts", {"active": [], "alerts": [], "responses": [], "settings": {"responses": {}}}
        )
        return alerts

    def send(self, command: Command) -> dict[str, Any]:
        with self._lock:
            self.commands.append(command)
        return {"accepted": True, "command": str(command)}

    def close(self) -> None:
        pass
