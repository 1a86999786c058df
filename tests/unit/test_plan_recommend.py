"""Recommendations at each preset's boundaries, and the anti-pattern checks with their fixes."""

from __future__ import annotations

import types

import pytest

from llmconsole.engine import nvml
from llmconsole.engine.plan import topology as topo_mod
from llmconsole.engine.plan.kv_math import kv_capacity, layout_for
from llmconsole.engine.plan.model_shape import read_shape
from llmconsole.engine.plan.recommend import (
    Workload,
    check_batch_without_target,
    check_pcie_tensor_parallel,
    check_static_kv_on_short_prompts,
    parse_workload,
    recommend,
)
from llmconsole.engine.plan.topology import load_topology
from llmconsole.engine.spec import EngineSpec
from tests.support.paths import FIXTURES

TOPOLOGY = FIXTURES / "topology"


def _by_setting(recs):
    return {r.setting: r for r in recs}


@pytest.mark.parametrize(
    "prompt, batch, extra",
    [
        (1, 32, ("kv_cache_dtype", "auto")),
        (511, 32, ("kv_cache_dtype", "auto")),
        (512, 16, ("kv_cache_dtype", "bfloat16")),
        (4096, 16, ("p99_watch", True)),
        (4097, 4, ("enable_chunked_prefill", True)),
        (32768, 4, ("enable_chunked_prefill", True)),
    ],
)
def test_prompt_length_presets_at_their_boundaries(prompt, batch, extra):
    recs = _by_setting(recommend(Workload(prompt_tokens=prompt)))
    assert recs["max_num_seqs"].value == batch
    setting, value = extra
    assert recs[setting].value == value
    assert all(r.rule for r in recs.values())
    if prompt < 512:
        assert "under 512" in recs["max_num_seqs"].rule and "16-32" in recs["max_num_seqs"].rule
    elif prompt <= 4096:
        assert "512-4096" in recs["max_num_seqs"].rule and "p99" in recs["max_num_seqs"].rule
    else:
        assert "over 4096" in recs["max_num_seqs"].rule and "chunked prefill" in recs["max_num_seqs"].rule


def test_medium_prompts_get_16_bit_kv_in_the_models_own_16_bit_type():
    assert (
        _by_setting(recommend(Workload(prompt_tokens=1000), model_dtype="float16"))["kv_cache_dtype"].value == "float16"
    )
    assert _by_setting(recommend(Workload(prompt_tokens=1000)))["kv_cache_dtype"].value == "bfloat16"


@pytest.mark.parametrize("goal, batch", [("real-time", 8), ("throughput", 16)])
@pytest.mark.parametrize("prompt", [100, 2000, 8000])
def test_goal_sets_the_batch_and_says_so(goal, batch, prompt):
    r = _by_setting(recommend(Workload(prompt_tokens=prompt, goal=goal)))["max_num_seqs"]
    assert r.value == batch and f"goal {goal}" in r.rule


def test_batch_is_capped_by_what_the_kv_cache_holds(tiny_model):
    layout = layout_for(read_shape(tiny_model), device="cpu")
    cap = kv_capacity(layout, 0, 1024, num_blocks_override=50)  # 6.25 requests of 1,024 tokens
    r = _by_setting(recommend(Workload(prompt_tokens=100), kv_capacity=cap))["max_num_seqs"]
    assert r.value == 6 and "6.25" in r.detail


def test_v100_gets_float16_for_a_bf16_checkpoint():
    recs = _by_setting(recommend(Workload(), model_dtype="bfloat16", device_bf16=False))
    assert recs["dtype"].value == "float16" and "V100" in recs["dtype"].rule


def test_parse_workload_reads_every_field_and_rejects_bad_items():
    w = parse_workload("prompt=300, output=64,goal=throughput,p99=2.5,qps=4")
    assert w == Workload(300, 64, "throughput", 2.5, 4.0)
    for bad in ("prompt=abc", "tokens=3", "goal=fast", "prompt=0", "p99=-1"):
        with pytest.raises(ValueError):
            parse_workload(bad)


def test_raised_batch_without_a_latency_target_gets_a_hard_cap(tiny_model):
    spec = EngineSpec(model=str(tiny_model), max_num_seqs=17)
    f = check_batch_without_target(spec, Workload())
    assert f is not None and f.suggested == {"max_num_seqs": 16} and "hard cap" in f.fix
    assert check_batch_without_target(spec.model_copy(update={"max_num_seqs": 16}), Workload()) is None
    assert check_batch_without_target(spec, Workload(p99_target_s=1.0)) is None


