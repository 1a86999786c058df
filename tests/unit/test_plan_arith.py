"""The planner's exact arithmetic: model shape, KV bytes and blocks, and the fit check's refusals."""

from __future__ import annotations

import json
import math
import shutil
import struct
import time
from pathlib import Path

import pytest

from llmconsole.engine.plan.kv_math import blocks_for, kv_bytes_for, kv_capacity, layout_for
from llmconsole.engine.plan.model_shape import ModelShapeError, read_shape, shape_from_config
from llmconsole.engine.plan.roofline import LLAMA2_7B_CONFIG
from llmconsole.engine.plan.validate import ConfigDoesNotFit, HostMemory, Neighbour, enforce, validate
from llmconsole.engine.spec import EngineSpec
from llmconsole.engine.startup_log import parse_facts
from tests.support.paths import FIXTURES

CPU_24G = HostMemory("cpu", 24 * 2**30, 0)


def _safetensors_params(path: Path) -> int:
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")


def test_parameter_count_equals_the_checkpoints_tensors(tiny_model):
    shape = read_shape(tiny_model)
    assert shape.param_count == _safetensors_params(tiny_model / "model.safetensors")
    assert shape.weight_bytes() == 2 * shape.param_count  # bfloat16


def test_llama2_7b_shape_matches_its_published_parameter_count():
    shape = shape_from_config(LLAMA2_7B_CONFIG)
    assert shape.param_count == 6_738_415_616
    # 2 x 32 layers x 32 KV heads x 128 dims x 2 bytes = 512 KiB per token; halved per rank at TP 2.
    assert shape.kv_bytes_per_token(2) == 524_288
    assert shape.kv_bytes_per_token(2, tensor_parallel_size=2) == 262_144


def test_kv_heads_are_replicated_when_tp_exceeds_them(tiny_model):
    shape = read_shape(tiny_model)  # 2 KV heads
    assert shape.kv_heads_per_rank(4) == 1
    assert shape.kv_bytes_per_token(2, 4) == shape.kv_bytes_per_token(2, 2)


def test_shape_reads_multimodal_text_config_and_rejects_incomplete_configs(tmp_path):
    cfg = {"architectures": ["X"], "text_config": {**LLAMA2_7B_CONFIG, "num_key_value_heads": 8}}
    assert shape_from_config(cfg).num_kv_heads == 8
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64}))
    with pytest.raises(ModelShapeError, match="num_hidden_layers"):
        read_shape(tmp_path)


def test_capacity_reproduces_a_recorded_startup_line(tiny_model):
    facts = parse_facts((FIXTURES / "startup" / "ready_cpu.log").read_text())
    layout = layout_for(read_shape(tiny_model), device="cpu")
    cap = kv_capacity(layout, 100_000_000, facts.max_concurrency_len)
    assert (cap.tokens, f"{cap.max_concurrency:.2f}") == (facts.kv_cache_tokens, f"{facts.max_concurrency:.2f}")
    assert layout.bytes_per_block == 128 * 512 and cap.num_blocks == 1525


def test_reported_tokens_follow_vllms_concurrency_formula_not_blocks_times_block_size(tiny_model):
    layout = layout_for(read_shape(tiny_model), device="cpu")
    cap = kv_capacity(layout, 50_000_001, 500)  # 762 blocks; 4 blocks per 500-token request
    assert cap.num_blocks == 762 and cap.tokens == 95_250 != 762 * 128


def test_smallest_sizes_that_fit_sit_exactly_on_the_boundary(tiny_model):
    layout = layout_for(read_shape(tiny_model), device="cpu")
    need = kv_bytes_for(layout, 2048)
    assert kv_capacity(layout, need, 2048).fits
    assert not kv_capacity(layout, need - 1, 2048).fits
    assert kv_capacity(layout, 0, 2048, blocks_for(layout, 2048)).fits
    assert not kv_capacity(layout, 0, 2048, blocks_for(layout, 2048) - 1).fits


def test_refusal_says_needed_available_and_the_nearest_fit(tiny_model):
    spec = EngineSpec(model=str(tiny_model), max_model_len=2048, kv_cache_memory_bytes=100_000)
    t0 = time.perf_counter()
    v = validate(spec, CPU_24G)
    assert time.perf_counter() - t0 < 1.0
    assert not v.ok and v.exact
    # 2048 tokens = 16 blocks of 65,536 bytes, plus the null block.
    assert v.needed_bytes == 17 * 65_536 and v.available_bytes == 100_000
    assert v.nearest == {"kv_cache_memory_bytes": 17 * 65_536}
    details = "\n".join(v.details())
    assert "needed: 1,114,112 bytes" in details and "available: 100,000 bytes" in details
    # The nearest config really fits.
    assert validate(spec.model_copy(update=v.nearest), CPU_24G).ok


