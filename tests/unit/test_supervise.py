"""Supervision under faults, on real OS processes standing in for vLLM (tests/support/fake_engine.py):
the failure count behind crash-loop detection, starts that hang, a stranger on an engine's port,
a state file that cannot be written, and stored specs that no longer validate."""

from __future__ import annotations

import asyncio
import errno
import json
import os
import signal
import socket
import time
from dataclasses import replace
from pathlib import Path

import aiohttp
import psutil
import pytest
from pydantic import ValidationError

from llmconsole.engine import fleet as fleet_mod
from llmconsole.engine.fleet import Fleet
from llmconsole.engine.status import EngineState
from llmconsole.engine.supervisor import (
    EngineSupervisor,
    FailureCounter,
    PortInUse,
    SupervisionPolicy,
    free_port,
    stored_config_id,
)
from llmconsole.paths import Paths
from tests.support.fake_engine import FakeEngine
from tests.support.supervision import FAST, until


def _paths(tmp_path: Path) -> Paths:
    return Paths(data_dir=tmp_path / "data", runtime_dir=tmp_path / "run").ensure()


def _session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


async def _ready(tmp_path: Path, fake: FakeEngine, http: aiohttp.ClientSession) -> EngineSupervisor:
    """A supervisor of the fake engine, started and ready."""
    sup = EngineSupervisor("e", fake.spec(), tmp_path / "e.log", http, FAST)
    await sup.start()
    await until(lambda: sup.state == EngineState.READY, what="ready")
    return sup


# --- the counting rule --------------------------------------------------------------------------


def test_failed_runs_in_a_row_are_a_loop_whatever_each_lasted():
    c = FailureCounter(
        SupervisionPolicy(crash_loop_count=3, crash_loop_window_s=300.0, backoff_initial_s=1.0, backoff_max_s=30.0)
    )
    # A model that loads for 20 minutes and fails: three such runs span an hour, not 300 s.
    first = c.record(now=0.0, stable=False)
    assert (first.give_up, first.delay_s, c.consecutive) == (None, 1.0, 1)
    second = c.record(now=1200.0, stable=False)
    assert (second.give_up, second.delay_s, c.consecutive) == (None, 2.0, 2)
    third = c.record(now=2400.0, stable=False)
    assert third.give_up is not None and "3 runs in a row" in third.give_up


def test_a_stable_run_ends_the_streak_but_fast_crashes_still_loop():
    p = SupervisionPolicy(crash_loop_count=3, crash_loop_window_s=300.0, backoff_initial_s=1.0, backoff_max_s=4.0)
    c = FailureCounter(p)
    c.record(now=0.0, stable=False)
    c.record(now=1000.0, stable=False)
    d = c.record(now=2000.0, stable=True)  # served long enough: its crash starts a new streak
    assert (d.give_up, d.delay_s, c.consecutive) == (None, 1.0, 1)
    # Stable runs that crash three times within the window are a loop too.
    c = FailureCounter(p)
    assert c.record(now=0.0, stable=True).give_up is None
    assert c.record(now=100.0, stable=True).give_up is None
    d = c.record(now=200.0, stable=True)
    assert d.give_up is not None and "3 crashes in 300 s" in d.give_up
    # The backoff doubles with the streak, up to its cap.
    c = FailureCounter(replace(p, crash_loop_count=10))
    assert [c.record(now=10_000.0 * i, stable=False).delay_s for i in range(5)] == [1.0, 2.0, 4.0, 4.0, 4.0]


# --- restarts that hang, and giving up ----------------------------------------------------------


