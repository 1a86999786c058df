"""`llmconsole history`, `rollback` and `export`: the store, read directly or through the daemon.

history and export open the database themselves (read-only use), so they work with no daemon
running; rollback restarts an engine, so it goes through the daemon like every other change.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmconsole.console.cli_common import EXIT_USAGE, CliError, confirm, daemon_client
from llmconsole.paths import resolve

if TYPE_CHECKING:
    from llmconsole.db import Store


def _store() -> Store:
    from llmconsole.db import Store, StoreError

    paths = resolve()
    if not paths.database.exists():
        raise CliError(f"no llmconsole database at {paths.database} yet: nothing has been recorded")
    try:
        return Store.open(paths.database)
    except StoreError as e:
        raise CliError(str(e)) from None


def _when(t: float | None) -> str:
    return "-" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def parse_since(text: str, now_s: float | None = None) -> float:
    """'90m', '2h', '1d', '45s' ago, or an ISO 8601 time ('2026-12-03T07:00', local unless zoned)."""
    now = time.time() if now_s is None else now_s
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*", text)
    if m:
        return now - float(m.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise CliError(f"--since {text!r}: give a time such as 2026-12-03T07:00 or an age such as 2h",
                       EXIT_USAGE) from None


# --- history --------------------------------------------------------------------------------

def format_versions(engine: str, entries: list[dict[str, Any]]) -> str:
    lines = [f"{engine}:"]
    if not entries:
        return f"{engine}: no recorded configs"
    for e in entries:
        mark = "*" if e["in_use"] else " "
        label = f"  \"{e['label']}\"" if e.get("label") else ""
        lines.append(f" {mark} {e['config_id']}  {e['verdict']:<10}  runs {e['runs']:<3} "
                     f"last used {_when(e['last_used_at'])}{label}")
        for d in e["diff_from_previous"]:
            lines.append(f"       {d['field']}: {json.dumps(d['before'])} -> {json.dumps(d['after'])}")
    return "\n".join(lines)


def _engines_known_to_daemon() -> set[str] | None:
    """The daemon's engines, or None when no daemon runs (history works without one)."""
    from llmconsole.console.client import DaemonClient

    client = DaemonClient(resolve())
    if client.ping() is None:
        return None
    with client:
        return {e["name"] for e in client.status()["engines"]}


def cmd_history(ns: argparse.Namespace) -> int:
    from llmconsole.db.versions import versions

    if ns.engine and not resolve().database.exists():
        raise CliError(f"no engine named {ns.engine!r} has run: nothing has been recorded yet", EXIT_USAGE)
    with _store() as store:
        ran = sorted({r.engine for r in store.runs()})
        if ns.engine and ns.engine not in ran and ns.engine not in (_engines_known_to_daemon() or set()):
            known = f" (engines with a history: {', '.join(ran)})" if ran else ""
            raise CliError(f"no engine named {ns.engine!r} has run{known}", EXIT_USAGE)
        engines = [ns.engine] if ns.engine else ran
        result = {name: [v.to_json() for v in versions(store, name)] for name in engines}
    if ns.json:
        print(json.dumps({"engines": result}, indent=2))
        return 0
    if not result:
        print("no engine has run yet")
        return 0
    print("\n\n".join(format_versions(name, entries) for name, entries in result.items()))
    print("\n(* in use; each indented line is a change from the version used before it)")
    return 0


# --- rollback -------------------------------------------------------------------------------

def cmd_rollback(ns: argparse.Namespace) -> int:
    with daemon_client() as client:
        e = client.engine(ns.name)
        if e is None:
            raise CliError(f"no engine named {ns.name!r}", EXIT_USAGE)
        target = ns.to or "its last known-good config"
        confirm(f"Restart {ns.name} (now on {e['config_id']}) on {target}?", ns.yes)
        from llmconsole.console.client import DaemonError

        try:
            r = client.rollback(ns.name, ns.to)
        except DaemonError as err:
            raise CliError(str(err), EXIT_USAGE if err.status == 400 else 1) from None
    print(f"{ns.name}: rolling back {r['from_config_id']} -> {r['to_config_id']} "
          f"(`llmconsole status` shows it come up)")
    return 0


# --- export ---------------------------------------------------------------------------------

def _known_secrets(state_file: Path) -> list[str]:
    """Secrets the daemon holds (its state file: API keys, secret env values), so the export
    can prove none leaked."""
    try:
        data = json.loads(state_file.read_text())
    except (OSError, ValueError):
        return []
    out: list[str] = []
    for rec in data.get("engines", {}).values():
        spec = rec.get("spec") or {}
        out += [spec["api_key"]] if spec.get("api_key") else []
        out += [v for v in (rec.get("secret_env") or {}).values() if v]
    return out


def cmd_export(ns: argparse.Namespace) -> int:
    from llmconsole.db.export import ExportError, export_bundle

    paths = resolve()
    since = parse_since(ns.since) if ns.since else None
    with _store() as store:
        engines = sorted({r.engine for r in store.runs(since=since)})
        logs = {name: paths.engine_log(name) for name in engines if paths.engine_log(name).exists()}
        logs["daemon"] = paths.daemon_log
        try:
            result = export_bundle(store, ns.out, session_id=ns.session, since_s=since,
                                   logs={k: v for k, v in logs.items() if v.exists()},
                                   secrets=_known_secrets(paths.state_file))
        except ExportError as e:
            raise CliError(str(e), EXIT_USAGE) from None
    counts = ", ".join(f"{n} {t}" for t, n in result.counts)
    print(f"exported to {result.out_dir}: {counts}")
    for f in result.files:
        print(f"  {f}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    h = sub.add_parser("history", help="config versions of each engine, their verdicts and diffs")
    h.add_argument("engine", nargs="?", help="one engine (default: all that ever ran)")
    h.add_argument("--json", action="store_true")
    h.set_defaults(func=cmd_history)

    r = sub.add_parser("rollback", help="restart an engine on an earlier config (asks first)")
    r.add_argument("name")
    r.add_argument("--to", metavar="CONFIG_ID", help="default: the last known-good before the current one")
    r.add_argument("--yes", "-y", action="store_true")
    r.set_defaults(func=cmd_rollback)

    x = sub.add_parser("export", help="a bundle of a session: JSONL, CSV, logs and a Markdown report")
    span = x.add_mutually_exclusive_group()
    span.add_argument("--session", type=int, metavar="ID", help="one operator session")
    span.add_argument("--since", metavar="T", help="an ISO time or an age such as 2h (default: everything)")
    x.add_argument("--out", required=True, metavar="DIR", help="a new or empty directory")
    x.set_defaults(func=cmd_export)
