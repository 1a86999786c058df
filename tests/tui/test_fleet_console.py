"""One console over several hosts, without engines: the merged status, the source's independent
polls and its routing of every command to the engine's host (fake clients stand for the hosts'
daemons here; tests/tui/test_fleet_console_engine.py drives real ones on a host of its own), the
dashboard grouped by host from a recording of two hosts (one unreachable), and the command line
that opens it."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest

from llmconsole.console import cli
from llmconsole.console.client import DaemonNotRunning, HostUnreachable
from llmconsole.console.hosts import LOCAL_HOST, Destination, Host
from llmconsole.console.tui import Command, toasts
from llmconsole.console.tui.screens.form import EngineFormScreen, validate_form
from llmconsole.console.tui.sources.hosts import HostsSource
from llmconsole.console.tui.sources.merge import HostState, fleet_alerts, fleet_status, split_key
from llmconsole.console.tui.views.host import SLOW_S, HostSection
from llmconsole.console.tui.views.status import Snapshot
from llmconsole.console.tui.widgets.hosts_table import HostsTable, host_row
from llmconsole.console.tui.widgets.planner_panel import PlannerPanel
from llmconsole.wire.status import DaemonInfo, StatusAnswer
from tests.support.recorded import FLEET_REASON, make_fleet_app, replay, stream_frames
from tests.support.waiting import wait_until

SMALL_AND_LARGE = [pytest.param((80, 24), id="80x24"), pytest.param((200, 60), id="200x60")]


def _status(*names: str, t: float = 1000.0, gpus: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "daemon": {"pid": 1, "version": "0.1.0", "time_s": t},
        "host": {"cpu_pct": 50.0, "memory_used_bytes": 1 << 30, "memory_total_bytes": 4 << 30, "gpus": gpus or []},
        "engines": [{"name": n, "state": "ready", "model": "m", "config_id": "c"} for n in names],
    }


def remote(name: str) -> Host:
    return Host(name=name, destination=Destination.parse(name))


# --- the merged status -------------------------------------------------------------------------


def test_engines_are_named_engine_at_host_and_each_host_has_its_section():
    a, b = HostState("local", "local (this host)", local=True), HostState("gpu1", "gpu1")
    a.answered(_status("x", t=1000.0), 10.0)
    b.answered(_status("x", "y", t=1003.0), 10.0)
    merged = fleet_status([a, b], 10.5)
    assert [e["name"] for e in merged["engines"]] == ["x@local", "x@gpu1", "y@gpu1"]
    assert [e["host"] for e in merged["engines"]] == ["local", "gpu1", "gpu1"]
    assert merged["daemon"]["time_s"] == 1003.0  # the charts' clock: the newest answer
    snap = Snapshot.parse(merged)
    assert [h.name for h in snap.hosts] == ["local", "gpu1"] and snap.hosts[1].engines == 2
    assert snap.host_of(snap.engine("y@gpu1")).cpu_pct == 50.0
    assert snap.unreachable(snap.engine("y@gpu1")) is None
    assert split_key("y@ops@gpu1") == ("y", "ops@gpu1")  # a host named by its destination

    b.failed("ssh: connect to host gpu1 port 22: Connection refused", reachable=False, retry_in_s=4.0)
    snap = Snapshot.parse(fleet_status([a, b], 20.0))
    gpu1 = snap.section("gpu1")
    assert gpu1 is not None and gpu1.state == "unreachable" and gpu1.age_s == 10.0 and gpu1.retry_in_s == 4.0
    assert [e.name for e in snap.engines] == ["x@local", "x@gpu1", "y@gpu1"]  # as last seen
    assert "Connection refused" in (snap.unreachable(snap.engine("x@gpu1")) or "")
    assert snap.time_s == 1000.0  # an old answer does not move the clock


def test_alerts_of_every_host_in_one_answer():
    answer = {
        "active": [{"rule": "kv_high", "engine": "x", "state": "firing"}],
        "alerts": [],
        "responses": [{"id": 3, "at": 5.0, "engine": "x", "kind": "response:restart", "outcome": "applied"}],
        "settings": {"responses": {"kv_high": ["restart"]}},
    }
    merged = fleet_alerts({"gpu1": answer, "gpu2": "ssh: connect to host gpu2 port 22: Connection refused"})
    assert merged["active"][0]["engine"] == "x@gpu1"
    assert merged["responses"][0]["host"] == "gpu1" and merged["responses"][0]["engine"] == "x@gpu1"
    assert merged["settings"]["responses"] == {"kv_high@gpu1": ["restart"]}
    assert merged["notes"] == ["gpu2: ssh: connect to host gpu2 port 22: Connection refused"]


def test_a_host_row_shows_gpu_gauges_where_there_are_gpus():
    gpu = {"index": 0, "memory_used_bytes": 40 << 30, "memory_total_bytes": 80 << 30, "utilization_gpu_pct": 35}
    state = HostState("a100", "a100")
    state.answered(_status("big", gpus=[gpu, dict(gpu, index=1)]), 1.0)
    section = Snapshot.parse(fleet_status([state], 1.0)).hosts[0]
    text = host_row(section, 200).plain
    assert "GPU mem" in text and "80.0 GiB / 160.0 GiB" in text and "util" in text and "35%" in text
    assert "2 GPUs" in text and "CPU" in text and "1 engine" in text
    assert "CPU" not in host_row(section, 80).plain  # narrow: the GPUs' figures first
    down = HostSection(name="b", label="b", reachable=False, error=FLEET_REASON, retry_in_s=8.0)
    assert host_row(down, 80).plain.splitlines()[1].strip() == FLEET_REASON


def test_the_start_form_leaves_a_remote_hosts_model_to_that_hosts_daemon():
    raw = {"name": "e1", "model": "/srv/models/only-there", "max_num_seqs": "4", "enable_prefix_caching": "default"}
    assert "no config.json" in validate_form(raw)[2]["model"][0]  # here, it must be here
    name, spec, errors = validate_form(raw, remote=True)
    assert (name, errors) == ("e1", {}) and spec == {"model": "/srv/models/only-there", "max_num_seqs": 4}
    assert "max_num_seqs" in validate_form({**raw, "max_num_seqs": "0"}, remote=True)[2]  # the rest is checked


# --- the source ----------------------------------------------------------------------------


class FakeDaemon:
    """One host's daemon as its clients see it."""

    def __init__(self, name: str, engines: tuple[str, ...] = (), delay_s: float = 0.0, running: bool = True):
        self.name, self.engines, self.delay_s, self.running = name, list(engines), delay_s, running
        self.unreachable: str | None = None
        self.calls: list[tuple[str, ...]] = []
        self.started_daemon = False
        self.release = threading.Event()
        self.release.set()

    def client(self, timeout_s: float = 0.0, start_daemon: bool = False) -> FakeClient:
        return FakeClient(self, start_daemon)


