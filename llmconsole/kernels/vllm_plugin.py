"""The vLLM plugin (entry point group `vllm.general_plugins`) that puts llmconsole's decode
kernel into an engine.

vLLM calls `register()` in every one of its processes (API server, engine core, workers) for
every engine on the host, including engines that never asked for the kernel. In every CPU
engine it asks for AMX tile state where the CPU has AMX (cpu_isa.py: without it vLLM's own
AMX attention dies of SIGILL); beyond that it does nothing unless the engine was started with
LLMCONSOLE_KERNEL=custom (set by the engine spec's `kernel: custom`), and even then it only
records a class path: the backend module, and with it the compiled kernel, loads when vLLM's
CPU platform resolves CPU_ATTN.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

# Duplicated from llmconsole.engine.spec.KERNEL_ENV so that a plugin call in an engine that did
# not ask for the kernel imports nothing of llmconsole beyond this module and cpu_isa.
KERNEL_ENV = "LLMCONSOLE_KERNEL"
BACKEND_CLASS = "llmconsole.kernels.vllm_backend.LlmconsoleCpuAttentionBackend"

log = logging.getLogger("vllm.llmconsole_kernel")


def wanted(env: Mapping[str, str] | None = None) -> bool:
    env = os.environ if env is None else env
    return env.get(KERNEL_ENV, "").strip().lower() == "custom"


def register() -> None:
    from vllm.platforms import current_platform

    if current_platform.is_cpu():
        from llmconsole.kernels.cpu_isa import request_amx_tiles

        if request_amx_tiles() is False:
            log.warning("llmconsole-kernel: the CPU reports AMX but this process was refused AMX "
                        "tile state; vLLM's AMX attention may fail with SIGILL")
    if not wanted():
        return
    if not current_platform.is_cpu():
        # The compiled kernel here is the CPU one; GPU engines keep their own backends.
        log.warning("llmconsole-kernel: %s=custom ignored: the custom kernel runs on CPU "
                    "engines only (this one is %s)", KERNEL_ENV, current_platform.device_type)
        return
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    register_backend(AttentionBackendEnum.CPU_ATTN, BACKEND_CLASS)
    log.info("llmconsole-kernel: CPU attention backend set to %s", BACKEND_CLASS)
