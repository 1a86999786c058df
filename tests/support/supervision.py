"""What the unit tests of supervision share: a policy fast enough for a fake engine, and a wait
for a condition inside the test's event loop."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import time
from collections.abc import Callable, Coroutine
from typing import Any

from llmconsole.engine.supervision_policy import SupervisionPolicy

# Fast enough for a unit test; the crash window is so short that only the failure streak can
# ever find a loop.
FAST = SupervisionPolicy(
    poll_interval_s=0.05,
    health_interval_s=0.2,
    health_timeout_s=1.0,
    scrape_interval_s=0.5,
    start_timeout_s=2.0,
    backoff_initial_s=0.2,
    backoff_max_s=1.0,
    stable_after_s=60.0,
    crash_loop_count=3,
    crash_loop_window_s=0.01,
    drain_timeout_s=2.0,
)
# The same with room for a fake engine's start on a loaded host, for tests that restart daemons.
FAST_ROOMY = dataclasses.replace(FAST, start_timeout_s=5.0)


async def until(pred: Callable[[], bool], timeout_s: float = 30.0, what: str = "", interval_s: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        await asyncio.sleep(interval_s)


def run_bounded(main: Callable[[], Coroutine[Any, Any, None]], timeout_s: float = 240.0) -> None:
    """asyncio.run(main()), failed after `timeout_s` with where every task of the loop waits: a
    test of the fleet that hangs (an await nothing will finish) says where, instead of holding
    its worker for the suite's whole per-test timeout."""

    async def bounded() -> None:
        task = asyncio.ensure_future(main())
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
        if task in done:
            return task.result()
        stacks = []
        for t in asyncio.all_tasks():
            if t is asyncio.current_task():
                continue
            out = io.StringIO()
            t.print_stack(limit=8, file=out)
            stacks.append(out.getvalue())
        task.cancel()
        raise AssertionError(f"still waiting after {timeout_s:g} s; the loop's tasks:\n" + "\n".join(stacks))

    asyncio.run(bounded())
