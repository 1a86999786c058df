"""Hosts without engines: destinations and the hosts file, ENGINE@HOST, the backoff, the CLI's
errors. Other hosts reached for real over ssh are in tests/integration/test_hosts_ssh.py."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import pytest

from llmconsole.console.client import DaemonNotRunning, HostUnreachable
from llmconsole.console.host_status import gather
from llmconsole.console.hosts import (
    LOCAL,
    Destination,
    Host,
    HostCatalog,
    HostsError,
    client_for,
    hosts_file,
    parse_hosts,
    split_engine,
)
from llmconsole.console.ssh import SSH_COMMAND_ENV, Backoff, ssh_argv, ssh_reason
from llmconsole.wire.status import StatusAnswer

# --- destinations and the hosts file ---------------------------------------------------------


@pytest.mark.parametrize(
    "text, user, hostname, port",
    [
        ("gpu1", None, "gpu1", None),
        ("ops@gpu1.example.com", "ops", "gpu1.example.com", None),
        ("ssh://ops@gpu1:2222", "ops", "gpu1", 2222),
        ("ssh://gpu1", None, "gpu1", None),
        ("ssh://root@[::1]:22", "root", "::1", 22),
        ("10.0.0.7", None, "10.0.0.7", None),
    ],
)
def test_destinations_as_ssh_takes_them(text, user, hostname, port):
    d = Destination.parse(text)
    assert (d.user, d.hostname, d.port) == (user, hostname, port)
    assert str(d) == text  # handed to ssh unchanged


@pytest.mark.parametrize(
    "text, words",
    [
        ("", "empty"),
        ("-oProxyCommand=sh", "not valid"),  # never an option to ssh
        ("a b", "not valid"),
        ("gpu1;reboot", "not valid"),
        ("user@gpu1:2222", "ssh://"),  # ssh would read gpu1:2222 as a host name
        ("http://gpu1", "only ssh://"),
        ("ssh://ops:pw@gpu1", "nothing more"),  # no passwords in URIs
        ("ssh://gpu1/path", "nothing more"),
        ("ssh://gpu1:99999", "ssh destination"),
        ("@gpu1", "not a user name"),
    ],
)
def test_bad_destinations_say_why(text, words):
    with pytest.raises(HostsError) as e:
        Destination.parse(text)
    assert words in str(e.value)


def test_hosts_file_parses_in_order_with_optional_fields():
    hosts = parse_hosts("""
[hosts.gpu1]
destination = "ops@gpu1"
command = "/opt/llmconsole/bin/llmconsole"
data_dir = "/srv/llmconsole"
metrics = "10.0.0.11:9400"

