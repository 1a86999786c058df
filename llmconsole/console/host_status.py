"""Every host's status at once: each host asked in parallel, each answering on its own.

A host that cannot be reached (ssh's reason), or that runs no daemon, is one line of the report;
the other hosts' engines are listed all the same. What a multi-host view (the CLI's
`status --all-hosts`, a console over several hosts) builds on.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from llmconsole.console.client import DaemonClient, DaemonError, DaemonNotRunning, HostUnreachable
from llmconsole.console.hosts import Host, client_for


@dataclass(frozen=True)
class HostReport:
    host: Host
    status: dict[str, Any] | None = None  # the daemon's GET /v1/status, when it answered
    reachable: bool = True  # ssh reached the host (always, for this host)
    error: str | None = None  # why there is no status: ssh's reason, no daemon, ...

    @property
    def running(self) -> bool:
        return self.status is not None

    @property
    def engines(self) -> list[dict[str, Any]]:
        return list(self.status["engines"]) if self.status else []

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host.name,
            "destination": str(self.host.destination) if self.host.destination else None,
            "reachable": self.reachable,
            "running": self.running,
            "error": self.error,
            "status": self.status,
        }


def host_report(host: Host, timeout_s: float = 30.0, client: DaemonClient | None = None) -> HostReport:
    """One host's status, or why there is none. `client`: a long-lived one to ask (its backoff
    decides whether an unreachable host is tried again now); else a new one, closed after."""
    own = client is None
    c = client_for(host, timeout_s=timeout_s) if client is None else client
    try:
        return HostReport(host, status=c.status())
    except HostUnreachable as e:
        reason = e.reason + (f" (next try in {e.retry_in_s:.0f} s)" if e.retry_in_s is not None else "")
        return HostReport(host, reachable=False, error=reason)
    except DaemonNotRunning:
        return HostReport(host, error="no llmconsole daemon is running")
    except DaemonError as e:
        return HostReport(host, error=str(e))
    finally:
        if own:
            c.close()


def gather(
    hosts: list[Host], timeout_s: float = 30.0, clients: dict[str, DaemonClient] | None = None
) -> list[HostReport]:
    """Every host's report, in the order given; the slowest host bounds the wait, not the sum."""
    if not hosts:
        return []
    clients = clients or {}
    with ThreadPoolExecutor(max_workers=min(8, len(hosts)), thread_name_prefix="host") as pool:
        return list(pool.map(lambda h: host_report(h, timeout_s, clients.get(h.name)), hosts))