def test_static_kv_share_on_short_prompts_is_sized_to_the_workload(tiny_model):
    layout = layout_for(read_shape(tiny_model), device="cpu")
    spec = EngineSpec(model=str(tiny_model), max_num_seqs=8, max_model_len=512, kv_cache_memory_bytes=100_000_000)
    cap = kv_capacity(layout, spec.kv_cache_memory_bytes, 512)
    f = check_static_kv_on_short_prompts(spec, Workload(prompt_tokens=100, output_tokens=64), layout, cap)
    # 8 requests of 164 tokens: 2 blocks each + the null block = 17 blocks of 64 KiB.
    assert f is not None and f.suggested["kv_cache_memory_bytes"] == 2 * 17 * 65_536
    assert check_static_kv_on_short_prompts(spec, Workload(prompt_tokens=512), layout, cap) is None
    small = kv_capacity(layout, 17 * 65_536 * 3, 512)
    assert check_static_kv_on_short_prompts(spec, Workload(prompt_tokens=100, output_tokens=64), layout, small) is None
    dynamic = EngineSpec(model=str(tiny_model), max_num_seqs=8)
    assert check_static_kv_on_short_prompts(dynamic, Workload(prompt_tokens=100), layout, cap) is None


def test_pcie_only_tensor_parallel_on_a_recorded_topology(tiny_model):
    pcie = load_topology(TOPOLOGY / "pcie_4gpu.json")
    f = check_pcie_tensor_parallel(EngineSpec(model=str(tiny_model), tensor_parallel_size=2), pcie)
    assert f is not None and "GPU0-GPU1 (PHB)" in f.problem
    assert "fewer, larger GPUs" in f.fix and f.suggested == {"tensor_parallel_size": 1}
    assert check_pcie_tensor_parallel(EngineSpec(model=str(tiny_model)), pcie) is None


def test_pcie_finding_points_at_an_nvlink_pair_when_there_is_one(tiny_model):
    pairs = load_topology(TOPOLOGY / "nvlink_pairs_4gpu.json")
    spec = EngineSpec(model=str(tiny_model), tensor_parallel_size=2)
    assert check_pcie_tensor_parallel(spec, pairs) is None  # GPUs 0 and 1 are bridged
    f = check_pcie_tensor_parallel(spec.model_copy(update={"tensor_parallel_size": 4}), pairs)
    assert f is not None and "fewer, larger GPUs" in f.fix  # no 4 GPUs are all NVLink-joined
    switch = load_topology(TOPOLOGY / "nvswitch_8gpu.json")
    assert check_pcie_tensor_parallel(spec.model_copy(update={"tensor_parallel_size": 8}), switch) is None
    assert switch.nvlink_group(8) == tuple(range(8))


def test_nvlink_placement_is_suggested_when_the_first_gpus_are_not_joined(tiny_model):
    topo = topo_mod.topology_from_json(
        {
            "gpus": [{"index": i, "name": "GPU"} for i in range(3)],
            "links": [
                {"a": 0, "b": 1, "nvlink": False, "path": "SYS"},
                {"a": 0, "b": 2, "nvlink": False, "path": "SYS"},
                {"a": 1, "b": 2, "nvlink": True, "path": "PXB"},
            ],
        }
    )
    f = check_pcie_tensor_parallel(EngineSpec(model=str(tiny_model), tensor_parallel_size=2), topo)
    assert f.suggested == {"env": {"CUDA_VISIBLE_DEVICES": "1,2"}}


def test_read_topology_turns_nvml_answers_into_links(monkeypatch):
    """NVML's answers for two GPUs, as pynvml returns them, become the recorded format."""
    answers = {"p2p": {(0, 1): 0}, "level": {(0, 1): 30}}
    fake = types.SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: b"NVIDIA A100-SXM4-80GB",
        nvmlDeviceGetP2PStatus=lambda a, b, cap: answers["p2p"][(a, b)] if cap == 3 else 1,
        nvmlDeviceGetTopologyCommonAncestor=lambda a, b: answers["level"][(a, b)],
    )
    monkeypatch.setattr(nvml, "NVML", nvml.Nvml(fake))
    t = topo_mod.read_topology()
    assert t.to_json()["links"] == [{"a": 0, "b": 1, "nvlink": True, "path": "PHB"}]
    answers["p2p"][(0, 1)] = 2  # NVML_P2P_STATUS_GPU_NOT_SUPPORTED
    assert topo_mod.read_topology().pcie_only_pairs()[0].path == "PHB"
    monkeypatch.setattr(nvml, "NVML", nvml.Nvml(None))
    assert topo_mod.read_topology() is None
