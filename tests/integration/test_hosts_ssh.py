"""Hosts without engines: destinations and the hosts file, ENGINE@HOST, the backoff, the CLI's
errors, and other hosts' daemons reached over ssh: each host a network namespace with its own
address, sshd, Unix user and home (tests/support/netns.py), named in the hosts file by its alias
in the operator's ssh config, running the `llmconsole` of its PATH on its default data dir."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading

import psutil
import pytest

from llmconsole.console.hosts import (
    HostCatalog,
    client_for,
)
from llmconsole.console.ssh import SSH_COMMAND_ENV
from tests.support.daemon import Cli, short_home, stop_daemon
from tests.support.netns import NetnsHost, namespace_pids

pytestmark = pytest.mark.daemon

# --- the CLI ---------------------------------------------------------------------------------


def test_cli_refuses_bad_hosts_and_conflicts_with_exit_2(cli, home):
    (home / "hosts.toml").write_text("[hosts.gpu1]\ndestnation = 'x'\n")
    r = cli("--host", "gpu1", "status", check=False)
    assert r.returncode == 2 and "unknown key(s) destnation" in r.stderr
    (home / "hosts.toml").write_text("[hosts.gpu1]\ndestination = 'gpu1'\n[hosts.gpu2]\ndestination = 'gpu2'\n")
    r = cli("--host", "gpu2", "engine", "stop", "demo@gpu1", "--yes", check=False)
    assert r.returncode == 2 and "names host gpu1, but --host names gpu2" in r.stderr
    r = cli("--host", "gpu1", "--host", "gpu2", "engine", "stop", "demo", check=False)
    assert r.returncode == 2 and "acts on one host" in r.stderr
    r = cli("--host=-oProxyCommand=touch", "status", check=False)
    assert r.returncode == 2 and "not valid" in r.stderr
    r = cli("hosts", "ls", "--json")
    assert [h["name"] for h in json.loads(r.stdout)["hosts"]] == ["gpu1", "gpu2"]


def test_status_all_hosts_reports_each_host_and_exits_4_when_one_is_down(cli, home):
    (home / "hosts.toml").write_text("[hosts.down]\ndestination = 'ssh://nobody@127.0.0.1:1'\n")
    r = cli("status", "--all-hosts", "--json", check=False)
    assert r.returncode == 4, r.stderr
    hosts = {h["host"]: h for h in json.loads(r.stdout)["hosts"]}
    assert hosts["local"]["reachable"] and not hosts["local"]["running"]
    assert hosts["local"]["error"] == "no llmconsole daemon is running"
    assert not hosts["down"]["reachable"] and "Connection refused" in hosts["down"]["error"]
    text = cli("status", "--all-hosts", check=False).stdout
    assert "local (this host)\n  no llmconsole daemon is running" in text
    assert "down (nobody@127.0.0.1:1)\n  unreachable: ssh: connect to host 127.0.0.1 port 1: Connection refused" in text
    r = cli("engine", "stop", "demo@down", "--yes", check=False)
    assert r.returncode == 4 and "host down is unreachable: ssh: connect to host" in r.stderr


def test_dial_stdio_without_a_daemon_exits_3(cli):
    r = cli("daemon", "dial-stdio", "--no-start", check=False, input="")
    assert r.returncode == 3 and "no llmconsole daemon is running" in r.stderr


# --- a second host, its daemon reached over ssh ------------------------------------------------


def _operator(hosts_toml: str, prefix: str) -> Cli:
    """The CLI as the operator runs it: a hosts file, and the ssh of the PATH with its config."""
    home = short_home(prefix)
    (home / "hosts.toml").write_text(hosts_toml)
    c = Cli(home)
    c.env.pop(SSH_COMMAND_ENV, None)
    return c


@pytest.fixture(scope="module")
def gamma(netns_fleet):
    """Host `gamma`, with no daemon yet, and an operator whose hosts file names it."""
    host = netns_fleet.host("gamma")
    c = _operator(netns_fleet.hosts_toml("gamma"), "llmc-l-")
    c.host = host
    yield c
    stop_daemon(c.home)
    shutil.rmtree(c.home, ignore_errors=True)


def test_remote_daemon_start_status_stop_over_ssh(gamma):
    r = gamma("--host", "gamma", "status", check=False)
    assert r.returncode == 3 and "no llmconsole daemon is running on gamma" in r.stderr
    r = gamma("--host", "gamma", "daemon", "start")
    assert "daemon running on gamma" in r.stdout
    # That daemon is gamma's: its user's, in gamma's namespace, on that user's default data dir,
    # its socket in that user's private folder, 0600.
    host: NetnsHost = gamma.host
    sock = host.runtime_dir / "control.sock"
    assert sock.exists() and (sock.stat().st_mode & 0o777) == 0o600 and sock.stat().st_uid == host.uid
    info = json.loads(gamma("--host", "gamma", "daemon", "status", "--json").stdout)
    assert info["running"] and info["host"] == "gamma" and info["socket"] == str(sock)
    daemon = psutil.Process(host.daemon_pid())
    assert daemon.username() == host.user and daemon.pid in namespace_pids(host.ns)
    assert (host.data_dir / "logs" / "daemon.log").is_file()
    assert gamma("--host", "gamma", "status", "--json").stdout.strip().startswith("{")
    # The local host has no daemon; gamma's answers; each is said as such.
    st = {h["host"]: h for h in json.loads(gamma("status", "--all-hosts", "--json").stdout)["hosts"]}
    assert st["gamma"]["running"] and st["gamma"]["status"]["engines"] == []
    assert not st["local"]["running"]


def test_one_client_many_calls_and_threads_over_one_host(gamma, monkeypatch):
    gamma("--host", "gamma", "daemon", "start")
    monkeypatch.delenv(SSH_COMMAND_ENV, raising=False)
    host = HostCatalog(gamma.home / "hosts.toml").lookup("gamma")
    errors: list[BaseException] = []
    with client_for(host, timeout_s=60) as c:
        assert c.ping() is not None
        pids = set()

        def poll() -> None:
            try:
                for _ in range(5):
                    pids.add(c.daemon_info().pid)
                    assert c.status()["engines"] == []
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=poll) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert not errors, errors
    assert len(pids) == 1


def test_commands_without_an_api_run_on_the_host(gamma, tmp_path):
    gamma("--host", "gamma", "daemon", "start")
    # history reads gamma's own store, over there, through gamma's daemon.
    r = gamma("--host", "gamma", "history", "--json")
    assert json.loads(r.stdout) == {"engines": {}}
    # export comes back here: gamma's export, streamed as a tar over ssh.
    out = tmp_path / "bundle"
    r = gamma("--host", "gamma", "export", "--out", str(out))
    assert (out / "report.md").is_file() and (out / "sessions.jsonl").is_file()
    assert "exported gamma to" in r.stdout
    # One bundle across hosts: each host's folder, and hosts.json saying which made it.
    both = tmp_path / "both"
    r = gamma("export", "--all-hosts", "--out", str(both), check=False)
    index = {h["host"]: h for h in json.loads((both / "hosts.json").read_text())["hosts"]}
    assert index["gamma"]["ok"] and (both / "gamma" / "report.md").is_file()
    # The local host runs no daemon, which export needs: the store is read through it.
    assert not index["local"]["ok"] and "no llmconsole daemon is running" in index["local"]["error"]
    assert r.returncode == 1


def test_remote_daemon_stop_over_ssh(gamma):
    gamma("--host", "gamma", "daemon", "start")
    r = gamma("--host", "gamma", "daemon", "stop")
    assert "daemon on gamma stopped; no engine was running" in r.stdout  # none was started there
    assert not (gamma.host.runtime_dir / "control.sock").exists()
    assert gamma("--host", "gamma", "daemon", "status", check=False).returncode == 3


# --- a host that takes the connection and never answers ----------------------------------------


@pytest.fixture(scope="module")
def quiet(netns_fleet):
    """This host's daemon (answering), and host `quiet`, whose daemon hangs (SIGSTOP): ssh logs
    in, dial-stdio connects to its socket, and nothing ever answers, as a hung daemon does."""
    host = netns_fleet.host("quiet")
    c = _operator(netns_fleet.hosts_toml("quiet", extra={"quiet": 'metrics = "127.0.0.1:9"\n'}), "llmc-q-")
    c.env_hosts = {"quiet": host.alias}
    c("daemon", "start")
    c("--host", "quiet", "daemon", "start")
    pid = host.daemon_pid()
    os.kill(pid, signal.SIGSTOP)
    yield c
    os.kill(pid, signal.SIGCONT)
    stop_daemon(c.home)
    shutil.rmtree(c.home, ignore_errors=True)


def test_status_all_hosts_shows_every_answer_and_names_the_silent_host_slow(quiet):
    r = quiet("status", "--all-hosts", "--json", check=False)
    assert r.returncode == 4, r.stderr
    hosts = {h["host"]: h for h in json.loads(r.stdout)["hosts"]}
    assert hosts["local"]["running"] and hosts["local"]["status"]["engines"] == []
    q = hosts["quiet"]
    assert q["slow"] and q["reachable"] and not q["running"] and q["status"] is None
    assert q["error"] == "no answer within 20 s: the host took the connection, then said nothing"
    r = quiet("status", "--all-hosts", "--host-timeout", "5", check=False)
    assert r.returncode == 4
    assert "local (this host)\n  no engines" in r.stdout
    alias = quiet.env_hosts["quiet"]
    assert f"quiet ({alias})\n  slow: no answer within 5 s: the host took the connection, then said nothing" in r.stdout


def test_prometheus_targets_watch_outlives_a_silent_host(quiet, tmp_path):
    """Two rounds are written for the host that answers; the silent one keeps what is known of it
    (its `metrics` entry) and is named slow on stderr; the watch goes on."""
    out = tmp_path / "sd"
    argv = ["hosts", "prometheus-targets", "--out", str(out), "--watch", "1", "--local-name", "here"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmconsole.console.cli", *argv],
        env=quiet.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    try:
        rounds = [proc.stdout.readline() for _ in range(2)]  # one line a round; "" if it died
        assert all(line.startswith(f"{out / 'llmconsole.json'}: 2 exporter(s)") for line in rounds), rounds
        assert proc.poll() is None, "the watch ended"
        targets = {t["labels"]["host"]: t["targets"] for t in json.loads((out / "llmconsole.json").read_text())}
        assert targets["quiet"] == ["127.0.0.1:9"]
        assert targets["here"][0].startswith("127.0.0.1:")
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=60)
    assert "quiet: slow: no answer within 20 s: the host took the connection, then said nothing" in stderr
    assert "Traceback" not in stderr
