"""`llmconsole history`, `rollback` and `export`: the store, through the daemon.

The daemon is the one owner of the SQLite store: history asks it for the versions and the action
log (GET /v1/history), export asks it to write the bundle into the folder given here (POST
/v1/export), rollback asks it to restart the engine. None of them opens the database, so each
needs the daemon running, and says so when it is not; a read never starts one.

The folder of an export is checked here too before the daemon is asked (new, or empty and
yours), so a refused folder is refused with or without a daemon; the daemon checks it again as
it creates it, and writes each file new at 0600, never through a link.

Across hosts, export gathers one bundle: this host's export and each other host's, each in a
folder of its own. Another host's export is that host's own `llmconsole export --tar`, run over
ssh (its daemon writes it there, and its secrets are redacted there, by the host that knows
them); the tar stream comes back on ssh's stdout and is unpacked here.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tarfile
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from llmconsole.console.cli_common import (
    EXIT_NO_DAEMON,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    CliError,
    confirm,
    current_host,
    daemon_client,
)
from llmconsole.console.client import DaemonClient, DaemonError, HostUnreachable
from llmconsole.console.hosts import Host
from llmconsole.export_folder import (
    ExportError,
    check_out_dir,
    create_binary_file,
    create_file,
    make_folder,
    prepare_out_dir,
)
from llmconsole.paths import resolve
from llmconsole.wire.history import ExportRequest, HistoryQuery


def _store_client(command: str) -> DaemonClient:
    """This host's daemon, which reads and exports the store for `command`; none running is an
    error (exit 3) that says how to start one. A read never starts a daemon."""
    client = DaemonClient(resolve())
    if client.ping() is None:
        client.close()
        raise CliError(
            f"no llmconsole daemon is running, and `llmconsole {command}` reads the history through it "
            "(start one with `llmconsole daemon start`)",
            EXIT_NO_DAEMON,
        )
    return client


def _refused(e: DaemonError, route: str) -> CliError:
    """A refusal of the daemon's as the CLI reports it: a bad request or an unknown name is a
    usage error (exit 2), anything else a failure. A daemon started by an older llmconsole (one
    left running across an upgrade) has no such route: its HTTP server's own 404 says so."""
    if e.status in (404, 405) and str(e).startswith(f"{e.status}:"):
        return CliError(
            f"this host's daemon has no {route}: it is older than this llmconsole; restart it "
            "(`llmconsole daemon stop`, then `llmconsole daemon start`)"
        )
    return CliError(str(e), EXIT_USAGE if e.status in (400, 404) else 1)


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
        raise CliError(
            f"--since {text!r}: give a time such as 2026-12-03T07:00 or an age such as 2h", EXIT_USAGE
        ) from None


# --- history --------------------------------------------------------------------------------


def format_versions(engine: str, entries: list[dict[str, Any]]) -> str:
    lines = [f"{engine}:"]
    if not entries:
        return f"{engine}: no recorded configs"
    for e in entries:
        mark = "*" if e["in_use"] else " "
        label = f'  "{e["label"]}"' if e.get("label") else ""
        lines.append(
            f" {mark} {e['config_id']}  {e['verdict']:<10}  runs {e['runs']:<3} "
            f"last used {_when(e['last_used_at'])}{label}"
        )
        if e.get("derived_from"):
            lines.append(f"       from {e['derived_from']}:")
        for d in e.get("diff_from_parent", e.get("diff_from_previous", [])):
            lines.append(f"       {d['field']}: {json.dumps(d['before'])} -> {json.dumps(d['after'])}")
    return "\n".join(lines)


def format_actions(engine: str, actions: list[dict[str, Any]]) -> str:
    """The engine's action log, oldest first: when, who, what, from which config to which, how it
    ended, and why (the reason an automatic action was taken, an error, or what a daemon found of
    an action its predecessor left unfinished)."""
    if not actions:
        return f"{engine}: no recorded actions"
    lines = [f"{engine} actions:"]
    for a in actions:
        change = f"{a['from_config_id'] or '-'} -> {a['to_config_id'] or '-'}"
        lines.append(f"  {_when(a['at'])}  {a['actor']:<10} {a['kind']:<10} {change:<27} {a['outcome']}")
        detail = a.get("detail") or {}
        for key in ("reason", "found", "error"):
            if detail.get(key):
                lines.append(f"      {key}: {detail[key]}")
    return "\n".join(lines)


