"""How many engine statuses the daemon builds, and how often it opens engine logs, while idle.

In one process: the fleet, the gateway service and the recorder's 1 Hz sampler, as the daemon
runs them, around engines that are ready and idle (stand-ins for vLLM made of real OS processes,
tests/support/fake_engine.py: what is counted is the daemon's side). Prints figures; asserts
nothing. Runs against any checkout (a status build is `EngineSupervisor._build_status` where
statuses are published, `EngineSupervisor.status` where each read built one).

    PYTHONPATH=. .venv/bin/python bench/bench_status_builds.py [--seconds 20] [--engines 2]
"""

from __future__ import annotations

import argparse
import asyncio
import builtins
import tempfile
import time
from pathlib import Path
from typing import Any

from llmconsole.daemon.main import _sample_forever
from llmconsole.daemon.services.gateway_service import GatewayService
from llmconsole.db import Store
from llmconsole.db.recorder import Recorder
from llmconsole.engine import supervisor as supervisor_mod
from llmconsole.engine.fleet import Fleet
from llmconsole.engine.status import EngineState
from llmconsole.engine.supervisor import SupervisionPolicy
from llmconsole.paths import Paths
from tests.support.fake_engine import FakeEngine


async def measure(root: Path, seconds: float, engines: int) -> dict[str, Any]:
    paths = Paths(data_dir=root / "data", runtime_dir=root / "run").ensure()
    fake = FakeEngine(root / "fake")
    cls = supervisor_mod.EngineSupervisor
    name = "_build_status" if hasattr(cls, "_build_status") else "status"
    builds = [0]
    opens = [0]
    real_build = getattr(cls, name)
    real_open = builtins.open

    def counted_build(self: Any) -> Any:
        builds[0] += 1
        return real_build(self)

    def counted_open(file: Any, *args: Any, **kwargs: Any) -> Any:
        if str(file).endswith(".log"):
            opens[0] += 1
        return real_open(file, *args, **kwargs)

    fleet = Fleet(paths, SupervisionPolicy())
    await fleet.open()
    store = Store.open(paths.database)
    recorder = Recorder(store)
    gateway = GatewayService(fleet, port=0)
    await gateway.start()
    sampler = asyncio.create_task(_sample_forever(fleet, recorder))
    try:
        sups = [await fleet.start(f"e{i}", fake.spec(), force=True) for i in range(engines)]
        deadline = time.monotonic() + 60
        while not all(s.state == EngineState.READY for s in sups) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        await asyncio.sleep(2.0)  # past the first scrapes
        setattr(cls, name, counted_build)
        builtins.open = counted_open
        began = time.monotonic()
        await asyncio.sleep(seconds)
        elapsed = time.monotonic() - began
    finally:
        setattr(cls, name, real_build)
        builtins.open = real_open
        sampler.cancel()
        await gateway.close()
        await fleet.close(stop_engines=True)
        store.close()
        fake.kill_all()
    return {
        "engines": engines,
        "seconds": round(elapsed, 1),
        "counted": f"EngineSupervisor.{name}",
        "status_builds_per_s": round(builds[0] / elapsed, 1),
        "log_opens_per_s": round(opens[0] / elapsed, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--engines", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(asyncio.run(measure(Path(tmp), args.seconds, args.engines)))


if __name__ == "__main__":
    main()
