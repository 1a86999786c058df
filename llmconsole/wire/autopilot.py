"""The autopilot: GET /v1/autopilot, POST /v1/autopilot/{name} (on) and DELETE (off)."""

from __future__ import annotations

from pydantic import Field

from llmconsole.wire.base import WireModel


class AutopilotEvent(WireModel):
    """One thing a control did: when, which control, on which engine, what and why."""

    at_s: float | None = None
    control: str | None = None  # window, mode, standby or tune
    engine: str | None = None
    what: str | None = None
    why: str | None = None


class AutopilotControl(WireModel):
    on: bool = False
    setting: str | None = None  # what it holds (the SLO's latency, the mode policy, ...)
    now: str | None = None  # where it stands now
    did: int = 0  # events on the timeline since the autopilot went on


class AutopilotPilot(WireModel):
    """The autopilot of one group (an engine's own or a named one)."""

    group: str = "?"
    engines: list[str] = Field(default_factory=list)
    slo: dict[str, float] = Field(default_factory=dict)
    since_s: float | None = None
    for_s: float | None = None
    controls: dict[str, AutopilotControl] = Field(default_factory=dict)
    timeline: list[AutopilotEvent] = Field(default_factory=list)


class AutopilotAnswer(WireModel):
    on: bool = False
    pilots: list[AutopilotPilot] = Field(default_factory=list)
