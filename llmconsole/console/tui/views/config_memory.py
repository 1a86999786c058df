"""What the console remembers of each engine's config between polls: the spec it had before its
current one (updated from the UI thread, once per applied snapshot). The charts' figures are
charts/series.py's."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmconsole.console.tui.views.status import EngineView, Snapshot


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
