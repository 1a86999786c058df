"""The admission gate: the window is never exceeded, the queue is FIFO, bounded and timed, a
waiter that leaves takes nothing with it, and a closed gate holds arrivals."""

from __future__ import annotations

import asyncio
import random

import pytest

from llmconsole.engine.gateway.admission import Admission, QueueFull, QueueTimeout, Slot


class CheckedAdmission(Admission):
    """Checks the invariant at the one place a slot is granted."""

    violations: list

    def _take(self) -> None:
        super()._take()
        if self.in_flight > self.window:
            self.violations.append((self.in_flight, self.window))


def _hammer(gate, n_clients, knob_steps, seed=3):
    async def main():
        gate.violations = []
        rng = random.Random(seed)
        inside = 0
        seen = {"peak": 0, "over_fixed_window": 0, "over_gate_count": 0}

        async def client():
            nonlocal inside
            async with Slot(gate):
                inside += 1
                seen["peak"] = max(seen["peak"], inside)
                seen["over_gate_count"] += inside > gate.in_flight
                seen["over_fixed_window"] += knob_steps == 0 and inside > gate.window
                await asyncio.sleep(rng.uniform(0, 0.004))
                inside -= 1

        async def knob():
            for _ in range(knob_steps):
                gate.set_window(rng.randint(1, 12))
                await asyncio.sleep(0.002)

        await asyncio.gather(knob(), *(client() for _ in range(n_clients)))
        return seen

    return asyncio.run(main())


def test_hammer_never_exceeds_a_fixed_window():
    gate = CheckedAdmission(window=5, max_queue=10_000, queue_timeout_s=60)
    seen = _hammer(gate, 600, knob_steps=0)
    assert gate.violations == [] and seen["over_fixed_window"] == 0 and seen["over_gate_count"] == 0
    assert seen["peak"] == 5  # and it does fill the window
    assert (gate.in_flight, gate.queued, gate.stats().admitted_total) == (0, 0, 600)


def test_hammer_never_admits_past_a_window_that_changes_live():
    # A smaller window lets running requests finish; it never admits one while at or above it.
    gate = CheckedAdmission(window=4, max_queue=10_000, queue_timeout_s=60)
    seen = _hammer(gate, 600, knob_steps=60)
    assert gate.violations == [] and seen["over_gate_count"] == 0
    assert 1 < seen["peak"] <= 12
    assert (gate.in_flight, gate.queued, gate.stats().admitted_total) == (0, 0, 600)


def test_fifo_order():
    async def main():
        gate = Admission(window=1)
        await gate.acquire()
        order = []

        async def waiter(k):
            await gate.acquire()
            order.append(k)
            gate.release()

        tasks = [asyncio.create_task(waiter(k)) for k in range(20)]
        await asyncio.sleep(0.01)
        gate.release()
        await asyncio.gather(*tasks)
        assert order == list(range(20))

    asyncio.run(main())


def test_queue_bound_and_timeout():
    async def main():
        gate = Admission(window=1, max_queue=2, queue_timeout_s=0.2)
        await gate.acquire()
        waiters = [asyncio.create_task(gate.acquire()) for _ in range(2)]
        await asyncio.sleep(0.01)
        with pytest.raises(QueueFull, match="2 requests are already queued"):
            await gate.acquire()
        for w in waiters:
            with pytest.raises(QueueTimeout, match="no slot within 0.2 s"):
                await w
        st = gate.stats()
        assert (st.in_flight, st.queued, st.rejected_full_total, st.timed_out_total) == (1, 0, 1, 2)

    asyncio.run(main())


def test_a_cancelled_waiter_leaves_the_queue_and_takes_no_slot():
    async def main():
        gate = Admission(window=1)
        await gate.acquire()
        w1 = asyncio.create_task(gate.acquire())
        w2 = asyncio.create_task(gate.acquire())
        await asyncio.sleep(0.01)
        assert gate.queued == 2
        w1.cancel()
        with pytest.raises(asyncio.CancelledError):
            await w1
        assert gate.queued == 1
        gate.release()
        assert await w2 >= 0.0  # the slot went to the next waiter, not to the one that left
        assert gate.in_flight == 1
        gate.release()
        assert gate.in_flight == 0

    asyncio.run(main())


def test_a_closed_gate_holds_arrivals_until_it_opens():
    async def main():
        gate = Admission(window=4, queue_timeout_s=5)
        gate.set_open(False)
        waiters = [asyncio.create_task(gate.acquire()) for _ in range(3)]
        await asyncio.sleep(0.05)
        assert gate.in_flight == 0 and gate.queued == 3
        gate.set_open(True)
        queued_s = await asyncio.gather(*waiters)
        assert all(q >= 0.04 for q in queued_s)
        assert gate.in_flight == 3

    asyncio.run(main())


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        Admission(window=0)
    gate = Admission(window=2)
    with pytest.raises(ValueError):
        gate.set_window(0)
    assert gate.window == 2
    with pytest.raises(RuntimeError):
        gate.release()


def test_waiters_that_give_up_leave_at_once_and_the_rest_keep_their_order():
    """A flood of clients that go away must not linger in the count (it bounds the queue) nor
    cost later arrivals: cancels from the middle leave at once, the survivors stay FIFO."""

    async def main():
        gate = Admission(window=1, max_queue=5000, queue_timeout_s=60)
        await gate.acquire()
        order: list[int] = []

        async def wait(i: int) -> None:
            await gate.acquire()
            order.append(i)
            gate.release()

        tasks = [asyncio.create_task(wait(i)) for i in range(4000)]
        await asyncio.sleep(0.01)
        assert gate.queued == 4000
        for i, t in enumerate(tasks):
            if i % 4:
                t.cancel()
        await asyncio.sleep(0.01)
        assert gate.queued == 1000  # the 3,000 that left are gone from the count at once,
        assert len(gate._queue) == 1000  # and from the queue itself: nothing left to skip past later
        gate.release()
        await asyncio.gather(*tasks, return_exceptions=True)
        assert order == list(range(0, 4000, 4)) and gate.queued == 0 and gate.in_flight == 0

    asyncio.run(main())
