"""Supervisors push their engines' status to the fleet's board, and reading it costs no file:
on real OS processes standing in for vLLM (tests/support/fake_engine.py)."""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
import os
from pathlib import Path

import pytest

from llmconsole.engine.fleet import Fleet
from llmconsole.engine.status import EngineState, EngineStatus
from llmconsole.paths import Paths
from tests.support.supervision import FAST, until

# Room for a start the test itself moves along, by appending to the engine's log.
SLOW_START = dataclasses.replace(FAST, start_timeout_s=60.0)


def _paths(tmp_path: Path) -> Paths:
    return Paths(data_dir=tmp_path / "data", runtime_dir=tmp_path / "run").ensure()


@pytest.fixture
def log_opens(monkeypatch):
    """Every open of an engine log (a path ending .log under the test's data dir), counted."""
    opened: list[str] = []
    real_open, real_os_open = builtins.open, os.open

    def counted(file, *args, **kwargs):
        if isinstance(file, (str, Path)) and str(file).endswith(".log"):
            opened.append(str(file))
        return real_open(file, *args, **kwargs)

    def os_counted(path, *args, **kwargs):
        if isinstance(path, (str, Path)) and str(path).endswith(".log"):
            opened.append(str(path))
        return real_os_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counted)
    monkeypatch.setattr(os, "open", os_counted)
    return opened


def test_every_change_of_state_and_every_scrape_is_published(tmp_path, fake):
    async def main():
        fleet = Fleet(_paths(tmp_path), FAST)
        await fleet.open()
        heard: list[tuple[str, EngineState | None]] = []
        fleet.board.subscribe(lambda name, st: heard.append((name, st.state if st else None)))
        try:
            e = await fleet.start("e", fake.spec(), force=True)
            await until(lambda: e.state == EngineState.READY, what="ready")
            at_ready = fleet.board.version
            await until(lambda: fleet.board.version >= at_ready + 2, what="two scrapes published")
            assert fleet.board.get("e").state == EngineState.READY and e.state == EngineState.READY
            assert fleet.board.get("e").metrics is not None  # what the scrape found is in it
            await fleet.stop("e")
            await fleet.remove("e")
        finally:
            await fleet.close()
        states = [s for _, s in heard]
        assert states[0] == EngineState.STOPPED  # the new engine, before its start
        assert EngineState.STARTING in states and EngineState.READY in states
        assert states[-3:] == [EngineState.STOPPING, EngineState.STOPPED, None]  # stopped, then removed
        assert fleet.board.get("e") is None and fleet.statuses() == []

    asyncio.run(main())


def test_reading_status_opens_no_log_file(tmp_path, fake, log_opens):
    """The API, the recorder, the exporter and the gateway read statuses many times a second:
    each read used to read the engine's log (for its kernel lines)."""

    async def main():
        fleet = Fleet(_paths(tmp_path), FAST)
        await fleet.open()
        try:
            e = await fleet.start("e", fake.spec(), force=True)
            await until(lambda: e.state == EngineState.READY, what="ready")
            log_opens.clear()
            for _ in range(50):
                statuses = fleet.statuses()
                one = e.status()
                board = fleet.board.get("e")
            assert log_opens == [], log_opens
            assert statuses[0].state == one.state == board.state == EngineState.READY
            assert one.pid == e.proc.pid
            await fleet.stop("e")
        finally:
            await fleet.close()

    asyncio.run(main())


def test_a_starting_engines_phase_is_published_as_its_log_grows(tmp_path, fake):
    """How far a start has come is read from the log by the scraper, and published: the control
    API answers it from the snapshot."""

    async def main():
        fleet = Fleet(_paths(tmp_path), SLOW_START)
        await fleet.open()
        phases: list[str] = []

        def heard(name: str, st: EngineStatus | None) -> None:
            if st is not None and st.start_phase is not None:
                phases.append(st.start_phase.name)

        fleet.board.subscribe(heard)
        fake.set("hang")  # it never listens: starting until the test is done
        try:
            e = await fleet.start("e", fake.spec(), force=True)
            await until(lambda: e.proc is not None, what="launched")
            assert fleet.status("e").start_phase.name == "launching (Python imports)"
            with open(e.log_path, "a") as f:  # what vLLM's API server logs as it loads
                f.write(f"(APIServer pid={e.proc.pid}) INFO [api_utils.py:286] non-default args: {{}}\n")
                f.write(f"(APIServer pid={e.proc.pid}) INFO Starting to load model /m...\n")
            await until(
                lambda: fleet.status("e").start_phase.name == "loading weights", timeout_s=10, what="loading weights"
            )
            assert phases[-1] == "loading weights"
            assert e.state == EngineState.STARTING
            await fleet.stop("e", drain_timeout_s=1.0)
            assert fleet.status("e").start_phase is None  # only a starting engine has one
        finally:
            await fleet.close()

    asyncio.run(main())
