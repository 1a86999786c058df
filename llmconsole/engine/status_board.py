"""The latest status of every engine, as its supervisor published it: the one place readers look.

Supervisors push an immutable `EngineStatus` whenever something in it changes (a change of
state, a scrape, a line of the engine's log that says something new); the daemon's API, its
recorder, its /metrics exporter and its gateway read the board instead of asking each
supervisor to build a status. A read never builds anything and never touches a file: it is a
dictionary lookup. The version counter moves with every publication, so a reader can tell
whether anything changed since it last looked, or wait for the next change (`changed`).

Two fields run with the clock between publications (`uptime_s`, `next_restart_in_s`): a read
ages the published snapshot by the time since it was published (EngineStatus.aged), so nothing
has to be published every second only to keep them current.

Listeners hear of every publication and withdrawal on the event loop that publishes: `(name,
status)`, with status None when the engine left. A listener that fails is logged and skipped;
the others, and the supervisor that published, go on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from llmconsole.engine.status import EngineStatus

log = logging.getLogger(__name__)

# (engine name, its new status; None: the engine left the board)
StatusListener = Callable[[str, EngineStatus | None], None]


@dataclass(frozen=True)
class _Published:
    status: EngineStatus
    at_mono_s: float


class StatusBoard:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._latest: dict[str, _Published] = {}
        self._listeners: list[StatusListener] = []
        self._waiters: list[asyncio.Future[None]] = []
        self.version = 0

    # --- writers ----------------------------------------------------------------------------

    def publish(self, status: EngineStatus) -> int:
        """`status` is now its engine's latest; every listener hears of it. Returns the version."""
        self._latest[status.name] = _Published(status, self._clock())
        self._moved(status.name, status)
        return self.version

    def withdraw(self, name: str) -> None:
        """The engine left the fleet: its status goes, and the listeners hear `(name, None)`."""
        if self._latest.pop(name, None) is not None:
            self._moved(name, None)

    def _moved(self, name: str, status: EngineStatus | None) -> None:
        self.version += 1
        for listener in list(self._listeners):
            try:
                listener(name, status)
            except Exception:  # a reader's fault must never stop the supervisor that published
                log.exception("a status listener failed on %s", name)
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    # --- readers ----------------------------------------------------------------------------

    def get(self, name: str) -> EngineStatus | None:
        """The engine's latest status, its clock-driven fields current; None for an unknown one."""
        p = self._latest.get(name)
        return None if p is None else p.status.aged(self._clock() - p.at_mono_s)

    def statuses(self) -> list[EngineStatus]:
        """Every engine's latest status, in the order they were first published."""
        now = self._clock()
        return [p.status.aged(now - p.at_mono_s) for p in self._latest.values()]

    def subscribe(self, listener: StatusListener) -> Callable[[], None]:
        """Hear of every publication from now on; returns what unsubscribes."""
        self._listeners.append(listener)
        return lambda: self.unsubscribe(listener)

    def unsubscribe(self, listener: StatusListener) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    async def changed(self, since_version: int) -> int:
        """Wait until the board moves past `since_version`; returns the version then."""
        while self.version <= since_version:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
        return self.version