class FakeClient:
    def __init__(self, daemon: FakeDaemon, start_daemon: bool):
        self.d, self.start_daemon = daemon, start_daemon

    def _check(self) -> None:
        if self.d.unreachable is not None:
            raise HostUnreachable(self.d.name, self.d.unreachable, retry_in_s=2.0)
        if self.start_daemon:
            self.d.running, self.d.started_daemon = True, True
        if not self.d.running:
            raise DaemonNotRunning(f"no llmconsole daemon is running on {self.d.name}")

    def status(self) -> dict[str, Any]:
        self._check()
        self.d.release.wait(10)
        time.sleep(self.d.delay_s)
        return _status(*self.d.engines)

    def status_answer(self) -> StatusAnswer:
        return StatusAnswer.model_validate(self.status())

    def daemon_info(self) -> DaemonInfo:
        self._check()
        return DaemonInfo()

    def begin_session(self, client: str) -> int:
        self._check()
        return 1

    def set_session(self, session_id: int | None) -> None:
        pass

    def end_session(self, session_id: int) -> None:
        pass

    def alerts(self) -> dict[str, Any]:
        self._check()
        return {"active": [], "alerts": [], "responses": [], "settings": {"responses": {}}}

    def logs(self, name: str, offset: int | None = None, max_bytes: int = 0) -> dict[str, Any]:
        self._check()
        self.d.calls.append(("logs", name))
        return {"text": f"log of {name} on {self.d.name}", "offset": 0, "size": 0}

    def start_engine(self, name: str, spec: dict[str, Any] | None = None) -> dict[str, Any]:
        self._check()
        self.d.calls.append(("start", name))
        self.d.engines.append(name)
        return {"name": name}

    def stop_engine(self, name: str) -> dict[str, Any]:
        self._check()
        self.d.calls.append(("stop", name))
        return {"state": "stopped"}

    def undo_response(self, action_id: int) -> dict[str, Any]:
        self._check()
        self.d.calls.append(("undo", str(action_id)))
        return {}

    def close(self) -> None:
        pass

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def fleet(*daemons: FakeDaemon) -> HostsSource:
    by_name = {d.name: d for d in daemons}
    hosts = [LOCAL_HOST if d.name == "local" else remote(d.name) for d in daemons]
    return HostsSource(hosts, dial=lambda host, **kw: by_name[host.name].client(**kw))


