"""The vLLM plugin (entry point group `vllm.general_plugins`) that puts llmconsole's decode
kernel into an engine.

vLLM calls `register()` in every one of its processes (API server, engine core, workers) for
every engine on the host, including engines that never asked for the kernel. In every CPU
engine it asks for AMX tile state where the CPU has AMX (cpu_isa.py: without it vLLM's own
AMX attention dies of SIGILL); beyond that it does nothing unless the engine was started with
LLMCONSOLE_KERNEL=custom (set by the engine spec's `kernel: custom`), and even then it only
records class paths: the backend module, and with it the compiled kernel, loads when vLLM's
platform resolves the backend. On CPU engines that is CPU_ATTN (vllm_backend.py); on CUDA
engines FLASH_ATTN and TRITON_ATTN (vllm_cuda_backend.py), whichever vLLM selects. Other
platforms (ROCm, XPU, ...) keep their own backends and say so in the log.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

# Duplicated from llmconsole.engine.spec.KERNEL_ENV so that a plugin call in an engine that did
# not ask for the kernel imports nothing of llmconsole beyond this module and cpu_isa.
KERNEL_ENV = "LLMCONSOLE_KERNEL"
BACKEND_CLASS = "llmconsole.kernels.vllm_backend.LlmconsoleCpuAttentionBackend"
# vLLM's CUDA backends the CUDA backend module replaces, and the class in place of each.
CUDA_BACKEND_CLASSES = {
    "FLASH_ATTN": "llmconsole.kernels.vllm_cuda_backend.LlmconsoleFlashAttentionBackend",
    "TRITON_ATTN": "llmconsole.kernels.vllm_cuda_backend.LlmconsoleTritonAttentionBackend",
}

log = logging.getLogger("vllm.llmconsole_kernel")


def wanted(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return env.get(KERNEL_ENV, "").strip().lower() == "custom"


def register() -> None:
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        from llmconsole.kernels.cpu_isa import request_amx_tiles

        if request_amx_tiles() is False:
            log.warning(
                "llmconsole-kernel: the CPU reports AMX but this process was refused AMX "
                "tile state; vLLM's AMX attention may fail with SIGILL"
            )
    if not wanted():
        return
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    if current_platform.is_cpu():
        register_backend(AttentionBackendEnum.CPU_ATTN, BACKEND_CLASS)
        log.info("llmconsole-kernel: CPU attention backend set to %s", BACKEND_CLASS)
        return
    if current_platform.is_cuda():
        for name, path in CUDA_BACKEND_CLASSES.items():
            register_backend(AttentionBackendEnum[name], path)
        log.info(
            "llmconsole-kernel: CUDA attention backends %s set to llmconsole's (%s)",
            " and ".join(CUDA_BACKEND_CLASSES),
            ", ".join(CUDA_BACKEND_CLASSES.values()),
        )
        return
    # Read by status (usage.py's reader): the engine runs vLLM's attention, and why.
    log.warning(
        "llmconsole-kernel: %s=custom ignored: no custom kernel runs on %s engines",
        KERNEL_ENV,
        current_platform.device_type,
    )