def test_restarts_that_hang_past_the_start_timeout_end_in_a_visible_give_up(tmp_path, fake):
    async def main():
        async with _session() as http:
            sup = await _ready(tmp_path, fake, http)
            first_pid = sup.proc.pid
            fake.set("hang")  # every later launch loads forever
            os.kill(first_pid, signal.SIGKILL)
            await until(lambda: sup.state == EngineState.CRASHED, what="crashed")
            st = sup.status()
            assert st.consecutive_failures == 1 and st.backoff_s == pytest.approx(0.2)
            assert st.next_restart_in_s is not None and st.gave_up_reason is None
            await until(lambda: sup.state == EngineState.FAILED, timeout_s=30, what="gave up")
            st = sup.status()
            assert st.crash_looping and st.consecutive_failures == 3 and st.restarts == 2
            assert "3 runs in a row" in st.gave_up_reason
            assert "not ready within 2 s" in st.last_error
            assert st.pid is None and st.backoff_s is None
            hung = [p.pid for p in psutil.process_iter(["cmdline"]) if str(fake.exe) in (p.info["cmdline"] or [])]
            assert not [p for p in hung if _alive(p)], "a start that timed out is killed"
            await sup.stop()

    asyncio.run(main())


def test_an_engine_that_dies_while_its_health_is_asked_is_crashed_never_unhealthy(tmp_path, fake):
    """A kill closes the engine's port before its exit is seen: the /health asked in between
    fails. That is a crash, not a moment of "unhealthy" (which would also count towards a kill of
    an engine that is already gone)."""

    async def main():
        async with _session() as http:
            sup = await _ready(tmp_path, fake, http)
            pid = sup.proc.pid
            seen: list[EngineState] = []
            set_state = sup._set_state

            def record(state: EngineState) -> None:
                seen.append(state)
                set_state(state)

            async def dies_while_asked() -> bool:
                os.kill(pid, signal.SIGKILL)
                await until(lambda: not _alive(pid), timeout_s=5, what="the engine gone")
                del sup._check_health  # later checks are the real ones
                return False

            sup._set_state = record
            sup._check_health = dies_while_asked
            await until(lambda: EngineState.CRASHED in seen, timeout_s=10, what="crashed")
            assert EngineState.UNHEALTHY not in seen, seen
            assert "exited with code -9" in sup.last_error
            await sup.stop()

    asyncio.run(main())


# --- whoever answers on the port ----------------------------------------------------------------


def test_a_stranger_answering_on_the_port_is_not_the_engine(tmp_path, fake):
    port = free_port()
    stranger = fake.stranger(port)
    try:

        async def main():
            async with _session() as http:
                fake.set("hang")  # our engine never listens: only the stranger answers /health
                sup = EngineSupervisor("e", fake.spec(port=port), tmp_path / "e.log", http, FAST)
                await sup.start()
                seen = set()
                deadline = time.monotonic() + 8
                while sup.state != EngineState.FAILED and time.monotonic() < deadline:
                    seen.add(sup.state)
                    await asyncio.sleep(0.05)
                assert EngineState.READY not in seen
                assert sup.state == EngineState.FAILED
                assert f"answered by pid {stranger.pid}" in sup.last_error
                assert "not ready within" in sup.last_error

        asyncio.run(main())
    finally:
        stranger.kill()
        stranger.wait()


def test_a_listener_on_another_address_with_the_engines_port_number_is_no_stranger(tmp_path, fake):
    """A user who binds 127.0.0.2:PORT beside an engine on 127.0.0.1:PORT reaches none of its
    clients: the engine stays healthy (it was counted as a stranger, and the engine was killed,
    crash-looped and rolled back)."""

    async def main():
        async with _session() as http:
            sup = await _ready(tmp_path, fake, http)
            beside = socket.socket()
            try:
                beside.bind(("127.0.0.2", sup.port))
                beside.listen()
                answers: list[bool] = []
                asked = sup._answered_by_engine

                async def counted() -> bool:
                    answers.append(await asked())
                    return answers[-1]

                sup._answered_by_engine = counted
                await until(lambda: len(answers) >= 3, what="three health checks with the listener beside")
                assert all(answers) and sup.state == EngineState.READY
                assert sup._foreign_note is None
            finally:
                beside.close()
                await sup.stop()

    asyncio.run(main())


