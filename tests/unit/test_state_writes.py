"""The engine state file is written off the event loop (the loop also relays the gateway's first
tokens), yet an operator's action is reported done only once its write is durable, and the
listeners hear of a change only once the file holds it. Engines are stand-in processes
(tests/support/fake_engine.py); the disk is made slow by a patched fsync."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time

from llmconsole.engine.fleet import Fleet
from llmconsole.engine.status import EngineState, EngineStatus
from llmconsole.paths import Paths
from tests.support.supervision import FAST_ROOMY, until

SLOW_FSYNC_S = 0.05  # a disk busy with something else


def _paths(tmp_path) -> Paths:
    return Paths(data_dir=tmp_path / "data", runtime_dir=tmp_path / "run").ensure()


def _on_disk(paths: Paths) -> dict:
    return json.loads(paths.state_file.read_text())["engines"]["e"]


def test_state_writes_leave_the_loop_free_and_an_action_returns_once_durable(tmp_path, fake, monkeypatch):
    paths = _paths(tmp_path)
    real_fsync = os.fsync
    loop_thread = threading.get_ident()
    ticks = 0  # the heartbeat's, on the event loop
    measuring = False
    fsyncs: list[tuple[bool, int]] = []  # (off the loop's thread, heartbeat ticks while it ran)

    def slow_fsync(fd: int) -> None:
        before = ticks
        time.sleep(SLOW_FSYNC_S)
        real_fsync(fd)
        if measuring:
            fsyncs.append((threading.get_ident() != loop_thread, ticks - before))

    async def heartbeat() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.002)

    async def main() -> None:
        nonlocal measuring
        fleet = Fleet(paths, FAST_ROOMY)
        await fleet.open()
        beat = asyncio.create_task(heartbeat())
        monkeypatch.setattr(os, "fsync", slow_fsync)
        measuring = True
        try:
            e = await fleet.start("e", fake.spec(), force=True)
            assert _on_disk(paths)["desired"] == "running"  # on disk when the start returns
            await until(lambda: e.state == EngineState.READY, what="ready")
            await fleet.stop("e")
            assert _on_disk(paths)["desired"] == "stopped" and _on_disk(paths)["process"] is None
        finally:
            measuring = False
            beat.cancel()
            await fleet.close(stop_engines=True)

    asyncio.run(main())
    assert fsyncs, "the state file was written"
    assert all(off_loop for off_loop, _ in fsyncs), "an fsync ran on the event loop's thread"
    # The loop went on ticking through every one of them.
    assert all(n > 0 for _, n in fsyncs), fsyncs


def test_listeners_hear_of_a_change_once_the_state_file_holds_it(tmp_path, fake, monkeypatch):
    paths = _paths(tmp_path)
    heard: list[tuple[EngineStatus, dict]] = []
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        time.sleep(SLOW_FSYNC_S)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)

    async def main() -> None:
        fleet = Fleet(paths, FAST_ROOMY)
        fleet.status_listeners.append(lambda st: heard.append((st, _on_disk(paths))))
        await fleet.open()
        try:
            e = await fleet.start("e", fake.spec(), force=True)
            await until(lambda: e.state == EngineState.READY, what="ready")
            first = e.proc.pid
            os.kill(first, 9)
            await until(lambda: e.state == EngineState.READY and e.proc.pid != first, what="restarted")
            await until(lambda: heard and heard[-1][0].state == EngineState.READY, what="the listener told")
        finally:
            await fleet.close(stop_engines=True)

    asyncio.run(main())
    running = [
        (st, d) for st, d in heard if st.pid is not None and st.state in (EngineState.STARTING, EngineState.READY)
    ]
    assert len({st.pid for st, _ in running}) == 2  # the first run and the restart
    for st, disk in running:  # whoever heard of a pid could already find it in the file
        assert disk["process"] is not None and disk["process"]["pid"] == st.pid, (st.state, st.pid, disk["process"])


def test_gateway_settings_are_written_off_the_loop_and_saved_waits_for_them(tmp_path, monkeypatch):
    from llmconsole.daemon.services.gateway_service import GatewayService

    monkeypatch.delenv("LLMCONSOLE_GATEWAY_PORT", raising=False)
    paths = _paths(tmp_path)
    real_fsync = os.fsync
    loop_thread = threading.get_ident()
    ticks = 0
    fsyncs: list[tuple[bool, int]] = []

    def slow_fsync(fd: int) -> None:
        before = ticks
        time.sleep(SLOW_FSYNC_S)
        real_fsync(fd)
        fsyncs.append((threading.get_ident() != loop_thread, ticks - before))

    async def heartbeat() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0.002)

    async def main() -> None:
        svc = GatewayService(Fleet(paths, FAST_ROOMY), port=0)
        beat = asyncio.create_task(heartbeat())
        monkeypatch.setattr(os, "fsync", slow_fsync)
        try:
            svc._save()
            await svc.saved()
            assert json.loads((paths.data_dir / "gateway.json").read_text())["groups"] == {}
        finally:
            beat.cancel()

    asyncio.run(main())
    assert fsyncs and all(off_loop and n > 0 for off_loop, n in fsyncs), fsyncs
