"""A restart cut short by the daemon's death, on real OS processes standing in for vLLM
(tests/support/fake_engine.py): what the state file says at each phase, and what the next
fleet makes of it; the actions a dead daemon left unfinished; the fault-injection point."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import psutil
import pytest

from llmconsole import atomic as atomic_mod
from llmconsole.daemon.fault_points import MARKER_NAME, PAUSE_ENV, pause_hook
from llmconsole.daemon.services.rollback import close_interrupted
from llmconsole.db import Store
from llmconsole.engine.fleet import Fleet
from llmconsole.engine.status import EngineState
from llmconsole.engine.supervisor import (
    PAUSE_INTENT_SAVED,
    PAUSE_NEW_STARTING,
    PAUSE_OLD_STOPPED,
    EngineBusy,
)
from llmconsole.paths import Paths
from tests.support.fake_engine import FakeEngine
from tests.support.supervision import FAST, run_bounded, until


def _paths(tmp_path: Path) -> Paths:
    return Paths(data_dir=tmp_path / "data", runtime_dir=tmp_path / "run").ensure()


def _fake_pids(fake: FakeEngine) -> list[int]:
    return [
        p.pid
        for p in psutil.process_iter(["cmdline", "status"])
        if str(fake.exe) in (p.info["cmdline"] or []) and p.info["status"] != psutil.STATUS_ZOMBIE
    ]


async def _die_at(fleet: Fleet, phase: str, restart: asyncio.Task[None]) -> dict:
    """The daemon dies at `phase`: nothing it would do after is done, nothing more is written.
    Returns the engine's entry in the state file as it was left."""
    reached = fleet.reached  # type: ignore[attr-defined]
    await asyncio.wait_for(reached[phase].wait(), 30)
    fleet._persist = lambda retry=True: True  # type: ignore[method-assign]
    for sup in fleet.engines.values():
        for task in (sup._run_task, sup._scrape_task):
            if task is not None:
                task.cancel()
    restart.cancel()
    await asyncio.gather(restart, return_exceptions=True)
    if fleet._http is not None:
        await fleet._http.close()
    return json.loads(fleet.paths.state_file.read_text())["engines"]["e"]


def _pausing_fleet(paths: Paths, phase: str) -> Fleet:
    """A fleet whose restarts stop at `phase` (as the daemon's fault-injection point does)."""
    reached = {phase: asyncio.Event()}

    async def pause(engine: str, at: str) -> None:
        if at == phase:
            reached[phase].set()
            await asyncio.Event().wait()

    fleet = Fleet(paths, FAST, pause_at=pause)
    fleet.reached = reached  # type: ignore[attr-defined]
    return fleet


@pytest.mark.parametrize("phase", [PAUSE_INTENT_SAVED, PAUSE_OLD_STOPPED, PAUSE_NEW_STARTING])
def test_a_restart_cut_short_at_any_phase_is_resumed_by_the_next_fleet(tmp_path, fake, phase):
    paths = _paths(tmp_path)

    async def main():
        fleet = _pausing_fleet(paths, phase)
        await fleet.open()
        sup = await fleet.start("e", fake.spec(max_num_seqs=8), force=True)
        await until(lambda: sup.state == EngineState.READY, what="ready")
        old_pid, old_config = sup.proc.pid, sup.config_id
        target = fleet.launch_spec(fake.spec(max_num_seqs=6))  # what the restart runs
        left = await _die_at(fleet, phase, asyncio.create_task(fleet.restart("e", target, force=True)))
        # Saved before anything stopped, and kept all along: the target, and the wish to run.
        assert left["desired"] == "running"
        assert left["change"]["spec"]["max_num_seqs"] == 6 and left["change"]["from_config_id"] == old_config

        nxt = Fleet(paths, FAST)
        done = await nxt.open()
        try:
            e = nxt.engines["e"]
            await until(lambda: e.state == EngineState.READY, what=f"ready after {done}")
            assert _fake_pids(fake) == [e.proc.pid], "exactly one engine process"
            if phase == PAUSE_INTENT_SAVED:
                assert left["process"]["pid"] == old_pid and left["process"]["config_id"] == old_config
                assert e.proc.pid == old_pid and e.config_id == old_config and e.proc.adopted
                assert nxt.found["e"] == (
                    f"engine running on config {old_config} (the old config); "
                    f"the change to {target.config_id} was not made"
                )
            elif phase == PAUSE_OLD_STOPPED:
                assert left["process"] is None
                assert e.config_id == target.config_id and not e.proc.adopted
                assert nxt.found["e"] == f"no process: started the target config {target.config_id}"
            else:
                assert left["process"]["config_id"] == target.config_id
                assert e.proc.pid == left["process"]["pid"] and e.proc.adopted
                assert e.config_id == target.config_id
                assert nxt.found["e"] == f"engine running on config {target.config_id} (the target)"
            # Done: the change is off the file once the engine serves.
            await until(lambda: json.loads(paths.state_file.read_text())["engines"]["e"]["change"] is None)
        finally:
            await nxt.close(stop_engines=True)

    run_bounded(main)