def test_a_port_in_use_is_refused_at_start_and_changes_nothing(tmp_path, fake):
    port = free_port()

    async def main():
        fleet = Fleet(_paths(tmp_path), FAST)
        await fleet.open()
        try:
            a = await fleet.start("a", fake.spec(port=port), force=True)
            await until(lambda: a.state == EngineState.READY, what="a ready")
            before = (a.proc.pid, a.status().config_id, a.state)
            with pytest.raises(PortInUse, match=f"port {port} is engine a's"):
                await fleet.start("b", fake.spec(model="other/model", port=port), force=True)
            assert "b" not in fleet.engines
            assert (a.proc.pid, a.status().config_id, a.state) == before
            saved = json.loads(fleet.paths.state_file.read_text())["engines"]
            assert list(saved) == ["a"]
            # Anything else listening there is refused the same way, naming it.
            other = free_port()
            stranger = fake.stranger(other)
            try:
                with pytest.raises(PortInUse, match=f"port {other} is already in use .* pid {stranger.pid}"):
                    await fleet.start("c", fake.spec(port=other), force=True)
                assert "c" not in fleet.engines
            finally:
                stranger.kill()
                stranger.wait()
            # A restart on its own port is no conflict.
            await fleet.restart("a")
            await until(lambda: a.state == EngineState.READY, what="a ready again")
        finally:
            await fleet.close(stop_engines=True)

    asyncio.run(main())


def test_a_port_picked_before_and_taken_meanwhile_is_picked_anew(tmp_path, fake):
    strangers = []

    async def main():
        fleet = Fleet(_paths(tmp_path), replace(FAST, backoff_initial_s=3.0))
        await fleet.open()
        try:
            e = await fleet.start("e", fake.spec(), force=True)  # no port asked for: one is picked
            await until(lambda: e.state == EngineState.READY, what="ready")
            first = e.port
            # It crashes, and while it waits to be restarted someone takes its port.
            os.kill(e.proc.pid, signal.SIGKILL)
            await until(lambda: e.state == EngineState.CRASHED, what="crashed")
            strangers.append(await asyncio.to_thread(fake.stranger, first))
            await until(lambda: e.state == EngineState.READY and e.port != first, what="ready on another port")
            assert e.restarts == 1 and e.failures.consecutive == 1
            # Stopped, and its port taken again: a start picks another rather than refusing.
            await fleet.stop("e")
            second = e.port
            strangers.append(await asyncio.to_thread(fake.stranger, second))
            await fleet.start("e", None, force=True)
            await until(lambda: e.state == EngineState.READY, what="ready after the start")
            assert e.port not in (first, second)
        finally:
            await fleet.close(stop_engines=True)

    try:
        asyncio.run(main())
    finally:
        for s in strangers:
            s.kill()
            s.wait()


# --- a state file that cannot be written --------------------------------------------------------


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EMFILE])
def test_a_failed_state_write_keeps_the_engine_supervised_and_is_retried(tmp_path, fake, monkeypatch, caplog, err):
    paths = _paths(tmp_path)
    failing = {"on": True}
    real_replace = os.replace

    def replace_or_fail(src, dst, *a, **kw):
        if failing["on"] and Path(dst) == paths.state_file:
            raise OSError(err, os.strerror(err))
        return real_replace(src, dst, *a, **kw)

    monkeypatch.setattr(os, "replace", replace_or_fail)

    async def main():
        fleet = Fleet(paths, FAST)
        fleet._save_retry_s = (0.1, 0.2)
        await fleet.open()
        try:
            sup = await fleet.start("e", fake.spec(), force=True)  # the write fails right after the launch
            await until(lambda: sup.state == EngineState.READY, what="ready while unsaved")
            st = sup.status()
            assert st.pid is not None and _alive(st.pid)
            assert st.record_error is not None and "not saved" in st.record_error
            assert os.strerror(err) in st.record_error
            assert not paths.state_file.exists()
            # Supervision goes on: a crash is still seen and the engine restarted.
            os.kill(st.pid, signal.SIGKILL)
            await until(lambda: sup.state == EngineState.READY and sup.proc.pid != st.pid, what="restarted")
            failing["on"] = False
            await until(lambda: fleet.record_error is None, timeout_s=5, what="saved by the retry")
            saved = json.loads(paths.state_file.read_text())["engines"]["e"]
            assert saved["process"]["pid"] == sup.proc.pid
            assert sup.status().record_error is None
        finally:
            await fleet.close(stop_engines=True)

    asyncio.run(main())
    assert any("not saved" in r.getMessage() for r in caplog.records)
    assert any("saved again" in r.getMessage() for r in caplog.records)


