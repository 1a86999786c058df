"""Sweeps and tunes that run in the daemon: POST/GET /v1/runs, GET /v1/runs/{id}."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from llmconsole.wire.base import WireModel


class RunSummary(WireModel):
    """A run at a glance (daemon/services/run_service.py)."""

    id: int | None = None
    kind: str | None = None  # sweep | tune
    engine: str | None = None
    state: str | None = None
    actor: str | None = None
    started_at: float | None = None
    finished_at: float | None = None
    request: dict[str, Any] = Field(default_factory=dict)  # what was asked, as it was asked
    events: int = 0  # how many progress events it has emitted
    cancel_requested: bool = False
    error: str | None = None


class RunAnswer(RunSummary):
    """A run with its progress events from `events_from` on, and its outcome once it ended. The
    events and the outcome are the runner's own records (a sweep's points, a tune's trials)."""

    events_from: int = 0
    new_events: list[dict[str, Any]] = Field(default_factory=list)
    outcome: dict[str, Any] | None = None


class RunsAnswer(WireModel):
    """GET /v1/runs."""

    runs: list[RunSummary] = Field(default_factory=list)
