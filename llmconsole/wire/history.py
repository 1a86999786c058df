"""The store's history and exports on the control API: what a client asks, what the daemon answers.

The daemon is the one owner of the SQLite store; `llmconsole history` and `llmconsole export`
read it through these routes (daemon/api/history.py) rather than opening the file themselves:

  GET  /v1/history   HistoryQuery as query parameters -> HistoryAnswer
  POST /v1/export    ExportRequest -> ExportAnswer; the daemon writes the bundle into the folder
                     the client names (the client is this user, or root: SO_PEERCRED says so)

Answers ignore fields they do not know (a newer daemon's additions); requests refuse them, so
an older daemon never quietly drops a filter and answers with more than was asked for.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator


class _Answer(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")


class _Request(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class FieldChange(_Answer):
    """One spec field that differs from the parent config."""

    field: str
    before: Any
    after: Any


class ConfigVersionEntry(_Answer):
    """One config an engine has run (db/versions.py's VersionEntry), with its changes from the
    config it was derived from. The fields are in the order `history --json` prints them."""

    config_id: str
    verdict: str  # known_good | known_bad | pending
    runs: int
    first_used_at: float
    last_used_at: float
    in_use: bool
    label: str | None
    spec: dict[str, Any]
    derived_from: str | None  # the parent config; None for the engine's first
    diff_from_parent: list[FieldChange]


class ActionEntry(_Answer):
    """One entry of the action log: who changed what, from which config to which, how it ended."""

    id: int
    at: float
    actor: str
    kind: str
    from_config_id: str | None
    to_config_id: str | None
    outcome: str
    automatic: bool
    detail: dict[str, Any]


class HistoryQuery(_Request):
    """`engine`: one engine (it must have run, or be known to the daemon); None: every engine that
    ever ran. `actions`: the action log too."""

    engine: str | None = None
    actions: bool = False

    def params(self) -> dict[str, str]:
        """As query parameters."""
        out = {"actions": "true" if self.actions else "false"}
        if self.engine is not None:
            out["engine"] = self.engine
        return out


class HistoryAnswer(_Answer):
    """Each engine's versions, newest first; with `actions` asked for, each engine's action log,
    oldest first (None when not asked for)."""

    engines: dict[str, list[ConfigVersionEntry]]
    actions: dict[str, list[ActionEntry]] | None = None


class ExportRequest(_Request):
    """A bundle of the span (a session's, or everything since `since_s`, or everything) into
    `out_dir`, an absolute path: new, or an empty folder of this user's."""

    out_dir: str
    session_id: int | None = None
    since_s: float | None = None

    @field_validator("out_dir")
    @classmethod
    def _absolute(cls, v: str) -> str:
        if not PurePosixPath(v).is_absolute():
            raise ValueError(f"{v!r} is not an absolute path (the daemon's working folder is not the client's)")
        return v


class ExportAnswer(_Answer):
    """What was written: the folder, the span (since_s None: from the first record), the files
    (relative to the folder) and how many records of each table."""

    out_dir: str
    since_s: float | None
    until_s: float
    files: list[str]
    counts: list[tuple[str, int]]
