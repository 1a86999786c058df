"""The daemon and its control API, without engines: lock, socket, errors that change nothing."""

import json
import os
import stat
import subprocess
import sys

from llmconsole.console.client import DaemonClient, DaemonError
from llmconsole.paths import resolve


def test_status_without_a_daemon_says_so(cli):
    r = cli("status", check=False)
    assert r.returncode == 3
    assert "no llmconsole daemon is running" in r.stderr


def test_one_daemon_per_home_with_a_private_socket(cli, home):
    r = cli("daemon", "start")
    assert "daemon started" in r.stdout
    sock = home / "run" / "control.sock"
    assert stat.S_ISSOCK(sock.stat().st_mode)
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600
    assert stat.S_IMODE((home / "run").stat().st_mode) == 0o700
    assert "already running" in cli("daemon", "start").stdout
    second = subprocess.run(
        [sys.executable, "-m", "llmconsole.daemon.main"], env=cli.env, capture_output=True, text=True, timeout=30
    )
    assert second.returncode == 3
    assert "already running" in second.stderr
    info = json.loads(cli("daemon", "status", "--json").stdout)
    assert info["running"] is True and info["engines"] == 0
    r = cli("daemon", "stop")
    assert "daemon stopped" in r.stdout
    assert not sock.exists()
    assert cli("daemon", "status", check=False).returncode == 3


def test_bad_flags_are_refused_before_anything_starts(cli, home, tiny_model):
    r = cli("engine", "start", "e1", "--model", str(tiny_model), "--max-num-seqs", "0", check=False)
    assert r.returncode == 2
    assert "max_num_seqs: Input should be greater than or equal to 1" in r.stderr
    assert not (home / "run" / "control.sock").exists(), "a refused spec must not even start the daemon"
    r = cli("engine", "start", "e1", "--model", str(home), check=False)
    assert r.returncode == 2 and "has no config.json" in r.stderr
    r = cli("engine", "start", "bad/name", "--model", str(tiny_model), check=False)
    assert r.returncode == 2 and "not valid" in r.stderr
    r = cli("engine", "start", "e1", "--max-num-seqs", "4", check=False)
    assert r.returncode == 2 and "is new: give it --model" in r.stderr
    assert cli.status()["engines"] == []


def test_api_rejects_bad_requests_with_reasons(cli, home, tiny_model):
    cli("daemon", "start")
    os.environ["LLMCONSOLE_HOME"] = str(home)
    try:
        client = DaemonClient(resolve())
    finally:
        del os.environ["LLMCONSOLE_HOME"]
    with client:
        for spec, words in (
            ({"model": str(tiny_model), "gpu_memory_utilization": 3}, "gpu_memory_utilization"),
            ({"model": str(tiny_model), "extra_args": ["--api-key", "k"]}, "secret"),
            ({"max_num_seqs": 4}, "model"),
        ):
            try:
                client.start_engine("e1", spec=spec)
            except DaemonError as e:
                assert e.status == 400
                assert words in str(e)
            else:
                raise AssertionError(f"accepted {spec}")
        for call in (
            lambda: client.stop_engine("nope"),
            lambda: client.logs("nope"),
            lambda: client.remove_engine("nope"),
        ):
            try:
                call()
            except DaemonError as e:
                assert e.status == 404 and "no engine named 'nope'" in str(e)
            else:
                raise AssertionError("unknown engine accepted")
        assert client.status()["engines"] == []
    r = cli("engine", "stop", "nope", "--yes", check=False)
    assert r.returncode == 2 and "no engine named" in r.stderr
