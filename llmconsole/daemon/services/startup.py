"""How far a starting engine has come: the phase its log shows, the time since its launch, and
how long its last start took (the store's runs), so clients can draw a progress bar with an ETA.

vLLM says nothing about its start but its log; a start on two CPU cores takes about a minute,
and the console's gauges are N/A all that time. The phase comes with the engine's published
status (its scraper follows the log as it grows: engine/run_log.py), so answering reads no file;
the expected time is looked up once per launch.
"""

from __future__ import annotations

from typing import Any

from llmconsole.db import Store
from llmconsole.engine.startup_log import start_phase
from llmconsole.engine.status import EngineState, EngineStatus


class StartupProgress:
    def __init__(self, store: Store | None) -> None:
        self.store = store
        self._expected: dict[tuple[str, float], float | None] = {}  # (engine, launched at) -> seconds

    def expected_s(self, engine: str, config_id: str, launched_at_s: float) -> float | None:
        """How long the engine's last start that became ready took: of this config if it has one."""
        key = (engine, launched_at_s)
        if key not in self._expected:
            self._expected = {k: v for k, v in self._expected.items() if k[0] != engine}  # one launch each
            self._expected[key] = self._look_up(engine, config_id, launched_at_s)
        return self._expected[key]

    def _look_up(self, engine: str, config_id: str, launched_at_s: float) -> float | None:
        if self.store is None:
            return None
        try:
            runs = [
                r
                for r in self.store.runs(engine, limit=20)
                if r.ready_at is not None and r.started_at < launched_at_s - 1.0
            ]
        except Exception:  # a busy or damaged store costs the estimate, never the status
            return None
        same = [r for r in runs if r.config_id == config_id]
        last = (same or runs)[-1] if runs else None
        return None if last is None or last.ready_at is None else max(0.0, last.ready_at - last.started_at)

    def of(self, status: EngineStatus, now_s: float) -> dict[str, Any] | None:
        """{"phase", "step", "steps", "elapsed_s", "expected_s"} for a starting engine, else None."""
        if status.state != EngineState.STARTING:
            return None
        launched = status.started_at_s
        phase = status.start_phase or start_phase("")  # its log has not been read yet: launching
        return {
            "phase": phase.name,
            "step": phase.step,
            "steps": phase.steps,
            "elapsed_s": None if launched is None else max(0.0, now_s - launched),
            "expected_s": None if launched is None else self.expected_s(status.name, status.config_id, launched),
        }