def test_a_resumed_target_that_never_comes_up_fails_as_a_fresh_start_does(tmp_path, fake):
    """No retries of a config that never came up: it is given up on and the fleet hears of it
    (the daemon's listener then rolls it back, as after a failed apply)."""
    paths = _paths(tmp_path)

    async def main():
        fleet = _pausing_fleet(paths, PAUSE_OLD_STOPPED)
        await fleet.open()
        sup = await fleet.start("e", fake.spec(), force=True)
        await until(lambda: sup.state == EngineState.READY, what="ready")
        fake.set("exit")
        await _die_at(fleet, PAUSE_OLD_STOPPED, asyncio.create_task(fleet.restart("e", fake.spec(max_num_seqs=6))))

        nxt = Fleet(paths, FAST)
        failed: list[str] = []
        nxt.config_failed_listeners.append(failed.append)
        await nxt.open()
        try:
            e = nxt.engines["e"]
            await until(lambda: e.state == EngineState.FAILED, what="failed")
            assert failed == ["e"] and e.restarts == 0
            assert "never came up" in e.status().gave_up_reason
            # The state file is written off the loop: the cleared change reaches it just after.
            await until(
                lambda: json.loads(paths.state_file.read_text())["engines"]["e"]["change"] is None,
                what="the change cleared in the state file",
            )
        finally:
            await nxt.close(stop_engines=True)

    run_bounded(main)


def test_a_restart_whose_target_cannot_be_saved_is_refused_and_the_engine_serves_on(tmp_path, fake, monkeypatch):
    paths = _paths(tmp_path)

    async def main():
        fleet = Fleet(paths, FAST)
        await fleet.open()
        sup = await fleet.start("e", fake.spec(), force=True)
        await until(lambda: sup.state == EngineState.READY, what="ready")
        pid = sup.proc.pid

        def full(path, data, mode=0o600):
            raise OSError(28, "No space left on device")

        # Every state write goes through the one atomic writer, in the fleet's writer thread.
        monkeypatch.setattr(atomic_mod, "write_atomic", full)
        try:
            with pytest.raises(EngineBusy, match="target could not be saved first"):
                await fleet.restart("e", fake.spec(max_num_seqs=6), force=True)
            assert sup.state == EngineState.READY and sup.proc.pid == pid and sup.change is None
            monkeypatch.undo()
        finally:
            await fleet.close(stop_engines=True)

    run_bounded(main)


def test_actions_left_unfinished_are_closed_as_interrupted_with_what_was_found(tmp_path):
    with Store.open(tmp_path / "db.sqlite") as store:
        restart = store.record_action("restart", engine="e", actor="ann")
        gone = store.record_action("mode", engine="old", actor="ann")
        window = store.record_action("window", engine=None, actor="ann")
        finished = store.record_action("stop", engine="e", actor="ann")
        store.update_action_outcome(finished, "done")
        lines = close_interrupted(store, {"e": "engine running on config abc (the target)"})
        assert len(lines) == 3
        assert store.action(restart).outcome == "interrupted"
        assert store.action(restart).detail["found"] == "engine running on config abc (the target)"
        assert store.action(gone).detail["found"] == "engine old is no longer known to the daemon"
        assert store.action(window).detail["found"] == "the daemon stopped before the action ended"
        assert store.action(finished).outcome == "done"
        assert store.unfinished_actions() == []