def test_a_kv_size_beyond_the_host_offers_the_largest_that_fits(tiny_model):
    spec = EngineSpec(model=str(tiny_model), max_model_len=2048, kv_cache_memory_bytes=40 * 2**30)
    v = validate(spec, CPU_24G)
    assert not v.ok and "exceed this host's memory" in v.reason
    largest = v.nearest["kv_cache_memory_bytes"]
    # Not the smallest size that holds one request (about a megabyte): the most the host can give.
    assert 23 * 2**30 < largest <= 24 * 2**30 and largest % 65_536 == 0
    assert validate(spec.model_copy(update=v.nearest), CPU_24G).ok
    assert not validate(spec.model_copy(update={"kv_cache_memory_bytes": largest + 65_536}), CPU_24G).ok


def test_block_override_refusal_offers_blocks_and_a_shorter_context(tiny_model):
    spec = EngineSpec(model=str(tiny_model), max_model_len=300, num_gpu_blocks_override=3)
    v = validate(spec, CPU_24G)
    assert not v.ok
    assert v.nearest == {"num_gpu_blocks_override": 4}  # 3 blocks per request + the null block
    assert v.alternatives == ({"max_model_len": 256},)
    for fix in (v.nearest, *v.alternatives):
        assert validate(spec.model_copy(update=fix), CPU_24G).ok


def test_legacy_kv_space_variable_wins_over_the_flag(tiny_model):
    spec = EngineSpec(
        model=str(tiny_model), max_model_len=2048, kv_cache_memory_bytes=100_000, env={"VLLM_CPU_KVCACHE_SPACE": "1"}
    )
    assert validate(spec, CPU_24G).ok  # 1 GiB, as vLLM's CPU platform reads it


def test_enforce_refuses_unless_forced_and_skips_what_it_cannot_know(tiny_model):
    bad = EngineSpec(model=str(tiny_model), max_model_len=2048, kv_cache_memory_bytes=100_000)
    with pytest.raises(ConfigDoesNotFit) as e:
        enforce(bad, mem=CPU_24G)
    assert e.value.verdict.needed_bytes == 1_114_112
    assert enforce(bad, force=True, mem=CPU_24G) is None
    hub = validate(EngineSpec(model="meta-llama/Llama-2-7b-hf", kv_cache_memory_bytes=1), CPU_24G)
    assert hub.ok and not hub.checked and "no local config.json" in hub.notes[0]


def test_kv_larger_than_the_host_is_refused(tiny_model):
    spec = EngineSpec(model=str(tiny_model), max_model_len=512, kv_cache_memory_bytes=30 * 2**30)
    v = validate(spec, CPU_24G)
    assert not v.ok and "exceed this host's memory" in v.reason


def test_a_kv_size_that_fits_alone_but_not_beside_the_running_engines_is_refused_with_their_numbers(tiny_model):
    gib = 2**30
    spec = EngineSpec(model=str(tiny_model), max_model_len=512, kv_cache_memory_bytes=20 * gib)
    assert validate(spec, CPU_24G).ok  # alone on the host it fits
    ready = Neighbour("a", kv_bytes=3 * gib, rss_bytes=3 * gib + 500 * 2**20, kv_allocated=True)
    starting = Neighbour("b", kv_bytes=gib, rss_bytes=400 * 2**20, kv_allocated=False)
    # A ready engine's RSS holds its KV cache; one still starting has its KV cache to come.
    assert ready.footprint_bytes == 3 * gib + 500 * 2**20 and starting.footprint_bytes == gib + 400 * 2**20
    v = validate(spec, CPU_24G, beside=[ready, starting])
    assert not v.ok and v.exact
    left = 24 * gib - ready.footprint_bytes - starting.footprint_bytes
    assert v.available_bytes == left and v.needed_bytes > left
    assert f"leave {left:,}" in v.reason and "a (KV 3,221,225,472, RSS 3,745,513,472" in v.reason
    assert "b (KV 1,073,741,824, RSS 419,430,400, KV not allocated yet" in v.reason
    fix = v.nearest["kv_cache_memory_bytes"]
    assert validate(spec.model_copy(update=v.nearest), CPU_24G, beside=[ready, starting]).ok
    assert not validate(
        spec.model_copy(update={"kv_cache_memory_bytes": fix + 65_536}), CPU_24G, beside=[ready, starting]
    ).ok
    with pytest.raises(ConfigDoesNotFit):
        enforce(spec, mem=CPU_24G, beside=[ready, starting])
    assert enforce(spec, force=True, mem=CPU_24G, beside=[ready, starting]) is None
    # Small neighbours leave room: the same config fits beside them.
    small = Neighbour("c", kv_bytes=100_000_000, rss_bytes=gib, kv_allocated=True)
    assert validate(spec, CPU_24G, beside=[small]).ok


