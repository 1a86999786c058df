"""Alerts and the automated responses to them: GET /v1/alerts."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from llmconsole.wire.base import WireModel


class ActiveAlert(WireModel):
    rule: str | None = None
    engine: str | None = None
    state: str | None = None
    for_s: float | None = None


class AlertRecord(WireModel):
    """An alert as the store keeps it."""

    id: int | None = None
    at: float | None = None
    engine: str | None = None
    rule: str | None = None
    severity: str | None = None
    state: str | None = None
    resolved_at: float | None = None
    detail: dict[str, Any] | None = None


class ResponseRecord(WireModel):
    """An automated response (an action whose kind is `response:...`)."""

    id: int | None = None
    at: float | None = None
    engine: str | None = None
    kind: str | None = None
    outcome: str | None = None
    detail: dict[str, Any] | None = None


class AlertsAnswer(WireModel):
    active: list[ActiveAlert] = Field(default_factory=list)
    alerts: list[AlertRecord] = Field(default_factory=list)
    responses: list[ResponseRecord] = Field(default_factory=list)
    settings: dict[str, Any] = Field(default_factory=dict)  # the response rules and what each does
