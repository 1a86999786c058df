"""An engine's config history as people read it, and the choice of a version to roll back to.

The store keeps configs as `EngineSpec.public_dict()`: every field verbatim, and secrets only by
name, so a stored version cannot carry an API key or an HF_TOKEN. Rebuilding a runnable spec
from one takes the key from the engine's current spec (the key guards the engine; it is not
part of the config) and each secret env value, by name, from those the engine's daemon keeps in
its private state file; the rebuilt spec has the config id the version ran under.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from llmconsole.db.records import ConfigHistory
from llmconsole.db.report import config_diff
from llmconsole.db.store import Store
from llmconsole.engine.secrets import SECRET_VALUE
from llmconsole.engine.spec import EngineSpec, fill_secrets


class RollbackError(ValueError):
    """No version to roll back to, or the chosen one cannot run; the message says which."""


@dataclass(frozen=True)
class VersionEntry:
    """One config an engine has run, newest first, with what changed from the config it was
    derived from: the one the engine ran just before this one first ran."""

    config_id: str
    verdict: str  # known_good | known_bad | pending
    runs: int
    first_used_at: float
    last_used_at: float
    in_use: bool
    label: str | None
    spec: dict[str, Any]
    derived_from: str | None  # the parent config; None for the engine's first
    diff_from_parent: tuple[tuple[str, Any, Any], ...]  # (field, parent's, this one's)

    def to_json(self) -> dict[str, Any]:
        return {
            "config_id": self.config_id,
            "verdict": self.verdict,
            "runs": self.runs,
            "first_used_at": self.first_used_at,
            "last_used_at": self.last_used_at,
            "in_use": self.in_use,
            "label": self.label,
            "spec": self.spec,
            "derived_from": self.derived_from,
            "diff_from_parent": [{"field": f, "before": a, "after": b} for f, a, b in self.diff_from_parent],
        }


def parents(store: Store, engine: str) -> dict[str, str | None]:
    """Each config's parent: the config of the engine's run just before the config's first run.

    A new config comes from the one running then (a change of flags, a mode, a tune's apply),
    and runs of it later (a rollback to it, a restart) do not change where it came from; so its
    "what changed" reads the same however the versions are used afterwards."""
    out: dict[str, str | None] = {}
    before: str | None = None
    for run in store.runs(engine):  # oldest first
        if run.config_id not in out:
            out[run.config_id] = before
        before = run.config_id
    return out


def versions(store: Store, engine: str) -> list[VersionEntry]:
    """The engine's versions, most recently used first; each diffed against its parent config."""
    hist = store.config_versions(engine)
    specs = {h.config_id: h.spec for h in hist}
    parent_of = parents(store, engine)
    out = []
    for h in hist:
        parent = parent_of.get(h.config_id)
        diff = tuple(config_diff(specs[parent], h.spec)) if parent in specs else ()
        out.append(
            VersionEntry(
                h.config_id,
                h.verdict,
                len(h.run_ids),
                h.first_used_at,
                h.last_used_at,
                h.in_use,
                h.label,
                h.spec,
                parent,
                diff,
            )
        )
    return out


def choose_target(store: Store, engine: str, current_config_id: str, to_config_id: str | None = None) -> ConfigHistory:
    """The version to roll back to: `to_config_id` if given (it must be one this engine ran),
    else the last known-good one other than the current config."""
    if to_config_id is not None:
        for h in store.config_versions(engine):
            if h.config_id == to_config_id:
                return h
        raise RollbackError(
            f"engine {engine} never ran config {to_config_id}; `llmconsole history {engine}` lists the ones it did"
        )
    target = store.last_known_good(engine, exclude_config_id=current_config_id)
    if target is None:
        raise RollbackError(
            f"engine {engine} has no known-good config other than the current one ({current_config_id}) to roll back to"
        )
    return target


def spec_from_version(
    version: ConfigHistory, current: EngineSpec, secret_env: Mapping[str, str] | None = None
) -> EngineSpec:
    """A runnable spec for a stored version: the current spec's API key, and the values of its
    secret env vars from `secret_env` (name -> value, as the fleet keeps them) or, failing that,
    from the current spec's env."""
    fields = json.loads(version.spec_json)
    fields.pop("api_key_set", None)
    if current.api_key is not None:
        fields["api_key"] = current.api_key.get_secret_value()
    # Versions stored before extra args were kept verbatim may hold a scrubbed value.
    damaged = [a for a in fields.get("extra_args") or () if SECRET_VALUE in str(a)]
    if damaged:
        raise RollbackError(
            f"config {version.config_id} was stored with its extra args scrubbed "
            f"({', '.join(damaged)}): what it ran with is not known, so it is not relaunched"
        )
    try:
        fields["env"] = fill_secrets(
            fields.get("env") or {}, {**current.env, **(secret_env or {})}, what=f"config {version.config_id}"
        )
        spec = EngineSpec(**fields)
    except ValueError as e:  # e.g. its model directory was removed since
        raise RollbackError(f"config {version.config_id} can no longer run: {e}") from e
    return spec
