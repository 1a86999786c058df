"""The daemon's own crash-loop alert is recorded even when the automatic rollback ends the loop
before the rules are next evaluated (it restarts the engine milliseconds after supervision gives
up, which clears `crash_looping`). On real OS processes standing in for vLLM
(tests/support/fake_engine.py) and a real store."""

from __future__ import annotations

import asyncio
import os
import signal

from llmconsole.daemon.context import DaemonContext
from llmconsole.daemon.services.response_service import ResponseService
from llmconsole.db import Store
from llmconsole.engine.alerts.rules import CRASH_LOOPING
from llmconsole.engine.fleet import Fleet
from llmconsole.engine.status import EngineState
from llmconsole.paths import Paths
from tests.support.supervision import FAST, until


def test_a_loop_the_rollback_ended_at_once_is_still_alerted_with_its_config_and_why(tmp_path, fake):
    async def main():
        fleet = Fleet(Paths(data_dir=tmp_path / "data", runtime_dir=tmp_path / "run").ensure(), FAST)
        await fleet.open()
        try:
            with Store.open(tmp_path / "llmconsole.db") as store:
                responses = ResponseService(DaemonContext(fleet, store))
                spec = fleet.launch_spec(fake.spec())
                sup = await fleet.start("e", spec)
                await until(lambda: sup.state == EngineState.READY, what="ready")
                rolled_back = asyncio.Event()

                def roll_back(name: str) -> None:  # as the daemon's automatic rollback does, at once
                    async def go() -> None:
                        fake.set("serve")
                        await fleet.restart(name, spec)
                        rolled_back.set()

                    asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(go()))

                fleet.config_failed_listeners.append(roll_back)
                fake.set("exit")  # every restart fails: three in a row are a loop
                os.kill(sup.proc.pid, signal.SIGKILL)
                await asyncio.wait_for(rolled_back.wait(), 30)
                assert sup.crash_looping is False  # what the rules read now: the loop is over

                await responses.evaluate_once()
                alerts = [a for a in store.alerts() if a.rule == CRASH_LOOPING]
                assert [(a.engine, a.severity, a.state) for a in alerts] == [("e", "critical", "firing")]
                reason = "crash-looping (3 runs in a row ended before serving 60 s): exited with code 3"
                assert (alerts[0].detail["config_id"], alerts[0].detail["reason"]) == (spec.config_id, reason)

                await responses.evaluate_once()  # the engine no longer loops: resolved
                assert [a.state for a in store.alerts() if a.rule == CRASH_LOOPING] == ["resolved"]
                await responses.close()
        finally:
            await fleet.close(stop_engines=True)

    asyncio.run(main())