def test_a_slow_host_does_not_hold_up_the_others():
    fast, slow = FakeDaemon("local", ("a",)), FakeDaemon("gpu1", ("b",))
    src = fleet(fast, slow)
    try:
        src.poll()  # both answer
        slow.release.clear()  # gpu1's next status hangs
        fast.engines.append("c")
        t0 = time.monotonic()
        merged = src.poll()
        assert time.monotonic() - t0 < src.WAIT_S + 0.5
        assert [e["name"] for e in merged["engines"]] == ["a@local", "c@local", "b@gpu1"]
        for _ in range(5):  # gpu1's question stays pending and is not waited for again
            t0 = time.monotonic()
            merged = src.poll()
            assert time.monotonic() - t0 < 0.5
        assert Snapshot.parse(merged).section("gpu1").state == "up"  # not long enough to say slow
        time.sleep(SLOW_S)
        merged = src.poll()
        waiting = merged["hosts"][1]["waiting_s"]
        assert waiting is not None and waiting >= SLOW_S
        assert Snapshot.parse(merged).section("gpu1").state == "slow"
        with pytest.raises(HostUnreachable):  # a read of a host that hangs would hold the poll up
            src.logs("b@gpu1")
        assert src.logs("a@local")["text"] == "log of a on local"
        slow.release.set()  # its answer comes, and a later poll takes it
        merged = wait_until(src.poll, 5, 0.1, "gpu1's answer", ok=lambda m: m["hosts"][1]["waiting_s"] is None)
        assert merged["hosts"][1]["error"] is None
    finally:
        slow.release.set()
        src.close()


def test_an_unreachable_host_shows_ssh_reason_and_the_others_keep_updating():
    local, gpu1 = FakeDaemon("local", ("a",)), FakeDaemon("gpu1", ("b",))
    src = fleet(local, gpu1)
    try:
        src.poll()
        gpu1.unreachable = FLEET_REASON
        local.engines.append("c")
        snap = Snapshot.parse(src.poll())
        section = snap.section("gpu1")
        assert section is not None and not section.reachable and section.error == FLEET_REASON
        assert section.retry_in_s == 2.0
        assert [e.name for e in snap.engines] == ["a@local", "c@local", "b@gpu1"]
        assert snap.unreachable(snap.engine("b@gpu1")) == f"host gpu1 is unreachable: {FLEET_REASON}"
        with pytest.raises(HostUnreachable):
            src.send(Command("stop", "b@gpu1"))
        stopped = src.send(Command("stop_all"))
        assert stopped == {"stopped": ["a@local", "c@local"], "missed": [f"gpu1 ({FLEET_REASON})"]}
        assert toasts.done(Command("stop_all"), stopped) == (
            f"stopped a@local, c@local; not reached: gpu1 ({FLEET_REASON})"
        )
        notes = src.alerts()["notes"]
        assert notes == [f"gpu1: {FLEET_REASON} (not asked)"]
        gpu1.unreachable = None
        assert Snapshot.parse(src.poll()).section("gpu1").state == "up"
    finally:
        src.close()


def test_commands_go_to_the_engines_host_with_its_own_name():
    local, gpu1 = FakeDaemon("local", ("a",)), FakeDaemon("gpu1", ("a",), running=False)
    src = fleet(local, gpu1)
    try:
        src.poll()
        src.send(Command("stop", "a@local"))
        assert local.calls == [("stop", "a")] and gpu1.calls == []
        # gpu1 runs no daemon: a start starts it there (dial-stdio), as `engine start` does
        assert src.send(Command("start", "new@gpu1", {"model": "m"})) == {"name": "new"}
        assert gpu1.started_daemon and gpu1.calls == [("start", "new")]
        src.send(Command("undo", None, {"action_id": 7, "host": "gpu1"}))
        assert gpu1.calls[-1] == ("undo", "7")
        name, dial = src.dialer("a@local")
        assert name == "a" and isinstance(dial(5.0), FakeClient)
        with pytest.raises(DaemonNotRunning):  # no daemon: a stop starts none
            HostsSource([remote("gpu9")], dial=lambda h, **kw: FakeDaemon("gpu9", running=False).client(**kw)).send(
                Command("stop", "x@gpu9")
            )
    finally:
        src.close()


# --- the dashboard over two hosts ----------------------------------------------------------


def _run(*keys: str):
    async def run_before(pilot) -> None:
        await replay(pilot)
        for k in keys:
            await pilot.press(k)
            await pilot.pause(0.05)
        await pilot.pause(0.1)

    return run_before


@pytest.mark.parametrize("size", SMALL_AND_LARGE)
def test_snapshot_fleet_dashboard(snap_compare, size):
    """gpu1 answering (the recorded stream), gpu2 unreachable with ssh's reason, its engines as last seen."""
    app, _ = make_fleet_app()
    assert snap_compare(app, terminal_size=size, run_before=_run())


