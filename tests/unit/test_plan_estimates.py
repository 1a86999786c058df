"""The planner's estimates: device profiles, the roofline against published measurements, cost."""

from __future__ import annotations

import math

import pytest

from llmconsole.engine.plan.cost import CostInputs, estimate_cost, tco_per_gpu_usd
from llmconsole.engine.plan.devices import (
    CPU_MEASURED_TOK_S,
    cpu_profile,
    device_names,
    gpu_profile,
    profile,
    profile_for_gpu_name,
    with_price,
)
from llmconsole.engine.plan.model_shape import read_shape, shape_from_config
from llmconsole.engine.plan.roofline import (
    FITTED,
    LLAMA2_7B_CONFIG,
    REFERENCE_DEVICE,
    REFERENCE_POINTS,
    StepModel,
    curve,
    fit_efficiencies,
    non_attention_step_s,
    operating_point,
)

LLAMA = shape_from_config(LLAMA2_7B_CONFIG)
REQUIRED = ["A100-40GB", "A100-80GB", "A10G", "V100S-32GB", "L4", "H100-80GB", "H200-141GB"]


def test_every_required_profile_ships_with_its_figures():
    assert set(REQUIRED) <= set(device_names())
    for name in REQUIRED:
        p = gpu_profile(name)
        assert p.memory_bytes > 16e9 and p.fp16_flop_s > 50e12 and p.memory_bandwidth_bytes_s > 250e9
        assert p.interconnect and p.interconnect_bytes_s > 0
    assert gpu_profile("a100-80gb").name == "A100-80GB"  # case-insensitive
    with pytest.raises(ValueError, match="unknown device"):
        gpu_profile("TPUv9")


def test_v100_class_cannot_run_bf16():
    v100 = gpu_profile("V100S-32GB")
    assert not v100.supports_bf16
    with pytest.raises(ValueError, match="cannot run bfloat16"):
        v100.peak_flop_s("bfloat16")
    assert all(gpu_profile(n).supports_bf16 for n in REQUIRED if n != "V100S-32GB")


def test_cpu_host_is_read_from_the_machine():
    import psutil

    p = profile("cpu")
    assert p.kind == "cpu" and p.memory_bytes == psutil.virtual_memory().total
    assert "assumed" in p.source
    measured = cpu_profile(measure_bandwidth=True)
    assert "measured" in measured.source and measured.memory_bandwidth_bytes_s > 1e8


@pytest.mark.parametrize("tokens", [1, 8, 32, 64])
def test_memory_bound_steps_match_vidurs_a100_profile_within_15_percent(tokens):
    ms = non_attention_step_s(gpu_profile(REFERENCE_DEVICE), LLAMA, tokens) * 1e3
    assert abs(ms - 9.3) / 9.3 < 0.15


def test_compute_bound_step_matches_vidurs_a100_profile_within_15_percent():
    ms = non_attention_step_s(gpu_profile(REFERENCE_DEVICE), LLAMA, 512) * 1e3
    assert abs(ms - 33.0) / 33.0 < 0.15


def test_shipped_efficiencies_are_the_fit_to_the_published_points():
    fit = fit_efficiencies(gpu_profile(REFERENCE_DEVICE))
    assert fit.memory == pytest.approx(FITTED.memory, abs=1e-3)
    assert fit.compute == pytest.approx(FITTED.compute, abs=1e-3)
    assert [t for t, _ in REFERENCE_POINTS] == [64, 512]


def _model(device: str, tp: int = 1) -> StepModel:
    return StepModel(gpu_profile(device), LLAMA, tp, 2, LLAMA.kv_bytes_per_token(2, tp))


def test_batching_trades_latency_for_throughput():
    points = curve(_model("A100-80GB"), 512, 128)
    tok_s = [p.output_tok_s for p in points]
    itl = [p.itl_s for p in points]
    assert tok_s == sorted(tok_s) and tok_s[-1] > 5 * tok_s[0]
    assert itl == sorted(itl) and itl[-1] > itl[0]
    # At batch 1 a 7B fp16 decode step is weight-bandwidth bound: ~14 GB at ~1.4 TB/s achieved.
    assert 8e-3 < points[0].itl_s < 14e-3


