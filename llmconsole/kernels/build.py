"""Compiling the CPU decode kernel on first use and remembering how it went.

The kernel ships as C++ source: a wheel cannot know the host's torch ABI, and building it
takes under a minute once, after which torch's extension loader finds the cached library.
The result (built or not, where, with what, and why not) is kept for `kernel_info()`.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CSRC_DIR = Path(__file__).parent / "csrc"
CPU_SOURCE = CSRC_DIR / "paged_attention_cpu.cpp"
EXTENSION_NAME = "llmconsole_paged_attention_cpu"
# AVX2 + FMA is the floor of every x86-64 host vLLM's CPU build supports; -march=native would
# tie the cached library to the machine that happened to build it.
CPU_CFLAGS = ("-O3", "-mavx2", "-mfma", "-fopenmp", "-std=c++17")
CPU_LDFLAGS = ("-fopenmp",)


class KernelBuildError(RuntimeError):
    """The CPU kernel could not be built; the message says what is missing."""


@dataclass
class CpuBuildStatus:
    built: bool = False
    library_path: str | None = None
    build_dir: str | None = None
    compiler: str | None = None
    cflags: tuple[str, ...] = CPU_CFLAGS
    ldflags: tuple[str, ...] = CPU_LDFLAGS
    error: str | None = None
    build_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "built": self.built,
            "library_path": self.library_path,
            "build_dir": self.build_dir,
            "compiler": self.compiler,
            "cflags": list(self.cflags),
            "ldflags": list(self.ldflags),
            "error": self.error,
            "build_s": self.build_s,
        }


_status = CpuBuildStatus()
_lock = threading.Lock()


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where compiled kernels live: $LLMCONSOLE_KERNEL_CACHE, else the user's cache
    ($XDG_CACHE_HOME or ~/.cache)/llmconsole/kernels.

    Deliberately not under LLMCONSOLE_HOME: a build is keyed by its source and flags (torch's
    loader rebuilds when either changes; CUDA builds have their own key), holds no state of
    any session, and costs 20-40 s, so every home and every engine on the host shares it.
    """
    env = os.environ if env is None else env
    explicit = env.get("LLMCONSOLE_KERNEL_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    xdg = env.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "llmconsole" / "kernels"


def find_cxx(env: Mapping[str, str] | None = None) -> str | None:
    """The C++ compiler torch's extension loader will call (it honours $CXX, else `c++`)."""
    env = os.environ if env is None else env
    candidate = env.get("CXX") or "c++"
    found = shutil.which(candidate.split()[0])
    if found is None and not env.get("CXX"):
        found = shutil.which("g++") or shutil.which("clang++")
    return found


def _missing_tools() -> list[str]:
    missing = []
    if find_cxx() is None:
        missing.append("a C++ compiler (install g++, e.g. `apt-get install g++`, or set CXX)")
    try:
        import ninja  # noqa: F401
    except ImportError:
        if shutil.which("ninja") is None:
            missing.append("ninja (`pip install ninja`), which torch uses to build extensions")
    return missing


def cpu_status() -> CpuBuildStatus:
    """What is known about the CPU build so far; does not build."""
    if not _status.built and _status.error is None:
        _status.compiler = find_cxx()
        _status.build_dir = str(cache_dir() / EXTENSION_NAME)
        lib = Path(_status.build_dir) / f"{EXTENSION_NAME}.so"
        if lib.exists():
            _status.library_path = str(lib)
    return _status


def load_cpu_kernel(verbose: bool = False) -> CpuBuildStatus:
    """Build (once per source change) and load the CPU kernel, registering
    torch.ops.llmconsole.*. Raises KernelBuildError naming what is missing."""
    with _lock:
        if _status.built:
            return _status
        _status.compiler = find_cxx()
        missing = _missing_tools()
        if missing:
            _status.error = "cannot build the CPU paged-attention kernel: missing " + "; ".join(missing)
            raise KernelBuildError(_status.error)
        import torch
        from torch.utils import cpp_extension

        build_dir = cache_dir() / EXTENSION_NAME
        build_dir.mkdir(parents=True, exist_ok=True)
        _status.build_dir = str(build_dir)
        started = time.monotonic()
        try:
            cpp_extension.load(
                name=EXTENSION_NAME,
                sources=[str(CPU_SOURCE)],
                extra_cflags=list(CPU_CFLAGS),
                extra_ldflags=list(CPU_LDFLAGS),
                build_directory=str(build_dir),
                is_python_module=False,
                verbose=verbose,
            )
        except Exception as exc:  # the compiler's own message is the useful part
            _status.error = f"building {CPU_SOURCE.name} failed: {exc}"
            raise KernelBuildError(_status.error) from exc
        _status.build_s = round(time.monotonic() - started, 2)
        if not hasattr(torch.ops.llmconsole, "paged_attention_decode"):
            _status.error = "the kernel library loaded but did not register torch.ops.llmconsole"
            raise KernelBuildError(_status.error)
        libs = sorted(build_dir.glob(f"{EXTENSION_NAME}*.so"), key=lambda p: p.stat().st_mtime)
        _status.library_path = str(libs[-1]) if libs else None
        _status.built = True
        _status.error = None
        return _status
