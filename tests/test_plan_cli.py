"""`llmconsole plan`, and the fit check on the daemon's start and restart path."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from llmconsole.console.cli import main
from llmconsole.console.client import DaemonClient, DaemonError
from llmconsole.paths import resolve

TOPOLOGY = Path(__file__).parent / "fixtures" / "topology"
BAD = ["--max-model-len", "2048", "--kv-cache-memory-bytes", "100000"]


@pytest.fixture
def plan(capsys):
    """`llmconsole plan ...` in this process (it needs no daemon): (exit code, stdout, stderr)."""
    def run(*args: str):
        try:
            rc = main(["plan", *args])
        except SystemExit as e:  # argparse's own usage errors
            rc = e.code
        out = capsys.readouterr()
        return rc, out.out, out.err
    return run


def test_plan_json_holds_exact_figures_estimates_and_rules(plan, tiny_model):
    rc, out, _ = plan("--model", str(tiny_model), "--max-model-len", "512", "--kv-cache-memory-bytes", "100000000",
                      "--workload", "prompt=100,output=64", "--json")
    assert rc == 0
    p = json.loads(out)
    assert p["kv_capacity"]["tokens"] == 195_200 and p["kv_capacity_exact"] is True
    assert p["exact"]["kv_bytes_per_token"] == 512 and p["exact"]["bytes_per_block"] == 65_536
    assert p["exact"]["fit"]["ok"] is True
    assert p["estimates"]["label"].startswith("estimates")
    assert [pt["batch"] for pt in p["estimates"]["curve"]][:3] == [1, 2, 4]
    assert {r["setting"] for r in p["recommendations"]} >= {"max_num_seqs", "kv_cache_dtype"}
    assert all(r["rule"] for r in p["recommendations"])


def test_plan_text_on_a_gpu_profile_labels_estimates_and_prices(plan, tiny_model):
    rc, out, _ = plan("--model", str(tiny_model), "--device", "V100S-32GB", "--workload", "prompt=1000,qps=2",
                      "--cost", "electricity_usd_per_kwh=0.3")
    assert rc == 0
    assert "cannot run bfloat16" in out and "dtype = float16" in out
    assert "[estimate]" in out and "estimates (roofline" in out
    assert "3-year TCO $" in out and "per million tokens at 2.00 req/s" in out


def test_plan_warns_of_pcie_tensor_parallel_from_a_recorded_topology(plan, tiny_model):
    rc, out, _ = plan("--model", str(tiny_model), "--device", "A10G", "--tp", "2",
                      "--topology", str(TOPOLOGY / "pcie_4gpu.json"))
    assert rc == 0 and "GPUs joined only by PCIe" in out and "fewer, larger GPUs" in out


def test_plan_refuses_bad_input_with_usage_exit(plan, tiny_model):
    for args, says in ((["--device", "TPUv9"], "unknown device"), (["--workload", "prompt=lots"], "not a whole number"),
                       (["--cost", "bogus=1"], "unknown cost setting"), (["--max-num-seqs", "0"], "max_num_seqs"),
                       (["--topology", "/nonexistent.json"], "nonexistent")):
        rc, _, err = plan("--model", str(tiny_model), *args)
        assert rc == 2 and says in err, (args, err)
    assert plan()[0] == 2


def test_plan_with_a_hub_name_recommends_without_arithmetic(plan):
    rc, out, _ = plan("--model", "meta-llama/Llama-2-7b-hf", "--json")
    p = json.loads(out)
    assert rc == 0 and p["exact"]["shape"] is None and p["recommendations"]
    assert "no local config.json" in p["notes"][0]


def test_daemon_refuses_a_config_that_cannot_fit_with_the_numbers(cli, tiny_model, home):
    r = cli("engine", "start", "bad", "--model", str(tiny_model), *BAD, "--enforce-eager", check=False)
    assert r.returncode == 2, r.stderr
    assert "cannot hold one request of max_model_len 2,048" in r.stderr
    assert "needed: 1,114,112 bytes" in r.stderr and "available: 100,000 bytes" in r.stderr
    assert "nearest config that fits: kv_cache_memory_bytes=1,114,112" in r.stderr
    assert cli.engine("bad") is None  # nothing was created
    # The refusal itself, timed at the API: well under a second.
    spec = {"model": str(tiny_model), "max_model_len": 2048, "kv_cache_memory_bytes": 100_000}
    import os

    os.environ["LLMCONSOLE_HOME"] = str(home)
    try:
        with DaemonClient(resolve()) as c:
            t0 = time.perf_counter()
            try:
                c.start_engine("bad", spec=spec)
                raise AssertionError("the daemon accepted a config that cannot fit")
            except DaemonError as e:
                elapsed = time.perf_counter() - t0
                assert e.status == 400 and any(d.startswith("needed: ") for d in e.details)
            assert elapsed < 1.0
    finally:
        os.environ.pop("LLMCONSOLE_HOME", None)


def test_restart_into_a_config_that_cannot_fit_is_refused_and_changes_nothing(cli, tiny_model):
    cli("engine", "start", "ok", "--model", str(tiny_model), "--max-model-len", "512", "--kv-cache-memory-bytes",
        "10000000", "--enforce-eager", "--cpu-threads-bind", "nobind", "--no-wait")
    before = cli.engine("ok")
    r = cli("engine", "restart", "ok", *BAD, check=False)
    assert r.returncode == 2 and "nearest config that fits" in r.stderr
    after = cli.engine("ok")
    assert after["config_id"] == before["config_id"] and after["pid"] == before["pid"]
    cli("engine", "stop", "ok", "--yes", "--drain-timeout", "0")
