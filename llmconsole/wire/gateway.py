"""The gateway's engine groups and their windows: GET/POST /v1/engines/{name}/window and
GET/PUT /v1/groups."""

from __future__ import annotations

from pydantic import Field

from llmconsole.wire.base import WireModel
from llmconsole.wire.status import ControllerState, GroupMember


class WindowState(ControllerState):
    """An engine's group window as the window routes answer it: the group's state, the engine it
    was asked for, and the group's door."""

    engine: str | None = None
    gateway_url: str | None = None


class GroupInfo(WireModel):
    """One group the gateway serves, as `group ls` shows it."""

    group: str = "?"
    named: bool = False
    retired: bool = False  # removed, still finishing what it had (no URL)
    engines: list[str] = Field(default_factory=list)
    members: dict[str, GroupMember] = Field(default_factory=dict)
    gateway_url: str | None = None
    window: int | None = None
    frozen: bool = False
    in_flight: int | None = None
    queued: int | None = None
    admitted_total: int | None = None


class GroupsAnswer(WireModel):
    """GET /v1/groups."""

    groups: list[GroupInfo] = Field(default_factory=list)
