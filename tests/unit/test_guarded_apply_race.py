"""A guarded apply onto a config that never comes up, while the daemon's own rollback (a listener of
the fleet's failed configs) moves the engine back within milliseconds: the apply's failure says
why the config failed, whichever it saw first, and the status keeps that failure after the
rollback. On real OS processes standing in for vLLM (tests/support/fake_engine.py)."""

from __future__ import annotations

import asyncio

import pytest

from llmconsole.engine.fleet import Fleet
from llmconsole.engine.modes.guarded_apply import ApplyFailed, guarded_apply
from llmconsole.engine.status import EngineState
from llmconsole.paths import Paths
from tests.support.fake_engine import CONTROL_ENV
from tests.support.supervision import FAST, until


def test_an_apply_whose_config_the_fleet_rolls_back_at_once_fails_with_the_configs_own_reason(tmp_path, fake):
    refusing = tmp_path / "refusing"
    refusing.write_text("exit")  # launches with this control file fail at once (exit code 3)

    async def main():
        fleet = Fleet(Paths(data_dir=tmp_path / "data", runtime_dir=tmp_path / "run").ensure(), FAST)
        await fleet.open()
        try:
            good = fleet.launch_spec(fake.spec())
            sup = await fleet.start("e", good)
            await until(lambda: sup.state == EngineState.READY, what="ready")

            def roll_back(name: str) -> None:  # as the daemon's automatic rollback does
                asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(fleet.restart(name, good)))

            fleet.config_failed_listeners.append(roll_back)
            bad = fleet.launch_spec(good.model_copy(update={"env": {CONTROL_ENV: str(refusing)}}))
            with pytest.raises(ApplyFailed) as failed:
                await guarded_apply(fleet, "e", bad, force=True, ready_timeout_s=30)
            assert failed.value.reason == f"config {bad.config_id} did not start: exited with code 3"
            assert failed.value.restored_config_id == good.config_id
            st = sup.status()
            assert (st.state, st.config_id) == (EngineState.READY, good.config_id)
            assert (st.failed_config_id, st.failed_reason) == (bad.config_id, "exited with code 3")
        finally:
            await fleet.close(stop_engines=True)

    asyncio.run(main())


def test_a_config_tried_again_starts_with_no_failure_of_its_own(tmp_path, fake):
    async def main():
        fleet = Fleet(Paths(data_dir=tmp_path / "data", runtime_dir=tmp_path / "run").ensure(), FAST)
        await fleet.open()
        try:
            spec = fleet.launch_spec(fake.spec())
            fake.set("exit")
            sup = await fleet.start("e", spec)
            await until(lambda: sup.state == EngineState.FAILED, what="failed")
            assert sup.status().failed_config_id == spec.config_id
            fake.set("serve")
            await fleet.restart("e", spec)
            await until(lambda: sup.state == EngineState.READY, what="ready")
            assert (sup.status().failed_config_id, sup.status().failed_reason) == (None, None)
        finally:
            await fleet.close(stop_engines=True)

    asyncio.run(main())
