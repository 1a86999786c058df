"""The admission gate of one engine group: at most `window` requests in the engines at once, the
rest in a bounded FIFO queue with a timeout.

The gate is also what carries requests through an engine restart: while the group has no ready
engine it is closed (`set_open(False)`), nothing is admitted, and arrivals wait in the queue up
to the same bound and timeout instead of failing. A waiter that is cancelled (its client went
away) or times out leaves the queue at once; a slot granted to a waiter that was cancelled in the
same instant is handed on, so a slot is never lost.

The queue is an insertion-ordered dict of waiters keyed by arrival number: joining, leaving from
anywhere (a cancel), taking the oldest and counting are all O(1), so a flood of clients that
give up costs the gate nothing per arrival.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass


class QueueFull(Exception):
    """The queue holds `max_queue` waiters already: answer 503 with Retry-After."""


class QueueTimeout(Exception):
    """Waited `queue_timeout_s` without a slot (or without a ready engine)."""


@dataclass(frozen=True)
class AdmissionStats:
    window: int
    in_flight: int
    queued: int
    open: bool
    admitted_total: int
    rejected_full_total: int
    timed_out_total: int
    max_in_flight_seen: int


class Admission:
    def __init__(self, window: int, max_queue: int = 256, queue_timeout_s: float = 120.0) -> None:
        if window < 1 or max_queue < 0 or queue_timeout_s <= 0:
            raise ValueError("window must be >= 1, max_queue >= 0 and queue_timeout_s > 0")
        self._window = int(window)
        self.max_queue = int(max_queue)
        self.queue_timeout_s = float(queue_timeout_s)
        self._in_flight = 0
        self._open = True
        self._queue: dict[int, asyncio.Future[None]] = {}  # arrival number -> waiter, oldest first
        self._arrivals = itertools.count()
        self._admitted = 0
        self._rejected_full = 0
        self._timed_out = 0
        self._max_in_flight_seen = 0
        self._saturated = False  # full at some point since take_saturated() last asked

    # --- live settings --------------------------------------------------------------------

    @property
    def window(self) -> int:
        return self._window

    def set_window(self, window: int) -> None:
        """Takes effect at once: a larger window admits waiters now; a smaller one lets the
        requests already running finish and admits nobody until in-flight drops below it."""
        if window < 1:
            raise ValueError(f"window must be at least 1, not {window}")
        self._window = int(window)
        self._pump()

    def set_open(self, is_open: bool) -> None:
        self._open = bool(is_open)
        self._pump()

    @property
    def is_open(self) -> bool:
        return self._open

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @property
    def queued(self) -> int:
        return len(self._queue)

    def stats(self) -> AdmissionStats:
        return AdmissionStats(
            self._window,
            self._in_flight,
            self.queued,
            self._open,
            self._admitted,
            self._rejected_full,
            self._timed_out,
            self._max_in_flight_seen,
        )

    # --- slots ----------------------------------------------------------------------------

    async def acquire(self, timeout_s: float | None = None) -> float:
        """Wait for a slot; returns the seconds spent queued. Raises QueueFull or QueueTimeout;
        cancellation (a client that left) removes the waiter and takes no slot."""
        began = time.monotonic()
        if self._open and self._in_flight < self._window and not self.queued:
            self._take()
            return 0.0
        if self.queued >= self.max_queue:
            self._rejected_full += 1
            raise QueueFull(f"{self.queued} requests are already queued (the bound is {self.max_queue})")
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        key = next(self._arrivals)
        self._queue[key] = fut
        self._saturated = True
        try:
            await asyncio.wait_for(asyncio.shield(fut), self.queue_timeout_s if timeout_s is None else timeout_s)
        except (TimeoutError, asyncio.CancelledError) as e:
            if self._queue.pop(key, None) is None and fut.done() and not fut.cancelled():
                self.release()  # granted in the same instant: pass the slot on
            else:
                fut.cancel()
            if isinstance(e, TimeoutError):
                self._timed_out += 1
                raise QueueTimeout(
                    f"no slot within {self.queue_timeout_s if timeout_s is None else timeout_s:.1f} s"
                    + ("" if self._open else " (no engine of the group is ready)")
                ) from None
            raise
        return time.monotonic() - began

    def release(self) -> None:
        if self._in_flight <= 0:
            raise RuntimeError("release() without a slot")
        self._in_flight -= 1
        self._pump()

    def take_saturated(self) -> bool:
        """Whether the gate was full (a request waited, or in-flight reached the window) since
        the last call; the controller raises the window only when it was."""
        was = self._saturated or self._in_flight >= self._window or bool(self.queued)
        self._saturated = False
        return was

    def _take(self) -> None:
        self._in_flight += 1
        self._admitted += 1
        if self._in_flight >= self._window:
            self._saturated = True
        self._max_in_flight_seen = max(self._max_in_flight_seen, self._in_flight)

    def _pump(self) -> None:
        while self._open and self._in_flight < self._window and self._queue:
            key = next(iter(self._queue))  # the oldest waiter
            fut = self._queue.pop(key)
            self._take()
            fut.set_result(None)


class Slot:
    """`async with Slot(gate) as queued_s:` holds one slot for the body's duration."""

    def __init__(self, gate: Admission, timeout_s: float | None = None) -> None:
        self._gate = gate
        self._timeout_s = timeout_s

    async def __aenter__(self) -> float:
        return await self._gate.acquire(self._timeout_s)

    async def __aexit__(self, *exc: object) -> None:
        self._gate.release()
