"""A host's export bundle, written by the daemon, which owns the store, into a folder its client
names (`llmconsole export`; the client is this user or root, SO_PEERCRED says so).

The bundle is db/export.py's; what the daemon adds is what only the host knows: which logs
belong to the span (each engine that ran in it, and the daemon's own), the secrets the export
must prove absent (the API keys and secret env values in its state file, the keys of other
hosts' engines in its groups), and the tuner's study journal.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from llmconsole.db import Store
from llmconsole.db.export import ExportResult, export_bundle
from llmconsole.paths import Paths
from llmconsole.wire.history import ExportRequest

log = logging.getLogger(__name__)


def known_secrets(state_file: Path) -> list[str]:
    """Secrets the daemon holds (its state file: API keys, secret env values; the keys of other
    hosts' engines in its groups), so the export can prove none leaked."""
    out: list[str] = []
    try:
        data = json.loads(state_file.read_text())
    except (OSError, ValueError):
        data = {}
    for rec in data.get("engines", {}).values():
        spec = rec.get("spec") or {}
        out += [spec["api_key"]] if spec.get("api_key") else []
        out += [v for v in (rec.get("secret_env") or {}).values() if v]
    try:
        remote = json.loads((state_file.parent / "remote-members.json").read_text())
    except (OSError, ValueError):
        remote = {}
    for member in (remote.get("members") or {}).values():
        out += [member["api_key"]] if isinstance(member, dict) and member.get("api_key") else []
    return out


def write_bundle(store: Store, paths: Paths, request: ExportRequest, *, user: str) -> ExportResult:
    """The bundle of the span `request` names into its folder; ExportError (nothing written, or
    what was written removed) when that cannot be done safely. Blocking: run it in a thread."""
    engines = sorted({r.engine for r in store.runs(since=request.since_s)})
    logs = {name: paths.engine_log(name) for name in engines}
    logs["daemon"] = paths.daemon_log
    result = export_bundle(
        store,
        Path(request.out_dir),
        session_id=request.session_id,
        since_s=request.since_s,
        logs={k: v for k, v in logs.items() if v.exists()},
        secrets=known_secrets(paths.state_file),
        tunes_journal=paths.data_dir / "tuning" / "studies.journal",
    )
    log.info("exported %d files to %s for %s", len(result.files), result.out_dir, user)
    return result
