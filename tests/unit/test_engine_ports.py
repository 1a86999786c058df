"""A port picked for an engine (none was asked for) is its address for good: kept through crashes,
stops, restarts on a new config and daemon restarts, because another host's group holds the URL.
Only when something else holds it does the engine move, and then it says so in its status, in
the state file and the daemon log. Engines are stand-in processes (tests/support/fake_engine.py)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal

import psutil

from llmconsole.console.cli import format_status
from llmconsole.engine.fleet import Fleet
from llmconsole.engine.status import EngineState
from llmconsole.paths import Paths
from llmconsole.wire.status import StatusAnswer
from tests.support.supervision import FAST_ROOMY, until


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _paths(tmp_path) -> Paths:
    return Paths(data_dir=tmp_path / "data", runtime_dir=tmp_path / "run").ensure()


def test_a_picked_port_is_kept_through_crashes_stops_restarts_and_a_new_daemon(tmp_path, fake):
    paths = _paths(tmp_path)

    async def main() -> None:
        fleet = Fleet(paths, FAST_ROOMY)
        await fleet.open()
        try:
            e = await fleet.start("e", fake.spec(), force=True)  # no port asked for: one is picked
            await until(lambda: e.state == EngineState.READY, what="ready")
            picked = e.port
            assert json.loads(paths.state_file.read_text())["engines"]["e"]["port"] == picked
            pid = e.proc.pid
            os.kill(pid, signal.SIGKILL)  # a crash, and the supervisor's restart
            await until(lambda: e.state == EngineState.READY and e.proc.pid != pid, what="restarted")
            assert e.port == picked
            await fleet.stop("e")
            await fleet.start("e", None, force=True)
            await until(lambda: e.state == EngineState.READY, what="started again")
            assert e.port == picked
            await fleet.restart("e", fake.spec(max_num_seqs=4), force=True)  # a new config, still no port
            await until(lambda: e.state == EngineState.READY and e.spec.max_num_seqs == 4, what="on the new config")
            assert e.port == picked
        except BaseException:
            await fleet.close(stop_engines=True)  # a failure here leaves no engine serving on
            raise
        await fleet.close()  # the daemon goes; the engine keeps serving
        dead = e.proc.pid
        os.kill(dead, signal.SIGKILL)  # and dies while no daemon watches
        await until(lambda: not _alive(dead), what="the engine gone, its port with it")
        again = Fleet(paths, FAST_ROOMY)
        await again.open()  # the next daemon relaunches it
        try:
            e2 = again.engines["e"]
            await until(lambda: e2.state == EngineState.READY, what="relaunched by the next daemon")
            assert e2.port == picked and e2.status().port_note is None
        finally:
            await again.close(stop_engines=True)

    asyncio.run(main())


def test_a_picked_port_taken_meanwhile_moves_and_says_so_everywhere(tmp_path, fake, caplog):
    paths = _paths(tmp_path)
    strangers = []

    async def main() -> None:
        fleet = Fleet(paths, FAST_ROOMY)
        await fleet.open()
        try:
            e = await fleet.start("e", fake.spec(), force=True)
            await until(lambda: e.state == EngineState.READY, what="ready")
            old = e.port
            assert e.status().port_note is None
            await fleet.stop("e")
            strangers.append(await asyncio.to_thread(fake.stranger, old))
            await fleet.start("e", None, force=True)
            await until(lambda: e.state == EngineState.READY, what="ready on another port")
            st = e.status()
            assert st.port != old and st.url.endswith(f":{st.port}")  # this host's groups follow the URL
            note = st.port_note
            assert note is not None and f"port {old}" in note and f"moved to {st.port}" in note
            assert "another host" in note and "group set" in note
            saved = json.loads(paths.state_file.read_text())["engines"]["e"]
            assert saved["port"] == st.port and saved["port_note"] == note
            assert f"e: {note}" in format_status(StatusAnswer.model_validate({"engines": [st.to_json()]}))
            # A port the operator gives settles it.
            await fleet.restart("e", fake.spec(port=st.port), force=True)
            await until(lambda: e.state == EngineState.READY, what="ready on the port given")
            assert e.status().port_note is None
        finally:
            await fleet.close(stop_engines=True)

    with caplog.at_level(logging.ERROR):
        try:
            asyncio.run(main())
        finally:
            for s in strangers:
                s.kill()
                s.wait()
    assert any("moved to" in r.getMessage() and r.levelno >= logging.ERROR for r in caplog.records)
