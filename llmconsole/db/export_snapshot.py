"""The records of one span as an export sees them: what export.py collects and report.py renders.

A module of its own so the report can name the snapshot without importing the exporter that
imports the report."""

from __future__ import annotations

from dataclasses import dataclass

from llmconsole.db.records import (
    Action,
    Alert,
    ConfigVersion,
    EngineRun,
    MetricSample,
    OperatorSession,
    Sweep,
    SweepPoint,
    WindowSample,
)


@dataclass(frozen=True)
class Span:
    since_s: float | None  # None: from the first record
    until_s: float


@dataclass(frozen=True)
class ExportSnapshot:
    """The records of one span, as the report and the writers see them."""

    span: Span
    session_id: int | None
    sessions: tuple[OperatorSession, ...]
    configs: tuple[ConfigVersion, ...]
    runs: tuple[EngineRun, ...]
    actions: tuple[Action, ...]
    alerts: tuple[Alert, ...]
    samples: tuple[MetricSample, ...]
    window: tuple[WindowSample, ...]
    sweeps: tuple[Sweep, ...]
    points: tuple[SweepPoint, ...]