def test_faster_memory_decodes_faster_and_tensor_parallel_pays_its_all_reduce():
    a100, h200 = _model("A100-80GB"), _model("H200-141GB")
    assert h200.decode_step_s(1, 1024) < a100.decode_step_s(1, 1024)
    assert _model("A100-80GB", tp=2).decode_step_s(8, 1024) < a100.decode_step_s(8, 1024)
    pcie_tp2, pcie_tp1 = _model("A10G", tp=2), _model("A10G")
    # A 2,048-token prefill all-reduces 16 MiB twice per layer: PCIe takes many times NVLink's time.
    assert pcie_tp2._allreduce_s(2048) > 5 * _model("A100-80GB", tp=2)._allreduce_s(2048)
    # So two PCIe GPUs do not halve the step: the all-reduce is left over.
    assert pcie_tp2.prefill_s(2048) - pcie_tp1.prefill_s(2048) / 2 == pytest.approx(
        pcie_tp2._allreduce_s(2048), rel=0.05
    )


def test_tco_and_cost_per_million_tokens_follow_the_prices_given():
    inputs = CostInputs.defaults(
        electricity_usd_per_kwh=0.10,
        pue=1.5,
        average_power_fraction=1.0,
        host_overhead_fraction=0.0,
        ops_usd_per_gpu_year=0.0,
        years=3,
    )
    dev = with_price(gpu_profile("L4"), price_usd=2000, power_w=100)
    energy = 0.1 * 1.5 * 24 * 365 * 3 * 0.10  # kW x PUE x hours x $/kWh
    assert tco_per_gpu_usd(dev, inputs) == pytest.approx(2000 + energy)
    est = estimate_cost(
        dev, num_gpus=2, replica_requests_s=4.0, target_qps=10.0, tokens_per_request=1000, inputs=inputs
    )
    assert est.replicas == 3 and est.hardware_usd == 2000 * 2 * 3
    seconds = 3 * 365 * 24 * 3600
    assert est.usd_per_million_tokens == pytest.approx(est.tco_usd / seconds / (10 * 1000) * 1e6)
    with pytest.raises(ValueError, match="unknown cost setting"):
        CostInputs.defaults(bogus=1)


def test_costs_scale_with_price():
    cheap = tco_per_gpu_usd(with_price(gpu_profile("H100-80GB"), price_usd=20000), CostInputs.defaults())
    dear = tco_per_gpu_usd(with_price(gpu_profile("H100-80GB"), price_usd=40000), CostInputs.defaults())
    assert math.isclose(dear - cheap, 20000 * (1 + CostInputs.defaults().host_overhead_fraction))


@pytest.mark.parametrize("streams", sorted(CPU_MEASURED_TOK_S))
def test_cpu_estimate_matches_the_measured_tiny_engine_within_15_percent(tiny_model, streams):
    """The CPU host's step overhead, fitted to a real engine's measured throughput (see devices)."""
    shape = read_shape(tiny_model)
    dev = cpu_profile()
    step = StepModel(
        dev,
        shape,
        1,
        2,
        shape.kv_bytes_per_token(2),
        "bfloat16",
        step_overhead_s=dev.step_overhead_s,
        seq_overhead_s=dev.seq_overhead_s,
    )
    est = operating_point(step, streams, 100, 400).output_tok_s
    assert abs(est - CPU_MEASURED_TOK_S[streams]) / CPU_MEASURED_TOK_S[streams] < 0.15


@pytest.mark.parametrize(
    "nvml_name, expected",
    [
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100-PCIE-40GB", "A100-40GB"),
        ("NVIDIA A10G", "A10G"),
        ("Tesla V100S-PCIE-32GB", "V100S-32GB"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),
        ("NVIDIA H200", "H200-141GB"),
        ("NVIDIA GeForce RTX 4090", None),
        ("NVIDIA L40S", None),
    ],
)
def test_nvml_names_map_to_the_shipped_profiles(nvml_name, expected):
    assert profile_for_gpu_name(nvml_name) == expected