def _llama_dir(tmp_path: Path, **over) -> Path:
    d = tmp_path / "llama"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps({**LLAMA2_7B_CONFIG, **over}))
    return d


def test_gpu_weights_that_cannot_fit_are_refused_with_a_tensor_parallel_fix(tmp_path):
    # Llama-2-13B-sized: 13.0e9 parameters, 26 GB in fp16, on a 24 GB GPU.
    model = _llama_dir(
        tmp_path,
        hidden_size=5120,
        intermediate_size=13824,
        num_attention_heads=40,
        num_key_value_heads=40,
        num_hidden_layers=40,
    )
    gpu = HostMemory("cuda", 24_146_608_128)
    v = validate(EngineSpec(model=str(model)), gpu)
    assert not v.ok and "weights" in v.reason and v.nearest == {"tensor_parallel_size": 2}
    assert v.needed_bytes == read_shape(model).weight_bytes()
    assert validate(EngineSpec(model=str(model), tensor_parallel_size=2), gpu).ok


def test_gpu_without_explicit_kv_refuses_only_beyond_the_upper_bound(tmp_path):
    model = _llama_dir(tmp_path)  # 13.5 GB of weights, 512 KiB of KV per token
    gpu = HostMemory("cuda", 24_146_608_128)
    ok = validate(EngineSpec(model=str(model), max_model_len=4096), gpu)
    assert ok.ok and not ok.exact
    # 0.92 x 24.1 GB - 13.5 GB leaves ~8.7 GB: about 16.6k tokens at most.
    bad = validate(EngineSpec(model=str(model), max_model_len=32768), gpu)
    assert not bad.ok and bad.nearest["max_model_len"] == bad.available_bytes // 524_288
    assert validate(EngineSpec(model=str(model), max_model_len=bad.nearest["max_model_len"]), gpu).ok


def test_gpu_explicit_kv_uses_whole_tokens_when_the_block_size_is_the_backends(tmp_path):
    model = _llama_dir(tmp_path)
    gpu = HostMemory("cuda", 85_899_345_920)
    just = 4096 * 524_288
    assert validate(EngineSpec(model=str(model), max_model_len=4096, kv_cache_memory_bytes=just), gpu).ok
    assert not validate(EngineSpec(model=str(model), max_model_len=4096, kv_cache_memory_bytes=just - 1), gpu).ok


def test_missing_config_dir_is_a_clear_error(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text("{not json")
    v = validate(EngineSpec(model=str(model)), CPU_24G)
    assert v.ok and not v.checked and "unreadable" in v.notes[0]
    shutil.rmtree(model)


def test_a_hub_name_is_checked_from_the_hugging_face_cache(tmp_path, monkeypatch, tiny_model):
    """vLLM loads a hub name from the cache's snapshot that refs/main names: so does the check."""
    repo = tmp_path / "hub" / "models--acme--tiny-chat"
    snap = repo / "snapshots" / "0123abcd"
    snap.mkdir(parents=True)
    shutil.copy(tiny_model / "config.json", snap / "config.json")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd\n")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    v = validate(EngineSpec(model="acme/tiny-chat", max_model_len=2048, kv_cache_memory_bytes=100_000), CPU_24G)
    assert v.checked and not v.ok and v.needed_bytes == 1_114_112
    assert not validate(EngineSpec(model="acme/other", kv_cache_memory_bytes=1), CPU_24G).checked


def test_default_max_model_len_is_the_smallest_limit_the_config_names():
    cfg = {**LLAMA2_7B_CONFIG, "max_position_embeddings": 8192, "seq_length": 4096}
    assert shape_from_config(cfg).default_max_model_len == 4096
    assert shape_from_config({**cfg, "model_max_length": 16384}).default_max_model_len == 16384
