"""An engine's status built from its supervisor's state and its scraper's latest values.

Built only when something changed (the supervisor publishes it, engine/status_board.py), never
on a read: nothing here touches the engine's log or its processes, it takes what the scraper
already keeps.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Protocol

from llmconsole.engine import runtime as runtime_mod
from llmconsole.engine.crash_loop import FailureCounter
from llmconsole.engine.port_probe import connect_host
from llmconsole.engine.process import EngineProcess
from llmconsole.engine.scraper import EngineScraper
from llmconsole.engine.spec import EngineSpec
from llmconsole.engine.startup_log import StartupFacts
from llmconsole.engine.status import EngineState, EngineStatus


class Supervised(Protocol):
    """What a status is built from: the supervisor's state, read only (engine/supervisor.py)."""

    # fmt: off
    @property
    def name(self) -> str: ...
    @property
    def state(self) -> EngineState: ...
    @property
    def config_id(self) -> str: ...
    @property
    def spec(self) -> EngineSpec: ...
    @property
    def runtime(self) -> runtime_mod.Runtime | None: ...
    @property
    def proc(self) -> EngineProcess | None: ...
    @property
    def port(self) -> int | None: ...
    @property
    def restarts(self) -> int: ...
    @property
    def crash_looping(self) -> bool: ...
    @property
    def started_at_s(self) -> float | None: ...
    @property
    def ready_at_s(self) -> float | None: ...
    @property
    def last_exit_code(self) -> int | None: ...
    @property
    def last_error(self) -> str | None: ...
    @property
    def failures(self) -> FailureCounter: ...
    @property
    def backoff_s(self) -> float | None: ...
    @property
    def gave_up_reason(self) -> str | None: ...
    @property
    def failed_config(self) -> tuple[str, str] | None: ...
    @property
    def spec_error(self) -> str | None: ...
    @property
    def record_error(self) -> str | None: ...
    @property
    def port_note(self) -> str | None: ...
    @property
    def facts(self) -> StartupFacts | None: ...
    @property
    def scraper(self) -> EngineScraper: ...
    @property
    def log_path(self) -> Path: ...
    # fmt: on


class CustomKernelRefusals:
    """Why `kernel: custom` cannot run on a runtime, asked of the runtime's files once per
    runtime (kernels/support.py): a status is built often, the answer changes only with them."""

    def __init__(self) -> None:
        self._refusals: dict[runtime_mod.Runtime, str | None] = {}

    def refusal(self, runtime: runtime_mod.Runtime | None) -> str | None:
        """None: custom kernels can run there, or no runtime is known yet."""
        if runtime is None:
            return None
        if runtime not in self._refusals:
            from llmconsole.kernels.support import custom_kernel_refusal

            self._refusals[runtime] = custom_kernel_refusal(runtime.device, runtime.executable)
        return self._refusals[runtime]


def build_status(
    sup: Supervised, ready_mono: float | None, next_restart_mono: float | None, custom_refusal: str | None
) -> EngineStatus:
    """The status of `sup` as things are now. `ready_mono`: when the current run became ready;
    `next_restart_mono`: when a crashed engine is restarted (both monotonic seconds)."""
    now = time.monotonic()
    uptime = now - ready_mono if ready_mono and sup.state in (EngineState.READY, EngineState.UNHEALTHY) else None
    next_restart = (
        max(0.0, next_restart_mono - now)
        if next_restart_mono is not None and sup.state == EngineState.CRASHED
        else None
    )
    proc = sup.proc if sup.state.running else None
    ready = sup.state in (EngineState.READY, EngineState.UNHEALTHY)
    kernel = sup.scraper.log.kernel.report(sup.spec.kernel, ready) if proc is not None else None
    return EngineStatus(
        name=sup.name,
        state=sup.state,
        config_id=sup.config_id,
        model=sup.spec.model,
        served_model_name=sup.spec.display_name,
        device=sup.runtime.device if sup.runtime else "unknown",
        pid=proc.pid if proc is not None else None,
        port=sup.port,
        url=f"http://{connect_host(sup.spec.host)}:{sup.port}" if sup.port else None,
        restarts=sup.restarts,
        crash_looping=sup.crash_looping,
        adopted=bool(sup.proc and sup.proc.adopted),
        started_at_s=sup.started_at_s,
        ready_at_s=sup.ready_at_s,
        uptime_s=uptime,
        last_exit_code=sup.last_exit_code,
        last_error=sup.last_error,
        next_restart_in_s=next_restart,
        consecutive_failures=sup.failures.consecutive,
        backoff_s=sup.backoff_s if sup.state == EngineState.CRASHED else None,
        gave_up_reason=sup.gave_up_reason if sup.state == EngineState.FAILED else None,
        failed_config_id=sup.failed_config[0] if sup.failed_config else None,
        failed_reason=sup.failed_config[1] if sup.failed_config else None,
        spec_error=sup.spec_error,
        record_error=sup.record_error,
        port_note=sup.port_note,
        kv_cache_tokens=sup.facts.kv_cache_tokens if sup.facts else None,
        max_concurrency=sup.facts.max_concurrency if sup.facts else None,
        max_concurrency_len=sup.facts.max_concurrency_len if sup.facts else None,
        metrics=sup.scraper.metrics if ready else None,
        process=sup.scraper.process if proc is not None else None,
        start_phase=sup.scraper.log.start_phase if sup.state == EngineState.STARTING else None,
        spec=sup.spec.public_dict(),
        log_path=str(sup.log_path),
        kernel=kernel.kernel if kernel else None,
        kernel_note=kernel.note if kernel else None,
        kernel_usage=kernel.usage.as_dict() if kernel and kernel.usage else None,
        custom_kernel_refusal=custom_refusal,
    )
