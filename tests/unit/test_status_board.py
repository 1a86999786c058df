"""The status board: the latest snapshot per engine, pushed by supervisors, read by everyone else."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from llmconsole.engine.status import EngineState, EngineStatus
from llmconsole.engine.status_board import StatusBoard


def _status(name: str = "e", state: EngineState = EngineState.READY, **kw) -> EngineStatus:
    return EngineStatus(name=name, state=state, config_id="c1", model="m", served_model_name="m", device="cpu", **kw)


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_publication_is_the_engines_latest_and_moves_the_version():
    board = StatusBoard()
    assert board.get("e") is None and board.version == 0
    first = _status(state=EngineState.STARTING)
    assert board.publish(first) == 1
    assert board.get("e") == first
    board.publish(_status(state=EngineState.READY))
    board.publish(_status("f"))
    assert board.version == 3
    assert board.get("e").state == EngineState.READY
    assert [s.name for s in board.statuses()] == ["e", "f"]


def test_listeners_hear_every_publication_and_withdrawal_until_unsubscribed():
    board = StatusBoard()
    heard: list[tuple[str, EngineState | None]] = []
    unsubscribe = board.subscribe(lambda name, st: heard.append((name, st.state if st else None)))
    board.publish(_status(state=EngineState.STARTING))
    board.publish(_status(state=EngineState.READY))
    board.withdraw("e")
    board.withdraw("e")  # no longer there: nothing to say
    unsubscribe()
    board.publish(_status())
    assert heard == [("e", EngineState.STARTING), ("e", EngineState.READY), ("e", None)]
    assert board.get("e") is not None


def test_a_listener_that_raises_does_not_stop_the_others_or_the_publisher(caplog):
    board = StatusBoard()
    before: list[str] = []
    after: list[str] = []
    board.subscribe(lambda name, st: before.append(name))

    def broken(name: str, st: EngineStatus | None) -> None:
        raise RuntimeError("a reader's bug")

    board.subscribe(broken)
    board.subscribe(lambda name, st: after.append(name))
    assert board.publish(_status()) == 1  # the publisher is not raised at
    board.publish(_status("f"))
    assert before == ["e", "f"] and after == ["e", "f"]
    assert "a status listener failed on e" in caplog.text


def test_snapshots_are_immutable():
    board = StatusBoard()
    board.publish(_status())
    st = board.get("e")
    with pytest.raises(dataclasses.FrozenInstanceError):
        st.state = EngineState.CRASHED  # type: ignore[misc]
    assert board.get("e").state == EngineState.READY


def test_a_read_ages_the_clock_driven_fields_and_nothing_else():
    clock = _Clock()
    board = StatusBoard(clock=clock)
    board.publish(_status(uptime_s=10.0, restarts=2))
    board.publish(_status("f", EngineState.CRASHED, next_restart_in_s=4.0))
    clock.now += 3.0
    assert board.get("e").uptime_s == pytest.approx(13.0)
    assert board.get("e").restarts == 2
    assert board.get("f").next_restart_in_s == pytest.approx(1.0)
    clock.now += 10.0
    assert board.get("f").next_restart_in_s == 0.0  # due: never negative
    assert board.get("f").uptime_s is None


def test_a_reader_can_wait_for_the_next_change():
    async def main() -> None:
        board = StatusBoard()
        seen = board.version
        waiter = asyncio.create_task(board.changed(seen))
        await asyncio.sleep(0)
        assert not waiter.done()
        board.publish(_status())
        assert await asyncio.wait_for(waiter, 5) == seen + 1
        assert await board.changed(0) == 1  # already past: at once

    asyncio.run(main())