[hosts.gpu2]
destination = "ssh://ops@gpu2:2222"
data_dir = "~/llmc"
""")
    assert [h.name for h in hosts] == ["gpu1", "gpu2"]
    g1, g2 = hosts
    assert (g1.command, g1.data_dir, g1.metrics) == (
        "/opt/llmconsole/bin/llmconsole",
        "/srv/llmconsole",
        "10.0.0.11:9400",
    )
    assert g2.command == "llmconsole" and g2.destination is not None and g2.destination.port == 2222
    # What the remote shell runs: the data dir quoted, ~ left to the remote user's home.
    assert (
        g1.remote_command("daemon", "dial-stdio")
        == "env LLMCONSOLE_HOME=/srv/llmconsole /opt/llmconsole/bin/llmconsole daemon dial-stdio"
    )
    assert (
        g2.remote_command("engine", "stop", "a b") == "env LLMCONSOLE_HOME=\"$HOME\"/llmc llmconsole engine stop 'a b'"
    )


@pytest.mark.parametrize(
    "text, words",
    [
        ("[hosts.gpu1\n", "not valid TOML"),
        ("[hosts.gpu1]\ncommand = 'x'\n", "`destination` is required"),
        ("[hosts.gpu1]\ndestination = 'gpu1'\ndestnation = 'x'\n", "unknown key(s) destnation"),
        ("[hosts.local]\ndestination = 'gpu1'\n", "this host's own name"),
        ("[hosts.'a b']\ndestination = 'gpu1'\n", "name is not valid"),
        ("[hosts.gpu1]\ndestination = '-oProxyCommand=x'\n", "[hosts.gpu1]: ssh destination"),
        ("[hosts.gpu1]\ndestination = 'gpu1'\ndata_dir = 'relative'\n", "must be absolute"),
        ("[hosts.gpu1]\ndestination = 'gpu1'\nmetrics = 'gpu1'\n", "not HOST:PORT"),
        ("[host.gpu1]\ndestination = 'gpu1'\n", "unknown top-level key"),
        ("hosts = 3\n", "must be a table"),
    ],
)
def test_hosts_file_errors_name_the_entry_and_the_fix(text, words):
    with pytest.raises(HostsError) as e:
        parse_hosts(text, "hosts.toml")
    assert words in str(e.value)
    assert str(e.value).startswith("hosts.toml")


def test_hosts_file_lives_with_the_state_or_in_the_config_dir(tmp_path):
    assert hosts_file({"LLMCONSOLE_HOME": "/x/y"}) == Path("/x/y/hosts.toml")
    assert hosts_file({"XDG_CONFIG_HOME": "/c"}) == Path("/c/llmconsole/hosts.toml")


def test_catalog_names_destinations_and_the_local_host(tmp_path):
    f = tmp_path / "hosts.toml"
    f.write_text('[hosts.gpu1]\ndestination = "ops@gpu1"\n')
    cat = HostCatalog(f, command="/venv/bin/llmconsole", data_dir="/srv/l")
    assert cat.lookup("gpu1").destination == Destination.parse("ops@gpu1")
    assert cat.lookup("gpu1").command == "llmconsole"  # a file entry keeps its own command
    adhoc = cat.lookup("ssh://me@gpu9:2200")
    assert (adhoc.name, adhoc.command, adhoc.data_dir) == ("me@gpu9:2200", "/venv/bin/llmconsole", "/srv/l")
    assert cat.lookup(LOCAL).is_local
    assert [h.name for h in cat.all_hosts()] == ["local", "gpu1"]
    assert HostCatalog(tmp_path / "none.toml").all_hosts() == [Host(name="local")]


def test_engine_at_host():
    assert split_engine("demo@gpu1") == ("demo", "gpu1")
    assert split_engine("demo@ops@gpu1") == ("demo", "ops@gpu1")
    assert split_engine("demo") == ("demo", None)
    for bad in ("@gpu1", "demo@"):
        with pytest.raises(HostsError):
            split_engine(bad)


# --- ssh, without a server -------------------------------------------------------------------


def test_ssh_never_prompts_and_the_destination_is_never_an_option():
    argv = ssh_argv("ops@gpu1", "llmconsole daemon dial-stdio", env={SSH_COMMAND_ENV: "ssh -F /tmp/cfg"})
    assert argv[:3] == ["ssh", "-F", "/tmp/cfg"]
    assert "BatchMode=yes" in argv
    assert argv[-3:] == ["--", "ops@gpu1", "llmconsole daemon dial-stdio"]
    assert (
        ssh_reason("Warning: Permanently added x\r\nssh: connect to host h port 1: Connection refused\r\n")
        == "Warning: Permanently added x / ssh: connect to host h port 1: Connection refused"
    )


def test_backoff_doubles_to_a_ceiling_and_resets_on_success():
    now = [100.0]
    b = Backoff(first_s=1, factor=2, max_s=5, clock=lambda: now[0])
    assert b.wait_s() == 0
    assert [b.failed("refused") for _ in range(5)] == [1, 2, 4, 5, 5]
    assert b.wait_s() == 5 and b.reason == "refused"
    now[0] += 5
    assert b.wait_s() == 0
    b.succeeded()
    assert b.failed("again") == 1


def test_an_unreachable_host_is_said_with_ssh_words_then_backed_off(monkeypatch):
    monkeypatch.setenv(SSH_COMMAND_ENV, "ssh -F /dev/null -o StrictHostKeyChecking=no")
    host = Host(name="nowhere", destination=Destination.parse("ssh://nobody@127.0.0.1:1"))
    with client_for(host, timeout_s=20) as c:
        with pytest.raises(HostUnreachable) as first:
            c.status()
        assert "Connection refused" in first.value.reason and first.value.retry_in_s is None
        with pytest.raises(HostUnreachable) as second:  # within the backoff: not even tried
            c.status()
        assert second.value.retry_in_s is not None and "Connection refused" in second.value.reason
        assert isinstance(second.value, DaemonNotRunning)  # callers that know no hosts still cope


def test_commands_that_run_on_the_host_go_there_as_typed(monkeypatch, tmp_path):
    """history, load, sweep, tune ...: the command line from the command on, ENGINE@HOST made the
    bare name, run by the host's llmconsole on its data dir; ssh's 255 is an unreachable host."""
    from llmconsole.console import cli, ssh

    (tmp_path / "hosts.toml").write_text('[hosts.gpu1]\ndestination = "ops@gpu1"\ndata_dir = "/srv/l"\n')
    monkeypatch.setenv("LLMCONSOLE_HOME", str(tmp_path))
    sent = []

    def fake_run_remote(destination, remote_command, *, host, tty=False, env=None):
        sent.append((destination, remote_command, host))
        return sent_code[0]

    sent_code = [0]
    monkeypatch.setattr(ssh, "run_remote", fake_run_remote)
    assert cli.main(["tune", "--engine", "demo@gpu1", "--workload", "concurrency=4", "--budget", "3"]) == 0
    assert cli.main(["--host", "gpu1", "load", "demo", "--concurrency", "2"]) == 0
    assert cli.main(["history", "--json", "demo@gpu1"]) == 0
    assert cli.main(["--host", "gpu1", "daemon", "install", "--user"]) == 0
    assert sent == [
        (
            "ops@gpu1",
            "env LLMCONSOLE_HOME=/srv/l llmconsole tune --engine demo --workload concurrency=4 --budget 3",
            "gpu1",
        ),
        ("ops@gpu1", "env LLMCONSOLE_HOME=/srv/l llmconsole load demo --concurrency 2", "gpu1"),
        ("ops@gpu1", "env LLMCONSOLE_HOME=/srv/l llmconsole history --json demo", "gpu1"),
        ("ops@gpu1", "env LLMCONSOLE_HOME=/srv/l llmconsole daemon install --user", "gpu1"),
    ]
    sent_code[0] = 255
    assert cli.main(["--host", "gpu1", "plan", "--model", "/m"]) == 4


# --- every host's report, bounded ------------------------------------------------------------


class _Silent:
    """A client whose host took the connection and says nothing: its read times out, or (a
    transport with no timeout of its own) it blocks until released."""

    def __init__(self, block: threading.Event | None = None):
        self.block = block

    def status_answer(self) -> dict:
        if self.block is not None:
            self.block.wait(60)
        raise httpx.ReadTimeout("gpu2 sent nothing for 20.0 s")

    def close(self) -> None:
        pass


class _Answering:
    def status_answer(self) -> StatusAnswer:
        return StatusAnswer.model_validate({"engines": [{"name": "e1"}]})

    def close(self) -> None:
        pass


def test_a_host_whose_read_times_out_is_slow_and_the_others_are_reported():
    gpu1, gpu2 = Host("gpu1", Destination.parse("gpu1")), Host("gpu2", Destination.parse("gpu2"))
    reports = gather([gpu1, gpu2], 20.0, clients={"gpu1": _Answering(), "gpu2": _Silent()})
    assert reports[0].running and [e.name for e in reports[0].engines] == ["e1"] and reports[0].answered
    slow = reports[1]
    assert slow.slow and slow.reachable and not slow.running and not slow.answered
    assert slow.error == "no answer within 20 s: the host took the connection, then said nothing"
    assert slow.to_json()["slow"] is True


def test_a_host_that_never_returns_is_given_up_on_after_its_timeout():
    released = threading.Event()
    gpu1, gpu2 = Host("gpu1", Destination.parse("gpu1")), Host("gpu2", Destination.parse("gpu2"))
    try:
        clients = {"gpu1": _Answering(), "gpu2": _Silent(released)}
        reports = gather([gpu1, gpu2], 0.5, clients=clients)
        assert not released.is_set(), "gather returned while gpu2's question was still out"
        assert reports[0].running and reports[1].slow and "no answer within" in (reports[1].error or "")
    finally:
        released.set()