def cmd_history(ns: argparse.Namespace) -> int:
    with _store_client("history") as client:
        try:
            answer = client.history_listing(HistoryQuery(engine=ns.engine, actions=ns.actions))
        except DaemonError as e:
            raise _refused(e, "GET /v1/history") from None
    result = {name: [v.model_dump(mode="json") for v in entries] for name, entries in answer.engines.items()}
    engines = list(result)
    acts = {name: [a.model_dump(mode="json") for a in entries] for name, entries in (answer.actions or {}).items()}
    if ns.json:
        print(json.dumps({"engines": result, **({"actions": acts} if ns.actions else {})}, indent=2))
        return 0
    if ns.actions:
        print("\n\n".join(format_actions(name, acts.get(name, [])) for name in engines) or "no engine has run yet")
        return 0
    if not result:
        print("no engine has run yet")
        return 0
    print("\n\n".join(format_versions(name, entries) for name, entries in result.items()))
    print("\n(* in use; the indented lines are a version's changes from the config it was derived from)")
    return 0


# --- rollback -------------------------------------------------------------------------------


def cmd_rollback(ns: argparse.Namespace) -> int:
    with daemon_client() as client:
        e = client.engine(ns.name)
        if e is None:
            raise CliError(f"no engine named {ns.name!r}", EXIT_USAGE)
        target = ns.to or "its last known-good config"
        confirm(f"Restart {ns.name} (now on {e['config_id']}) on {target}?", ns.yes)
        try:
            r = client.rollback(ns.name, ns.to)
        except DaemonError as err:
            raise CliError(str(err), EXIT_USAGE if err.status == 400 else 1) from None
    print(
        f"{ns.name}: rolling back {r['from_config_id']} -> {r['to_config_id']} (`llmconsole status` shows it come up)"
    )
    return 0


# --- export ---------------------------------------------------------------------------------


def _export_here(ns: argparse.Namespace, out: Path, quiet: bool = False) -> None:
    """This host's bundle into `out` (new or empty), written by its daemon."""
    since = parse_since(ns.since) if ns.since else None
    target = out.absolute()  # the daemon's working folder is not ours; a link at the end stays one
    try:
        check_out_dir(target)  # refused here before the daemon is asked, daemon or none
    except ExportError as e:
        raise CliError(str(e), EXIT_USAGE) from None
    with _store_client("export") as client:
        try:
            result = client.export_bundle(ExportRequest(out_dir=str(target), session_id=ns.session, since_s=since))
        except DaemonError as e:
            raise _refused(e, "POST /v1/export") from None
    counts = ", ".join(f"{n} {t}" for t, n in result.counts)
    say = sys.stderr if quiet else sys.stdout
    print(f"exported to {out}: {counts}", file=say)
    for f in result.files:
        print(f"  {f}", file=say)


def _export_tar(ns: argparse.Namespace) -> None:
    """This host's bundle as a tar stream on stdout (what another host's export reads over ssh)."""
    with tempfile.TemporaryDirectory(prefix="llmconsole-export-") as tmp:
        _export_here(ns, Path(tmp) / "bundle", quiet=True)
        with tarfile.open(fileobj=sys.stdout.buffer, mode="w|") as tar:
            tar.add(Path(tmp) / "bundle", arcname=".")
        sys.stdout.buffer.flush()


def _unpack(data: IO[bytes], out: Path) -> list[str]:
    """A bundle's tar stream into `out` (checked and created as an export folder): plain files and
    folders only, nothing outside `out`, each file new at 0600 and never through a link."""
    try:
        prepare_out_dir(out)
    except ExportError as e:
        raise CliError(str(e), EXIT_USAGE) from None
    names = []
    with tarfile.open(fileobj=data, mode="r|") as tar:
        for member in tar:
            target = (out / member.name).resolve()
            if not (member.isfile() or member.isdir()) or not target.is_relative_to(out.resolve()):
                raise CliError(f"refusing {member.name!r} in the bundle: not a plain file inside it")
            if target == out.resolve():
                continue
            try:
                if member.isdir():
                    make_folder(target)
                    continue
                src = tar.extractfile(member)
                assert src is not None
                with create_binary_file(target) as dst:
                    shutil.copyfileobj(src, dst)
            except (ExportError, FileNotFoundError) as e:
                raise CliError(f"refusing {member.name!r} in the bundle: {e}") from None
            names.append(str(target.relative_to(out.resolve())))
    return names


def _export_args(ns: argparse.Namespace) -> list[str]:
    args = ["export", "--tar"]
    if ns.since:
        args += ["--since", ns.since]
    if ns.session is not None:
        args += ["--session", str(ns.session)]
    return args