# --- stored specs that no longer validate -------------------------------------------------------


def _model_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    return path


def test_an_invalid_stored_spec_is_listed_kept_and_starts_once_valid_again(tmp_path, fake):
    paths = _paths(tmp_path)
    model = _model_dir(tmp_path / "models" / "m")
    moved = tmp_path / "models" / "moved"

    async def main():
        fleet = Fleet(paths, FAST)
        await fleet.open()
        sup = await fleet.start("e", fake.spec(model=str(model), api_key="sk-kept"), force=True)
        await until(lambda: sup.state == EngineState.READY, what="ready")
        config_id = sup.config_id
        await fleet.close(stop_engines=True)
        before = json.loads(paths.state_file.read_text())["engines"]["e"]
        # A newer version's field beside it, and the model directory moved away.
        data = json.loads(paths.state_file.read_text())
        data["engines"]["new"] = dict(before, spec=dict(before["spec"], a_field_from_a_newer_version=1))
        paths.state_file.write_text(json.dumps(data))
        model.rename(moved)

        fleet = Fleet(paths, FAST)
        done = await fleet.open()
        try:
            assert any("e: stored spec invalid" in line for line in done)
            e, new = fleet.engines["e"], fleet.engines["new"]
            st = e.status()
            assert st.state == EngineState.INVALID and st.config_id == config_id
            assert f"model directory {model} has no config.json" in st.last_error
            assert "a_field_from_a_newer_version: Extra inputs are not permitted" in new.status().last_error
            saved = json.loads(paths.state_file.read_text())["engines"]
            assert saved["e"]["spec"] == before["spec"] and saved["e"]["spec"]["api_key"] == "sk-kept"
            assert saved["new"]["spec"]["a_field_from_a_newer_version"] == 1
            assert saved["e"]["state"] == "invalid"
            # Still invalid: refused, nothing changes.
            with pytest.raises(ValidationError):
                await fleet.start("e", None, force=True)
            assert e.state == EngineState.INVALID
            moved.rename(model)
            await fleet.start("e", None, force=True)
            await until(lambda: e.state == EngineState.READY, what="ready again")
            assert e.config_id == config_id and e.spec.api_key.get_secret_value() == "sk-kept"
            assert e.status().spec_error is None
        finally:
            await fleet.close(stop_engines=True)
        assert json.loads(paths.state_file.read_text())["engines"]["new"]["spec"]["a_field_from_a_newer_version"] == 1

    asyncio.run(main())


def test_a_running_engine_whose_spec_no_longer_validates_is_adopted_not_relaunched(tmp_path, fake):
    paths = _paths(tmp_path)
    model = _model_dir(tmp_path / "models" / "m")

    async def main():
        fleet = Fleet(paths, FAST)
        await fleet.open()
        sup = await fleet.start("e", fake.spec(model=str(model)), force=True)
        await until(lambda: sup.state == EngineState.READY, what="ready")
        pid = sup.proc.pid
        await fleet.close()  # the daemon goes; the engine keeps serving
        model.rename(tmp_path / "models" / "moved")

        fleet = Fleet(paths, FAST)
        done = await fleet.open()
        try:
            assert any(f"adopted pid {pid}" in line for line in done)
            e = fleet.engines["e"]
            await until(lambda: e.state == EngineState.READY, what="adopted")
            st = e.status()
            assert st.pid == pid and st.adopted and "has no config.json" in st.spec_error
            os.kill(pid, signal.SIGKILL)
            await until(lambda: e.state == EngineState.INVALID, what="invalid after its exit")
            await asyncio.sleep(0.5)
            assert e.state == EngineState.INVALID and e.proc is None, "never relaunched from a stand-in"
            assert "not restarted" in e.status().last_error
            assert json.loads(paths.state_file.read_text())["engines"]["e"]["spec"]["model"] == str(model)
        finally:
            await fleet.close(stop_engines=True)

    asyncio.run(main())


