"""`llmconsole plan`, in this process: exact figures, estimates, warnings and refusals. The fit
check on the daemon's start and restart path is in tests/integration/test_plan_daemon.py."""

from __future__ import annotations

import json

import pytest

from llmconsole.console.cli import main
from tests.support.paths import FIXTURES

TOPOLOGY = FIXTURES / "topology"


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
    rc, out, _ = plan(
        "--model",
        str(tiny_model),
        "--max-model-len",
        "512",
        "--kv-cache-memory-bytes",
        "100000000",
        "--workload",
        "prompt=100,output=64",
        "--device",
        "cpu",
        "--json",
    )
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
    rc, out, _ = plan(
        "--model",
        str(tiny_model),
        "--device",
        "V100S-32GB",
        "--workload",
        "prompt=1000,qps=2",
        "--cost",
        "electricity_usd_per_kwh=0.3",
    )
    assert rc == 0
    assert "cannot run bfloat16" in out and "dtype = float16" in out
    assert "[estimate]" in out and "estimates (roofline" in out
    assert "3-year TCO $" in out and "per million tokens at 2.00 req/s" in out


def test_plan_warns_of_pcie_tensor_parallel_from_a_recorded_topology(plan, tiny_model):
    rc, out, _ = plan(
        "--model", str(tiny_model), "--device", "A10G", "--tp", "2", "--topology", str(TOPOLOGY / "pcie_4gpu.json")
    )
    assert rc == 0 and "GPUs joined only by PCIe" in out and "fewer, larger GPUs" in out


def test_plan_refuses_bad_input_with_usage_exit(plan, tiny_model):
    for args, says in (
        (["--device", "TPUv9"], "unknown device"),
        (["--workload", "prompt=lots"], "not a whole number"),
        (["--cost", "bogus=1"], "unknown cost setting"),
        (["--max-num-seqs", "0"], "max_num_seqs"),
        (["--topology", "/nonexistent.json"], "nonexistent"),
    ):
        rc, _, err = plan("--model", str(tiny_model), *args)
        assert rc == 2 and says in err, (args, err)
    assert plan()[0] == 2


def test_plan_with_a_hub_name_recommends_without_arithmetic(plan):
    rc, out, _ = plan("--model", "meta-llama/Llama-2-7b-hf", "--json")
    p = json.loads(out)
    assert rc == 0 and p["exact"]["shape"] is None and p["recommendations"]
    assert "no local config.json" in p["notes"][0]
