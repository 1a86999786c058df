"""Ending asyncio tasks the supervisor and the scraper own."""

from __future__ import annotations

import asyncio
from typing import Any


async def cancel_and_wait(task: asyncio.Task[Any], retry_s: float = 0.5) -> None:
    """Cancel `task` and return once it has ended, cancelling it again while it runs on.

    Python 3.11's asyncio.wait_for drops a cancellation that arrives just as the await inside it
    completes (3.12 keeps it): the scraper's wait for an engine's first ready did, when a stop
    came right after that ready, and its loop then ran on while `stop` waited for it forever."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=retry_s)
    if not task.cancelled():
        task.exception()  # retrieved, so an error on the way out is not reported as never retrieved