def test_the_stored_config_id_is_the_specs_own(fake):
    spec = fake.spec(max_num_seqs=8, extra_args=("--x",), api_key="k")
    assert stored_config_id(json.loads(json.dumps(fleet_mod._spec_to_record(spec)))) == spec.config_id


def test_a_cpu_engine_given_no_kv_size_launches_with_the_default_modes_and_a_crowded_start_is_refused(
    tmp_path, fake, tiny_model, monkeypatch
):
    from llmconsole.engine.host import tree_rss_bytes
    from llmconsole.engine.plan.validate import ConfigDoesNotFit, host_memory, validate

    budget = 8 << 20

    async def main():
        fleet = Fleet(_paths(tmp_path), FAST, cpu_kv_budget_bytes=budget)  # the daemon's setting
        await fleet.open()
        try:
            a = await fleet.start("a", fake.spec(model=str(tiny_model), max_model_len=256))
            await until(lambda: a.state == EngineState.READY, what="a ready")
            assert a.spec.kv_cache_memory_bytes == int(budget * 0.90) and a.spec.gpu_memory_utilization == 0.90
            assert "--kv-cache-memory-bytes" in psutil.Process(a.proc.pid).cmdline()  # what runs is what the id says
            assert a.status().config_id == a.spec.config_id
            saved = json.loads(fleet.paths.state_file.read_text())["engines"]["a"]["spec"]
            assert saved["kv_cache_memory_bytes"] == int(budget * 0.90)
            # Starting it again on the same flags is the same config: nothing to restart.
            assert (await fleet.start("a", fake.spec(model=str(tiny_model), max_model_len=256))) is a
            # A KV size the host holds alone, but not beside a: refused before anything starts.
            total = host_memory(fake.spec(model=str(tiny_model))).total_bytes
            rss = tree_rss_bytes(a.proc.pid)
            kv = (total - rss // 2) // 65_536 * 65_536
            big = fake.spec(model=str(tiny_model), max_model_len=256, kv_cache_memory_bytes=kv)
            if validate(big).ok:  # (a host with swap could hold it alone)
                with pytest.raises(ConfigDoesNotFit, match="beside the engines running here .*a \\(KV 7,549,747"):
                    await fleet.start("b", big)
                assert "b" not in fleet.engines and a.state == EngineState.READY
        finally:
            await fleet.close(stop_engines=True)

    asyncio.run(main())


def test_an_unreadable_entry_of_the_state_file_is_kept_as_it_is_and_logged(tmp_path, fake, caplog):
    paths = _paths(tmp_path)

    async def main():
        fleet = Fleet(paths, FAST)
        await fleet.open()
        sup = await fleet.start("e", fake.spec(), force=True)
        await until(lambda: sup.state == EngineState.READY, what="ready")
        await fleet.close(stop_engines=True)
        data = json.loads(paths.state_file.read_text())
        odd = {"spec": "written by something else", "port": [1, 2]}
        data["engines"]["odd"] = odd
        data["engines"]["list"] = ["not", "an", "entry"]
        paths.state_file.write_text(json.dumps(data))

        fleet = Fleet(paths, FAST)
        with caplog.at_level("ERROR"):
            done = await fleet.open()
        try:
            assert "odd: entry unreadable; kept in the state file as it is" in done
            assert set(fleet.engines) == {"e"}  # the readable one is loaded
            assert "engine odd: its entry in" in caplog.text and "kept there as it is" in caplog.text
            await fleet.start("e", None, force=True)  # writes the file again
            await until(
                lambda: sup.state == EngineState.READY or fleet.engines["e"].state == EngineState.READY, what="e ready"
            )
        finally:
            await fleet.close(stop_engines=True)
        saved = json.loads(paths.state_file.read_text())["engines"]
        assert saved["odd"] == odd and saved["list"] == ["not", "an", "entry"]  # untouched, every write

    asyncio.run(main())