def test_snapshot_fleet_unreachable_host_selected(snap_compare):
    app, _ = make_fleet_app()
    assert snap_compare(app, terminal_size=(80, 24), run_before=_run("down", "down"))


def test_every_action_names_engine_at_host_and_an_unreachable_hosts_engines_are_left_alone():
    async def go():
        app, source = make_fleet_app()
        async with app.run_test(size=(120, 40)) as pilot:
            await replay(pilot)
            table = app.screen.query_one(HostsTable)
            assert app.selected_engine().name == "t1@gpu1"
            await pilot.press("r")
            await pilot.press("y")
            await pilot.pause(0.1)
            assert source.commands[-1] == Command("restart", "t1@gpu1")
            # the cursor on gpu2's engine: its host does not answer, so nothing is sent there
            await pilot.press("down", "down", "down")
            assert app.selected_engine().name == "t1@gpu2" and table.selected_host == "gpu2"
            assert app.check_action("stop_engine", ()) is None
            assert app.check_action("choose_mode", ()) is None
            assert app.check_action("show_logs", ()) is True  # its last-seen state can be read
            await pilot.press("k")
            await pilot.pause(0.1)
            assert source.commands[-1] == Command("restart", "t1@gpu1")
            assert app.check_action("new_engine", ()) is None  # nor started on gpu2
            # on gpu1's row, `n` starts an engine on gpu1
            await pilot.press("up", "up", "up", "up")
            assert table.selected_name is None and table.selected_host == "gpu1"
            await pilot.press("n")
            await pilot.pause(0.1)
            assert isinstance(app.screen, EngineFormScreen)
            assert app.screen.query_one("#form-box").border_title == "start an engine on gpu1"
            assert app.screen.remote and not app.screen.query_one(PlannerPanel).display
            app.screen.dismiss(("e9", {"model": "m"}))
            await pilot.pause(0.1)
            assert source.commands[-1] == Command("start", "e9@gpu1", {"model": "m"})

    asyncio.run(go())


def test_the_fleet_recording_is_two_hosts_of_real_answers():
    from tests.support.recorded import fleet_frames

    frames = fleet_frames()
    assert len(frames) == len(stream_frames())
    last = Snapshot.parse(frames[-1]["status"])
    assert [(h.name, h.state) for h in last.hosts] == [("gpu1", "up"), ("gpu2", "unreachable")]


# --- the command line ----------------------------------------------------------------------


def test_at_a_terminal_several_hosts_open_one_console(monkeypatch, tmp_path):
    opened: list[list[str]] = []
    monkeypatch.setattr("sys.stdin.isatty", lambda: True, raising=False)
    monkeypatch.setattr("sys.stdout.isatty", lambda: True, raising=False)
    monkeypatch.setattr(
        "llmconsole.console.tui.run.run_fleet_console", lambda hosts: opened.append([h.name for h in hosts]) or 0
    )
    monkeypatch.setattr("llmconsole.console.tui.run.run_console", lambda: opened.append(["(this host)"]) or 0)
    monkeypatch.setenv("LLMCONSOLE_HOME", str(tmp_path))
    (tmp_path / "hosts.toml").write_text('[hosts.gpu1]\ndestination = "ops@gpu1"\n')
    assert cli.main(["--host", "gpu1", "--host", "ops@gpu2"]) == 0
    assert cli.main(["--host", "gpu1"]) == 0  # one remote host: its console here, not run there
    assert cli.main(["--host", "local", "--host", "gpu1", "console"]) == 0
    assert cli.main(["console", "--all-hosts"]) == 0
    assert cli.main(["--host", "local"]) == 0
    assert cli.main([]) == 0
    assert opened == [
        ["gpu1", "ops@gpu2"],
        ["gpu1"],
        ["local", "gpu1"],
        ["local", "gpu1"],
        ["(this host)"],
        ["(this host)"],
    ]


def test_without_a_terminal_several_hosts_still_print_their_status(monkeypatch, tmp_path):
    printed: list[list[str]] = []
    monkeypatch.setattr("sys.stdin.isatty", lambda: False, raising=False)
    monkeypatch.setattr(cli, "cmd_status", lambda ns: printed.append([h.name for h in ns.targets]) or 0)
    monkeypatch.setattr("llmconsole.console.tui.run.run_fleet_console", lambda hosts: pytest.fail("a console"))
    monkeypatch.setenv("LLMCONSOLE_HOME", str(tmp_path))
    assert cli.main(["--host", "gpu1", "--host", "gpu2"]) == 0
    assert cli.main(["--host", "gpu1"]) == 0
    assert printed == [["gpu1", "gpu2"], ["gpu1"]]
