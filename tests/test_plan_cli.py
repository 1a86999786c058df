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
    # The CPU profile (vLLM's CPU block of 128 tokens) whatever GPU this host has.
    rc, out, _ = plan("--model", str(tiny_model), "--max-model-len", "512", "--kv-cache-memory-bytes", "100000000",
                      "--workload", "prompt=100,output=64", "--device", "cpu", "--json")
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


@pytest.mark.needs_cpu_vllm  # the figures are a CPU engine's (blocks of 128 tokens)
def test_daemon_refuses_configs_that_cannot_fit_on_start_and_restart(cli, tiny_model, home, monkeypatch):
    # The CLI: exit 2, the numbers, the nearest fit, and nothing created.
    r = cli("engine", "start", "bad", "--model", str(tiny_model), *BAD, "--enforce-eager", check=False)
    assert r.returncode == 2, r.stderr
    assert "cannot hold one request of max_model_len 2,048" in r.stderr
    assert "needed: 1,114,112 bytes" in r.stderr and "available: 100,000 bytes" in r.stderr
    assert "nearest config that fits: kv_cache_memory_bytes=1,114,112" in r.stderr
    assert cli.engine("bad") is None
    monkeypatch.setenv("LLMCONSOLE_HOME", str(home))
    bad = {"max_model_len": 2048, "kv_cache_memory_bytes": 100_000}
    with DaemonClient(resolve()) as c:
        # The API: a 400 with the numbers as details, timed at the socket: well under a second.
        t0 = time.perf_counter()
        with pytest.raises(DaemonError) as e:
            c.start_engine("bad", spec={"model": str(tiny_model), **bad})
        assert time.perf_counter() - t0 < 1.0
        assert e.value.status == 400 and any(d.startswith("needed: ") for d in e.value.details)
        # A restart into a misfit is refused the same way and leaves the engine as it was.
        ok = c.start_engine("ok", spec={"model": str(tiny_model), "max_model_len": 512, "enforce_eager": True,
                                        "kv_cache_memory_bytes": 10_000_000, "cpu_threads_bind": "nobind"})
        with pytest.raises(DaemonError) as e:
            c.restart_engine("ok", overrides=bad)
        assert e.value.status == 400 and any(d.startswith("nearest config that fits") for d in e.value.details)
        assert c.engine("ok")["config_id"] == ok["config_id"]
        # force takes it past the check: the daemon accepts it and vLLM will decide.
        forced = c.restart_engine("ok", overrides=bad, force=True)
        assert forced["config_id"] != ok["config_id"]
        c.stop_engine("ok", 0)
