"""One console over two hosts' real daemons, one of which stops answering: the other keeps refreshing.

"local" is a daemon on a data dir of its own; "mute" is a host of its own (a network namespace
with its own address, sshd, Unix user and home: tests/support/netns.py), reached only as the
operator's ssh config names it (`llmconsole daemon dial-stdio` on the far side), whose daemon
keeps one engine from before (stopped: no vLLM is started). The console selects that engine, so it reads its log
from mute. Then mute's daemon hangs (SIGSTOP): ssh logs in, dial-stdio connects, and nothing ever
answers, as a hung daemon or a black-holed link behaves. A log read of mute's engine is then out
for its whole timeout, and the console's polls, which refresh every host, must go on meanwhile;
a stop of everything names mute as not answering after a poll's timeout, not a command's.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import threading
from typing import Any

import pytest

from llmconsole.console.hosts import LOCAL_HOST, HostCatalog
from llmconsole.console.ssh import SSH_COMMAND_ENV
from llmconsole.console.tui import Command, make_app
from llmconsole.console.tui.sources.hosts import HostsSource
from llmconsole.console.tui.widgets.hosts_table import HostsTable
from llmconsole.engine.fleet import STATE_VERSION
from tests.support.daemon import Cli, short_home, stop_daemon
from tests.support.waiting import pilot_wait

pytestmark = pytest.mark.daemon


class WatchedSource(HostsSource):
    """The real source, counting the polls that finish while a log read of `watched` is out."""

    def __init__(self, *args: Any, watched: str, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.watched = watched
        self._lock = threading.Lock()
        self.reads_out = 0  # log reads of the watched host not yet returned
        self.reads_started = 0
        self.polls_during_read = 0

    def poll(self) -> dict[str, Any]:
        merged = super().poll()
        with self._lock:
            if self.reads_out:
                self.polls_during_read += 1
        return merged

    def logs(self, name: str, offset: int | None = None, max_bytes: int = 4096) -> dict[str, Any]:
        if not name.endswith(f"@{self.watched}"):
            return super().logs(name, offset=offset, max_bytes=max_bytes)
        with self._lock:
            self.reads_out += 1
            self.reads_started += 1
        try:
            return super().logs(name, offset=offset, max_bytes=max_bytes)
        finally:
            with self._lock:
                self.reads_out -= 1


@pytest.fixture(scope="module")
def mute_and_local(netns_fleet):
    mute = netns_fleet.host("mute")
    local = short_home("llmc-sl-")
    # An engine mute's daemon keeps from before, stopped: listed, with a log to read, no vLLM run.
    state = {"version": STATE_VERSION, "engines": {"e1": {"spec": {"model": str(mute.model)}}}}
    mute.write_file(mute.data_dir / "engines.json", json.dumps(state))
    (local / "hosts.toml").write_text(netns_fleet.hosts_toml("mute"))
    c = Cli(local)
    c.env.pop(SSH_COMMAND_ENV, None)
    c("daemon", "start")
    c("--host", "mute", "daemon", "start")
    mute_pid = mute.daemon_pid()
    yield {"local": local, "mute_pid": mute_pid}
    os.kill(mute_pid, signal.SIGCONT)
    c("--host", "mute", "daemon", "stop", "--yes", check=False, timeout=180)
    stop_daemon(local)
    shutil.rmtree(local, ignore_errors=True)


def test_a_host_that_stops_answering_never_holds_up_the_others_refresh(mute_and_local, monkeypatch):
    homes = mute_and_local
    monkeypatch.setenv("LLMCONSOLE_HOME", str(homes["local"]))
    monkeypatch.delenv(SSH_COMMAND_ENV, raising=False)
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    hosts = [LOCAL_HOST, HostCatalog(homes["local"] / "hosts.toml").lookup("mute")]
    source = WatchedSource(hosts, watched="mute")
    app = make_app(source, refresh_s=0.5, cursor_blink=False, fleet=True)

    def section(name: str):
        return app.snapshot.section(name) if app.snapshot is not None else None

    async def go() -> None:
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot_wait(pilot, lambda: app.snapshot and app.snapshot.engine("e1@mute"), "e1 on mute", 60, 0.1)
            table = app.screen.query_one(HostsTable)
            for _ in range(4):  # down the rows: local's (no engines), mute's, then e1's
                if table.selected_name == "e1@mute":
                    break
                await pilot.press("down")
                await pilot.pause(0.05)
            assert table.selected_name == "e1@mute"
            await pilot_wait(pilot, lambda: "e1@mute" in app.logs, "e1's log, read from mute", 30, 0.1)

            os.kill(homes["mute_pid"], signal.SIGSTOP)  # mute takes every connection, answers none
            started = source.reads_started
            await pilot_wait(
                pilot, lambda: source.reads_started > started and source.reads_out, "a log read of mute out", 90, 0.1
            )
            # While it is out (its timeout is 15 s), this host's figures keep coming.
            answered, during = app.polls_applied, source.polls_during_read
            await pilot_wait(
                pilot,
                lambda: source.polls_during_read >= during + 3 and app.polls_applied >= answered + 3,
                "polls applied while mute's log read is out",
                60,
                0.1,
            )
            assert section("local").state == "up" and section("local").error is None
            # mute's own poll shows it once that poll is late (polls of the hosts run side by side,
            # and this host's may be applied before mute's is late), while this host stays up.
            await pilot_wait(
                pilot,
                lambda: section("mute").state in ("slow", "not answering"),
                "mute shown slow or not answering",
                60,
                0.1,
            )
            assert section("local").state == "up" and section("local").error is None

            # Stopping everything asks every host at once, and names the one that says nothing.
            reply: list[dict[str, Any]] = []
            threading.Thread(target=lambda: reply.append(source.send(Command("stop_all"))), daemon=True).start()
            await pilot_wait(pilot, lambda: reply, "stop-all's reply", 90, 0.1)
            assert reply[0] == {"stopped": [], "missed": [f"mute (no answer within {source.POLL_TIMEOUT_S:.0f} s)"]}

    try:
        asyncio.run(go())
    finally:
        source.close()