def _export_remote(ns: argparse.Namespace, host: Host, out: Path) -> list[str]:
    """Another host's bundle into `out`: its own export, streamed back over ssh."""
    from llmconsole.console.ssh import capture_remote

    assert host.destination is not None
    with tempfile.TemporaryFile() as spool:
        try:
            capture_remote(
                str(host.destination),
                host.remote_command(*_export_args(ns)),
                host=host.name,
                stdout=spool,
                timeout_s=900.0,
            )
        except RuntimeError as e:
            raise CliError(f"export on {e}") from None
        spool.seek(0)
        try:
            return _unpack(spool, out)
        except tarfile.TarError as e:
            raise CliError(f"export on {host.name}: the bundle did not arrive whole ({e})") from None


def _export_across(ns: argparse.Namespace, hosts: list[Host]) -> int:
    """One bundle: each host's export in a folder named after it, and hosts.json saying which
    hosts are in it and why any is not."""
    out = Path(ns.out)
    try:
        prepare_out_dir(out)
    except ExportError as e:
        raise CliError(str(e), EXIT_USAGE) from None
    index = []
    for host in hosts:
        folder = out / host.name
        entry: dict[str, Any] = {
            "host": host.name,
            "folder": host.name,
            "destination": str(host.destination) if host.destination else None,
        }
        try:
            if host.is_local:
                _export_here(ns, folder, quiet=True)
            else:
                _export_remote(ns, host, folder)
            entry.update(ok=True, error=None)
            print(f"{host.name}: exported to {folder}")
        except HostUnreachable as e:
            entry.update(ok=False, reachable=False, error=e.reason)
            print(f"{host.name}: unreachable: {e.reason}", file=sys.stderr)
        except CliError as e:
            entry.update(ok=False, error=str(e))
            print(f"{host.name}: {e}", file=sys.stderr)
        index.append(entry)
    try:
        with create_file(out / "hosts.json") as f:
            f.write(json.dumps({"exported_at": time.time(), "hosts": index}, indent=2) + "\n")
    except ExportError as e:
        raise CliError(str(e)) from None
    done = sum(1 for e in index if e["ok"])
    print(f"exported {done} of {len(index)} host(s) to {out} (hosts.json lists them)")
    if done == len(index):
        return 0
    return EXIT_UNREACHABLE if any(e.get("reachable") is False for e in index) else 1


def cmd_export(ns: argparse.Namespace) -> int:
    targets: list[Host] = getattr(ns, "targets", [])
    if (ns.out is None) == (not ns.tar):
        raise CliError("give --out DIR, or --tar for a tar stream on stdout", EXIT_USAGE)
    if ns.all_hosts or len(targets) > 1:
        if ns.tar:
            raise CliError("--tar exports one host; across hosts give --out DIR", EXIT_USAGE)
        if ns.session is not None:
            raise CliError("--session is one host's; across hosts give --since", EXIT_USAGE)
        return _export_across(ns, ns.catalog.all_hosts() if ns.all_hosts else targets)
    host = current_host()
    if host.is_local:
        if ns.tar:
            _export_tar(ns)
        else:
            _export_here(ns, Path(ns.out))
        return 0
    if ns.tar:
        raise CliError("--tar is what another host's export runs; here give --out DIR", EXIT_USAGE)
    out = Path(ns.out)
    try:
        prepare_out_dir(out)  # refused before anything is fetched
    except ExportError as e:
        raise CliError(str(e), EXIT_USAGE) from None
    files = _export_remote(ns, host, out)
    print(f"exported {host.name} to {out}: {len(files)} files")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    h = sub.add_parser(
        "history",
        help="config versions of each engine, their verdicts and diffs (read through the daemon: it must be running)",
    )
    h.add_argument("engine", nargs="?", help="one engine (default: all that ever ran)")
    h.add_argument("--json", action="store_true")
    h.add_argument(
        "--actions",
        action="store_true",
        help="the action log instead: every change, who made it, how it ended (interrupted: what was found)",
    )
    h.set_defaults(func=cmd_history)

    r = sub.add_parser("rollback", help="restart an engine on an earlier config (asks first)")
    r.add_argument("name")
    r.add_argument("--to", metavar="CONFIG_ID", help="default: the last known-good before the current one")
    r.add_argument("--yes", "-y", action="store_true")
    r.set_defaults(func=cmd_rollback)

    x = sub.add_parser(
        "export",
        help="a bundle of a session: JSONL, CSV, logs and a Markdown report (written by the daemon: it must be running)",
    )
    span = x.add_mutually_exclusive_group()
    span.add_argument("--session", type=int, metavar="ID", help="one operator session")
    span.add_argument("--since", metavar="T", help="an ISO time or an age such as 2h (default: everything)")
    x.add_argument("--out", metavar="DIR", help="a new or empty directory")
    x.add_argument("--tar", action="store_true", help="write the bundle as a tar stream to stdout instead")
    x.add_argument(
        "--all-hosts", action="store_true", help="this host and every host of the hosts file, each in a folder of --out"
    )
    x.set_defaults(func=cmd_export)
