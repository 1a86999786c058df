"""How far a starting engine has come: the phase its log shows, the time since its launch, and
how long its last start took (the store's runs), so clients can draw a progress bar with an ETA.

vLLM says nothing about its start but its log; a start on two CPU cores takes about a minute,
and the console's gauges are N/A all that time. Reading the log's tail is cheap (64 KiB, only
for engines that are starting), and the expected time is looked up once per launch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llmconsole.db import Store
from llmconsole.engine.startup_log import read_tail, start_phase

TAIL_BYTES = 64 * 1024


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

    def of(self, engine: dict[str, Any], now_s: float) -> dict[str, Any] | None:
        """{"phase", "step", "steps", "elapsed_s", "expected_s"} for a starting engine, else None."""
        if engine.get("state") != "starting":
            return None
        launched = engine.get("started_at_s")
        log_path = engine.get("log_path")
        text = read_tail(Path(log_path), TAIL_BYTES) if log_path else ""
        phase = start_phase(text, engine.get("pid"))
        return {
            "phase": phase.name,
            "step": phase.step,
            "steps": phase.steps,
            "elapsed_s": None if launched is None else max(0.0, now_s - launched),
            "expected_s": None
            if launched is None
            else self.expected_s(engine["name"], engine.get("config_id", ""), launched),
        }
