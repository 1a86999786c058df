"""The engine spec: validation, argv for both entry points, config ids and diffs."""

import json
import sys

import pytest
from pydantic import ValidationError

from llmconsole.engine.runtime import CPU_SERVER_MODULE, Runtime
from llmconsole.engine.spec import EngineSpec, validation_messages

CPU = Runtime(kind="python-module", executable="/env/bin/python", device="cpu")
GPU = Runtime(kind="vllm-serve", executable="/env/bin/vllm", device="cuda")


@pytest.fixture
def model_dir(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    return d


def test_cpu_argv_uses_the_module_entry_and_vllm_flag_names(model_dir):
    spec = EngineSpec(
        model=str(model_dir),
        max_num_seqs=8,
        max_model_len=512,
        kv_cache_memory_bytes=10**8,
        num_gpu_blocks_override=12,
        enforce_eager=True,
        enable_prefix_caching=False,
    )
    argv = spec.argv(CPU, 18001)
    assert argv[:3] == ["/env/bin/python", "-m", CPU_SERVER_MODULE]
    assert argv[3:5] == ["--model", str(model_dir)]
    pairs = dict(zip(argv, argv[1:], strict=False))
    assert pairs["--host"] == "127.0.0.1"
    assert pairs["--port"] == "18001"
    assert pairs["--max-num-seqs"] == "8"
    assert pairs["--max-model-len"] == "512"
    assert pairs["--kv-cache-memory-bytes"] == str(10**8)
    assert pairs["--num-gpu-blocks-override"] == "12"
    assert "--enforce-eager" in argv
    assert "--no-enable-prefix-caching" in argv
    assert "--enable-chunked-prefill" not in argv and "--no-enable-chunked-prefill" not in argv


def test_gpu_argv_is_vllm_serve_with_positional_model(model_dir):
    spec = EngineSpec(
        model=str(model_dir),
        tensor_parallel_size=2,
        distributed_executor_backend="ray",
        gpu_memory_utilization=0.85,
        enable_chunked_prefill=True,
        kv_cache_dtype="fp8",
    )
    argv = spec.argv(GPU, 8000)
    assert argv[:3] == ["/env/bin/vllm", "serve", str(model_dir)]
    pairs = dict(zip(argv, argv[1:], strict=False))
    assert pairs["--tensor-parallel-size"] == "2"
    assert pairs["--distributed-executor-backend"] == "ray"
    assert pairs["--gpu-memory-utilization"] == "0.85"
    assert pairs["--kv-cache-dtype"] == "fp8"
    assert "--enable-chunked-prefill" in argv
    assert "--model" not in argv


def test_api_key_goes_to_the_environment_never_argv_or_id(model_dir):
    secret = "sk-test-do-not-leak-123"
    spec = EngineSpec(model=str(model_dir), api_key=secret)
    assert secret not in " ".join(spec.argv(CPU, 1234))
    assert spec.launch_env(CPU)["VLLM_API_KEY"] == secret
    assert secret not in json.dumps(spec.public_dict())
    assert spec.public_dict()["api_key_set"] is True
    assert spec.config_id == EngineSpec(model=str(model_dir)).config_id
    assert secret not in repr(spec)


def test_cpu_thread_binding_only_for_cpu_engines(model_dir):
    spec = EngineSpec(model=str(model_dir), cpu_threads_bind="0")
    assert spec.launch_env(CPU)["VLLM_CPU_OMP_THREADS_BIND"] == "0"
    assert "VLLM_CPU_OMP_THREADS_BIND" not in spec.launch_env(GPU)


def test_config_id_is_stable_and_changes_with_config(model_dir):
    a = EngineSpec(model=str(model_dir), max_num_seqs=8)
    b = EngineSpec(model=str(model_dir), max_num_seqs=8)
    c = EngineSpec(model=str(model_dir), max_num_seqs=16)
    assert a.config_id == b.config_id
    assert a.config_id != c.config_id
    assert len(a.config_id) == 12
    # Round-trips through JSON (the daemon's state file) keep the id.
    assert EngineSpec(**json.loads(json.dumps(a.config_dict()))).config_id == a.config_id


def test_diff_lists_changed_fields_only(model_dir):
    a = EngineSpec(model=str(model_dir), max_num_seqs=8, max_model_len=512)
    b = EngineSpec(model=str(model_dir), max_num_seqs=16, max_model_len=512, enforce_eager=True)
    assert a.diff(b) == [("max_num_seqs", 8, 16), ("enforce_eager", False, True)]
    assert a.diff(a) == []


@pytest.mark.parametrize(
    "fields, field_name, words",
    [
        ({"max_num_seqs": 0}, "max_num_seqs", "greater than or equal to 1"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization", "less than or equal to 1"),
        ({"port": 80}, "port", "greater than or equal to 1024"),
        ({"block_size": 7}, "block_size", "Input should be"),
        ({"extra_args": ["--api-key", "x"]}, "extra_args", "secret"),
        ({"extra_args": ["--swap-space", "4"]}, "extra_args", "no longer exists"),
        ({"extra_args": ["--max-num-seqs=4"]}, "extra_args", "spec field (max_num_seqs)"),
        ({"env": {"VLLM_API_KEY": "x"}}, "env", "api_key"),
        ({"max_num_seqs": 64, "max_num_batched_tokens": 32}, "spec", "at least max_num_seqs"),
        ({"bogus": 1}, "bogus", "Extra inputs"),
    ],
)
def test_bad_specs_name_the_field_and_the_rule(model_dir, fields, field_name, words):
    with pytest.raises(ValidationError) as e:
        EngineSpec(model=str(model_dir), **fields)
    msgs = validation_messages(e.value)
    assert any(m.startswith(field_name) and words in m for m in msgs), msgs


def test_model_directory_must_hold_a_config(tmp_path):
    with pytest.raises(ValidationError) as e:
        EngineSpec(model=str(tmp_path))
    assert "has no config.json" in " ".join(validation_messages(e.value))


def test_hub_names_pass_through(model_dir):
    assert EngineSpec(model="meta-llama/Llama-3.1-8B-Instruct").model == "meta-llama/Llama-3.1-8B-Instruct"


def test_spec_is_immutable(model_dir):
    spec = EngineSpec(model=str(model_dir))
    with pytest.raises(ValidationError):
        spec.max_num_seqs = 4


@pytest.mark.needs_vllm
def test_runtime_from_this_environment_is_the_vllm_installed_here():
    from llmconsole.engine.runtime import detect, from_path
    from tests.conftest import VLLM_BUILD

    rt = detect()
    if VLLM_BUILD == "cuda":  # a GPU host: `vllm serve` of the CUDA build
        assert rt.kind == "vllm-serve" and rt.device == "cuda"
        assert from_path(sys.executable).kind == "vllm-serve"
    else:
        assert rt.kind == "python-module" and rt.device == "cpu"
        assert from_path(sys.executable).kind == "python-module"
