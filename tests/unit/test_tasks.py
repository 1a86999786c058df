"""Ending a task that lost a cancellation (engine/tasks.py)."""

from __future__ import annotations

import asyncio
import contextlib

from llmconsole.engine.tasks import cancel_and_wait


async def _loses_one_cancel(started: asyncio.Event) -> None:
    """A loop that, like Python 3.11's wait_for when its inner await completes as the cancel
    arrives, carries on past one cancellation; a second one ends it."""
    started.set()
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        pass  # lost
    await asyncio.sleep(3600)


def test_a_task_that_loses_a_cancel_is_cancelled_again_until_it_ends():
    async def main() -> None:
        started = asyncio.Event()
        task = asyncio.create_task(_loses_one_cancel(started))
        await started.wait()
        await asyncio.wait_for(cancel_and_wait(task, retry_s=0.05), 5)
        assert task.cancelled()

    asyncio.run(main())


def test_cancelling_once_and_waiting_hangs_on_such_a_task():
    """What the supervisor and the scraper did before: one cancel, then wait for the task."""

    async def main() -> bool:
        started = asyncio.Event()
        task = asyncio.create_task(_loses_one_cancel(started))
        await started.wait()
        task.cancel()
        try:
            await asyncio.wait_for(asyncio.shield(task), 0.3)
        except TimeoutError:
            return True  # still running: a stop waiting for it would wait forever
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        return False

    assert asyncio.run(main())


def test_an_error_on_the_way_out_is_retrieved_not_raised():
    async def fails_when_cancelled() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            raise RuntimeError("cleanup failed") from None

    async def main() -> None:
        task = asyncio.create_task(fails_when_cancelled())
        await asyncio.sleep(0)
        await cancel_and_wait(task)
        assert isinstance(task.exception(), RuntimeError)

    asyncio.run(main())