def test_the_fault_injection_point_is_inert_unless_asked_for(tmp_path):
    assert pause_hook(tmp_path, {}) is None
    with pytest.raises(ValueError, match="not a fault-injection point"):
        pause_hook(tmp_path, {PAUSE_ENV: "somewhere"})
    hook = pause_hook(tmp_path, {PAUSE_ENV: PAUSE_OLD_STOPPED})
    assert hook is not None

    async def main():
        await hook("e", PAUSE_INTENT_SAVED)  # another phase: passes straight on
        assert not (tmp_path / MARKER_NAME).exists()
        paused = asyncio.create_task(hook("e", PAUSE_OLD_STOPPED))
        await until(lambda: (tmp_path / MARKER_NAME).exists(), what="marker")
        assert (tmp_path / MARKER_NAME).read_text().split()[:2] == [PAUSE_OLD_STOPPED, "e"]
        assert not paused.done()
        paused.cancel()

    run_bounded(main)


def test_the_action_log_shows_how_each_action_ended_and_what_was_found():
    from llmconsole.console.commands.history import format_actions

    text = format_actions(
        "e",
        [
            {
                "at": 0.0,
                "actor": "ann",
                "kind": "restart",
                "from_config_id": "aaa",
                "to_config_id": "bbb",
                "outcome": "interrupted",
                "detail": {"found": "no process: started the target config bbb"},
            },
            {
                "at": 1.0,
                "actor": "bob",
                "kind": "stop",
                "from_config_id": "bbb",
                "to_config_id": None,
                "outcome": "refused",
                "detail": {"error": "busy"},
            },
        ],
    )
    lines = text.splitlines()
    assert lines[0] == "e actions:"
    assert "restart    aaa -> bbb" in lines[1] and lines[1].endswith("interrupted")
    assert lines[2] == "      found: no process: started the target config bbb"
    assert "bbb -> -" in lines[3] and lines[3].endswith("refused") and lines[4] == "      error: busy"
    assert format_actions("e", []) == "e: no recorded actions"


def test_the_action_log_says_why_an_automatic_rollback_was_taken():
    from llmconsole.console.commands.history import format_actions

    why = "config bbb failed: crash-looping (3 runs in a row ended before serving 60 s): exited with code -9"
    rollback = {
        "at": 0.0,
        "actor": "llmconsole",
        "kind": "rollback",
        "from_config_id": "bbb",
        "to_config_id": "aaa",
        "outcome": "applied",
        "detail": {"reason": why},
    }
    lines = format_actions("e", [rollback]).splitlines()
    assert "llmconsole rollback   bbb -> aaa" in lines[1] and lines[1].endswith("applied")
    assert lines[2:] == [f"      reason: {why}"]


def test_a_restart_asked_for_by_an_action_ends_it_when_the_target_serves_or_fails(tmp_path, fake):
    """Not when its process is launched: a daemon that dies while the target starts leaves the
    action unfinished, for the next daemon to close as interrupted."""
    paths = _paths(tmp_path)

    async def main():
        fleet = Fleet(paths, FAST)
        ended: list[tuple[int | None, str, str | None]] = []
        fleet.change_listeners.append(lambda sup, change, outcome, why: ended.append((change.action_id, outcome, why)))
        await fleet.open()
        try:
            sup = await fleet.start("e", fake.spec(), force=True)
            await until(lambda: sup.state == EngineState.READY, what="ready")
            fake.set("hang")
            await fleet.restart("e", fake.spec(max_num_seqs=6), force=True, action_id=7, done_outcome="applied")
            await asyncio.sleep(0.3)
            assert ended == [] and sup.state == EngineState.STARTING
            fake.set("serve")
            await fleet.stop("e")  # a stop before the target served
            assert ended == [(7, "cancelled", "stopped before the target config served")]
            await fleet.start("e", None)
            await until(lambda: sup.state == EngineState.READY, what="ready again")
            await fleet.restart("e", fake.spec(max_num_seqs=4), force=True, action_id=8)
            await until(lambda: sup.state == EngineState.READY, what="ready on the target")
            assert ended[1] == (8, "done", None)
            fake.set("exit")
            await fleet.restart("e", fake.spec(max_num_seqs=2), force=True, action_id=9)
            await until(lambda: sup.state == EngineState.FAILED, what="failed")
            assert ended[2][:2] == (9, "failed") and "never came up" in ended[2][2]
        finally:
            await fleet.close(stop_engines=True)

    run_bounded(main)
