"""What the console remembers between polls: recent figures per engine, and earlier specs.

Both are bounded and updated from the UI thread only, once per applied snapshot. A sample is
added only when the daemon's scrape is newer than the last one kept, so polling faster than the
daemon scrapes (or a replay repeating its last frame) does not stretch the sparklines.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmconsole.console.tui.view import EngineView, Snapshot

HISTORY_POINTS = 300  # five minutes at the daemon's 1 Hz scrape

SERIES = ("generation_tok_s", "prompt_tok_s", "p99_ttft_s", "p99_e2e_s", "kv_cache_usage")


class MetricHistory:
    def __init__(self, points: int = HISTORY_POINTS):
        self.points = points
        self._series: dict[str, dict[str, collections.deque[float]]] = {}
        self._last_taken: dict[str, float] = {}

    def add(self, snapshot: Snapshot) -> None:
        for e in snapshot.engines:
            taken = e.metrics_taken_at_s
            if taken is None or e.metrics_stale or self._last_taken.get(e.name) == taken:
                continue
            self._last_taken[e.name] = taken
            per = self._series.setdefault(e.name, {})
            for key in SERIES:
                value = e.metric(key)
                if value is not None:
                    per.setdefault(key, collections.deque(maxlen=self.points)).append(value)
        known = {e.name for e in snapshot.engines}
        for gone in set(self._series) - known:
            del self._series[gone]
            self._last_taken.pop(gone, None)

    def series(self, engine: str, key: str) -> list[float]:
        return list(self._series.get(engine, {}).get(key, ()))


@dataclass(frozen=True)
class SpecVersion:
    config_id: str
    spec: Mapping[str, Any]


class SpecMemory:
    """The spec each engine had before its current one, as far as this console has seen."""

    def __init__(self) -> None:
        self._current: dict[str, SpecVersion] = {}
        self._previous: dict[str, SpecVersion] = {}

    def add(self, snapshot: Snapshot) -> None:
        for e in snapshot.engines:
            self._note(e)

    def _note(self, e: EngineView) -> None:
        cur = self._current.get(e.name)
        if cur is not None and cur.config_id == e.config_id:
            return
        if cur is not None:
            self._previous[e.name] = cur
        self._current[e.name] = SpecVersion(e.config_id, e.spec)

    def previous(self, engine: str) -> SpecVersion | None:
        return self._previous.get(engine)


def spec_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(field, old value, new value) for each field that differs, in the new spec's order."""
    keys = list(new) + [k for k in old if k not in new]
    return [(k, old.get(k), new.get(k)) for k in keys if old.get(k) != new.get(k)]
