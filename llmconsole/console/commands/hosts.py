"""`llmconsole hosts ...`: the hosts of the hosts file, and Prometheus targets for them.

  llmconsole hosts ls [--json]                   the hosts file, checked (a bad file exits 2)
  llmconsole hosts prometheus-targets --out DIR  file-based service discovery for Prometheus:
                                                 DIR/llmconsole.json (each daemon's exporter) and
                                                 DIR/vllm.json (each engine's own /metrics)
  llmconsole hosts prometheus-targets --out DIR --watch 30   rewrite them every 30 s

Exporters and engines bind 127.0.0.1 unless told otherwise, so a Prometheus on another machine
reaches a host's exporter only through an address the operator opened: `metrics = "ADDR:PORT"`
in the hosts file (an SSH tunnel's local end, or the address after setting
LLMCONSOLE_METRICS_BIND on that host). A host whose exporter is only on its own loopback is left
out, and the reason printed.

Hosts are asked in parallel, each for at most --host-timeout. One that does not answer in time
(slow), cannot be reached, or fails otherwise keeps its last known targets, and the reason is
printed on stderr: with --watch the files keep being rewritten for every other host.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import socket
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from llmconsole.atomic import write_atomic
from llmconsole.console.cli_common import EXIT_USAGE, CliError
from llmconsole.console.client import DaemonClient, DaemonError, DaemonNotRunning, HostUnreachable
from llmconsole.console.host_status import GRACE_S, HOST_TIMEOUT_S, slow_reason
from llmconsole.console.hosts import Host, HostCatalog, client_for
from llmconsole.console.ssh import ssh_command

EXPORTER_FILE = "llmconsole.json"
ENGINES_FILE = "vllm.json"


def cmd_ls(ns: argparse.Namespace) -> int:
    catalog: HostCatalog = ns.catalog
    hosts = catalog.file_hosts
    if ns.json:
        print(
            json.dumps(
                {
                    "file": str(catalog.path),
                    "hosts": [
                        {
                            "name": h.name,
                            "destination": str(h.destination),
                            "command": h.command,
                            "data_dir": h.data_dir,
                            "metrics": h.metrics,
                        }
                        for h in hosts
                    ],
                },
                indent=2,
            )
        )
        return 0
    if not hosts:
        print(f"no hosts in {catalog.path} (see `llmconsole hosts --help` for its form)")
        return 0
    rows = [("NAME", "DESTINATION", "COMMAND", "DATA DIR", "METRICS")]
    rows += [(h.name, str(h.destination), h.command, h.data_dir or "-", h.metrics or "-") for h in hosts]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print(f"{catalog.path}:")
    print("\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows))
    return 0


# --- Prometheus targets -----------------------------------------------------------------------


def _is_loopback(addr: str) -> bool:
    if addr == "localhost":
        return True
    try:
        return ipaddress.ip_address(addr.strip("[]")).is_loopback
    except ValueError:
        return False


def _is_any(addr: str) -> bool:
    return addr in ("0.0.0.0", "::", "[::]", "")


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def network_name(host: Host) -> str:
    """The address ssh really connects to for `host` (its config's HostName applied)."""
    assert host.destination is not None
    try:
        r = subprocess.run(
            [*ssh_command(), "-G", "--", str(host.destination)], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return host.destination.hostname
    for line in r.stdout.splitlines():
        key, _, value = line.partition(" ")
        if key == "hostname" and value.strip():
            return value.strip()
    return host.destination.hostname


class TargetScan:
    """Where Prometheus can scrape each host's exporter and engines, asked of each daemon (over
    SSH for the others). Long-lived with --watch: clients keep their backoff, and a host that
    is down keeps its last known targets (Prometheus then shows it down, rather than gone)."""

    def __init__(self, hosts: list[Host], local_name: str, timeout_s: float = HOST_TIMEOUT_S):
        self.hosts = hosts
        self.local_name = local_name
        self.timeout_s = timeout_s
        self.clients: dict[str, DaemonClient] = {}
        self.last: dict[str, tuple[list[dict[str, Any]], list[dict[str, Any]]]] = {}
        self._names: dict[str, str] = {}
        self._pending: dict[str, Future[tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]]] = {}
        self._pool = ThreadPoolExecutor(max_workers=max(1, min(8, len(hosts))), thread_name_prefix="targets")

    def label(self, host: Host) -> str:
        return self.local_name if host.is_local else host.name

    def _client(self, host: Host) -> DaemonClient:
        if host.name not in self.clients:
            self.clients[host.name] = client_for(host, timeout_s=self.timeout_s)
        return self.clients[host.name]

    def _reachable_as(self, host: Host, bound: str, port: int) -> str | None:
        """The address others reach a listener bound to `bound` on `host` at; None: only there."""
        if host.is_local:
            return _join("127.0.0.1" if _is_any(bound) else bound, port)
        if _is_loopback(bound):
            return None
        if _is_any(bound):
            if host.name not in self._names:
                self._names[host.name] = network_name(host)
            return _join(self._names[host.name], port)
        return _join(bound, port)

    def scan_host(self, host: Host) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
        """(exporter targets, engine targets, notes) of one host."""
        labels = {"host": self.label(host)}
        notes: list[str] = []
        exporters: list[dict[str, Any]] = []
        engines: list[dict[str, Any]] = []
        if host.metrics:
            exporters.append({"targets": [host.metrics], "labels": labels})
        try:
            client = self._client(host)
            status = client.status_answer()
            if not host.metrics:
                url = urlsplit(client.exporter()["url"])
                addr = self._reachable_as(host, url.hostname or "", int(url.port or 0))
                if addr is None:
                    notes.append(
                        f"{host.name}: its exporter listens on {url.hostname} only; set `metrics = "
                        f'"ADDR:PORT"` in the hosts file (an SSH tunnel\'s end, or set '
                        f"LLMCONSOLE_METRICS_BIND on {host.name})"
                    )
                else:
                    exporters.append({"targets": [addr], "labels": labels})
        except HostUnreachable as e:
            return self._kept(host, exporters, engines, notes + [f"{host.name}: unreachable: {e.reason}"])
        except httpx.TimeoutException:
            return self._kept(host, exporters, engines, notes + [f"{host.name}: slow: {slow_reason(self.timeout_s)}"])
        except httpx.TransportError as e:
            return self._kept(host, exporters, engines, notes + [f"{host.name}: {type(e).__name__}: {e}"])
        except (DaemonNotRunning, DaemonError) as err:
            notes.append(f"{host.name}: {err}")
            return exporters, engines, notes
        for eng in status.engines:
            if not eng.port or eng.state in ("stopped", "failed"):
                continue
            bound = str(eng.spec.get("host") or "127.0.0.1")
            addr = self._reachable_as(host, bound, eng.port)
            if addr is None:
                notes.append(
                    f"{host.name}: engine {eng.name} listens on {bound} only; its vllm:* series are "
                    f"in reach of a Prometheus on {host.name} (or through a tunnel)"
                )
                continue
            engines.append({"targets": [addr], "labels": {**labels, "llmconsole_engine": eng.name}})
        self.last[host.name] = (exporters, engines)
        return exporters, engines, notes

    def _kept(
        self, host: Host, exporters: list[dict[str, Any]], engines: list[dict[str, Any]], notes: list[str]
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
        """A host that did not answer: its last known targets (Prometheus then shows it down,
        rather than gone), else what is known without asking it (its `metrics` entry)."""
        kept = self.last.get(host.name)
        if kept is not None:
            return kept[0], kept[1], [f"{n}; its last known targets are kept" for n in notes]
        return exporters, engines, notes

    def scan(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
        """Every host, asked in parallel, waited for about one host timeout at most. A host whose
        question from an earlier round is still out is not asked again; it keeps its last known
        targets until that question ends."""
        for host in self.hosts:
            if host.name not in self._pending:
                self._pending[host.name] = self._pool.submit(self.scan_host, host)
        # A host makes two calls (status, exporter), each bounded by the client's timeout.
        wait(list(self._pending.values()), timeout=2 * self.timeout_s + GRACE_S)
        exporters: list[dict[str, Any]] = []
        engines: list[dict[str, Any]] = []
        notes: list[str] = []
        for host in self.hosts:
            future = self._pending[host.name]
            if future.done():
                del self._pending[host.name]
                try:
                    x, e, n = future.result()
                except Exception as err:  # a bug or an answer not foreseen: that host only
                    x, e, n = self._kept(host, [], [], [f"{host.name}: {type(err).__name__}: {err}"])
            else:
                static = [{"targets": [host.metrics], "labels": {"host": self.label(host)}}] if host.metrics else []
                x, e, n = self._kept(host, static, [], [f"{host.name}: slow: {slow_reason(2 * self.timeout_s)}"])
            exporters += x
            engines += e
            notes += n
        return exporters, engines, notes

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        for c in self.clients.values():
            c.close()


def write_json_atomic(path: Path, data: Any) -> None:
    """Prometheus re-reads a file_sd file when it changes: never let it see half of one."""
    write_atomic(path, json.dumps(data, indent=2) + "\n", mode=0o644)


def cmd_targets(ns: argparse.Namespace) -> int:
    catalog: HostCatalog = ns.catalog
    hosts = catalog.file_hosts if ns.no_local else catalog.all_hosts()
    if not hosts:
        raise CliError(f"no hosts: {catalog.path} lists none and --no-local leaves out this one", EXIT_USAGE)
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    scan = TargetScan(hosts, ns.local_name or socket.gethostname(), ns.host_timeout)
    try:
        while True:
            exporters, engines, notes = scan.scan()
            write_json_atomic(out / EXPORTER_FILE, exporters)
            write_json_atomic(out / ENGINES_FILE, engines)
            for note in notes:
                print(note, file=sys.stderr)
            print(
                f"{out / EXPORTER_FILE}: {len(exporters)} exporter(s); {out / ENGINES_FILE}: {len(engines)} engine(s)"
            )
            if not ns.watch:
                return 0
            time.sleep(ns.watch)
    finally:
        scan.close()


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    h = sub.add_parser("hosts", help="the hosts file, and Prometheus targets for every host's daemon and engines")
    hs = h.add_subparsers(dest="hosts_cmd", required=True)
    ls = hs.add_parser("ls", help="the hosts of the hosts file, checked")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=cmd_ls)
    t = hs.add_parser(
        "prometheus-targets", help="file-based service discovery JSON: each host's exporter, each engine's /metrics"
    )
    t.add_argument(
        "--out",
        required=True,
        metavar="DIR",
        help=f"where {EXPORTER_FILE} and {ENGINES_FILE} are written (what the scrape config reads)",
    )
    t.add_argument("--no-local", action="store_true", help="leave this host out")
    t.add_argument("--local-name", metavar="NAME", help="this host's `host` label (default: its host name)")
    t.add_argument("--watch", type=float, default=None, metavar="S", help="rewrite the files every S seconds")
    t.add_argument(
        "--host-timeout",
        type=float,
        default=HOST_TIMEOUT_S,
        metavar="S",
        help=f"how long one host may take to answer before its last known targets are kept "
        f"(default {HOST_TIMEOUT_S:.0f})",
    )
    t.set_defaults(func=cmd_targets)
