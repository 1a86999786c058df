"""Whether `kernel: custom` can run on a runtime, answered before anything starts.

An engine asks for llmconsole's kernel through its environment (LLMCONSOLE_KERNEL=custom); what
puts the kernel in is the vLLM plugin of the runtime's own environment. So the question is asked
of that environment, read from its files without importing vLLM (milliseconds, no GPU needed):

- every runtime: the plugin (llmconsole's `vllm.general_plugins` entry point) is installed there;
- CUDA runtimes (the `vllm` package), in addition: a vLLM whose attention backends are the ones
  the CUDA backend (vllm_cuda_backend.py) subclasses, from the release it was written against
  on (MIN_CUDA_VLLM), and nvcc on this host to build the kernel's library for the engine's GPU
  on first use.

The CPU kernel also builds on first use; a host where it then fails to build still serves, on
vLLM's attention, and the engine says so in its log (status shows it). None of this says a
custom engine will be fast: only that it can run.

Kept free of torch and vLLM imports: the CLI and the daemon call it on every start.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sys
from pathlib import Path

from llmconsole.kernels.cuda_build import find_nvcc

PLUGIN_MODULE = "llmconsole.kernels.vllm_plugin"
# The vLLM release whose FlashAttention and Triton backends (class structure, metadata builders,
# KV-cache views) vllm_cuda_backend.py is written and checked against (tests/unit/test_kernel_cuda_backend.py).
MIN_CUDA_VLLM = (0, 32)
# vLLM's files the CUDA backend imports and subclasses, relative to the vllm package.
CUDA_BACKEND_SOURCES = (
    "v1/attention/backend.py",
    "v1/attention/backends/registry.py",
    "v1/attention/backends/flash_attn.py",
    "v1/attention/backends/triton_attn.py",
)


def _same_environment(executable: str) -> bool:
    """The runtime is the vLLM beside this process (its executable sits in our bin directory)."""
    return Path(executable).expanduser().absolute().parent == Path(sys.executable).absolute().parent


def _site_dirs(executable: str) -> list[Path]:
    prefix = Path(executable).expanduser().absolute().parent.parent
    return [
        d
        for pattern in ("lib/python3*/site-packages", "lib/python3*/dist-packages", "local/lib/python3*/dist-packages")
        for d in sorted(prefix.glob(pattern))
    ]


def _has_plugin(executable: str) -> bool:
    if _same_environment(executable):
        return any(
            ep.value.split(":")[0] == PLUGIN_MODULE
            for ep in importlib.metadata.entry_points(group="vllm.general_plugins")
        )
    for site in _site_dirs(executable):
        for entry_points in site.glob("*.dist-info/entry_points.txt"):
            try:
                if PLUGIN_MODULE in entry_points.read_text(errors="replace"):
                    return True
            except OSError:
                continue
    return False


def _vllm_package(executable: str) -> tuple[Path | None, str | None]:
    """(the vllm package directory, the `vllm` distribution's version) of the runtime's environment."""
    if _same_environment(executable):
        spec = importlib.util.find_spec("vllm")  # locates the package without importing it
        root = Path(spec.origin).parent if spec is not None and spec.origin else None
        try:
            version: str | None = importlib.metadata.version("vllm")
        except importlib.metadata.PackageNotFoundError:
            version = None
        return root, version
    for site in _site_dirs(executable):
        dists = sorted(site.glob("vllm-*.dist-info"))
        if dists and (site / "vllm").is_dir():
            return site / "vllm", dists[-1].name.removeprefix("vllm-").removesuffix(".dist-info")
    return None, None


def _release(version: str) -> tuple[int, int] | None:
    m = re.match(r"(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def custom_kernel_refusal(device: str, executable: str) -> str | None:
    """Why `kernel: custom` cannot run on the runtime (`device` "cpu" or "cuda", its executable),
    in words an operator can act on; None when it can."""
    if device not in ("cpu", "cuda"):
        return f"no custom kernel exists for {device} engines"
    if not _has_plugin(executable):
        return (
            f"llmconsole's vLLM plugin is not installed in the runtime's environment "
            f"({Path(executable).parent}): install llmconsole there (pip install -e .)"
        )
    if device == "cpu":
        return None
    root, version = _vllm_package(executable)
    if root is None or version is None:
        return f"no CUDA vLLM package found beside {executable}"
    release = _release(version)
    if release is None or release < MIN_CUDA_VLLM:
        return (
            f"the CUDA attention backend is written against vLLM "
            f"{'.'.join(map(str, MIN_CUDA_VLLM))} and later; this runtime has vLLM {version}"
        )
    missing = [f for f in CUDA_BACKEND_SOURCES if not (root / f).is_file()]
    if missing:
        return f"vLLM {version} lacks the attention backends the CUDA backend subclasses ({', '.join(missing)})"
    if find_nvcc() is None:
        return (
            "nvcc not found: the kernel's CUDA library is built on the engine's first start; "
            "install the CUDA toolkit or set CUDA_HOME"
        )
    return None
