"""Every host's status at once: each host asked in parallel, each answering on its own.

A host that cannot be reached (ssh's reason), or that runs no daemon, is one line of the report;
the other hosts' engines are listed all the same. So is a host that is slow: one that took the
connection (ssh logged in, or the socket accepted) and then said nothing within the per-host
timeout, a hung daemon or a black-holed link. Every host is waited for at most that long, in
parallel, so the slowest host bounds the report, never the sum, and never forever. What a
multi-host view (the CLI's `status --all-hosts`, a console over several hosts) builds on.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

import httpx

from llmconsole.console.client import DaemonClient, DaemonError, DaemonNotRunning, HostUnreachable
from llmconsole.console.hosts import Host, client_for
from llmconsole.wire import version_note
from llmconsole.wire.status import EngineInfo, StatusAnswer

HOST_TIMEOUT_S = 20.0  # ssh's own ConnectTimeout (10 s), its login, and the daemon's answer
GRACE_S = 5.0  # beyond a host's timeout, before its report is given up on (a client timeout is per read)


def slow_reason(timeout_s: float) -> str:
    return f"no answer within {timeout_s:.0f} s: the host took the connection, then said nothing"


@dataclass(frozen=True)
class HostReport:
    host: Host
    status: StatusAnswer | None = None  # the daemon's GET /v1/status, when it answered
    reachable: bool = True  # ssh reached the host (always, for this host)
    error: str | None = None  # why there is no status: ssh's reason, no daemon, ...
    slow: bool = False  # it took the connection and did not answer in time

    @property
    def answered(self) -> bool:
        """It said something: its status, or that it runs no daemon (not unreachable, not slow)."""
        return self.reachable and not self.slow

    @property
    def running(self) -> bool:
        return self.status is not None

    @property
    def engines(self) -> list[EngineInfo]:
        return list(self.status.engines) if self.status else []

    @property
    def wire_note(self) -> str | None:
        """Its daemon speaks another wire than this client: one line that says so, else None."""
        if self.status is None:
            return None
        return version_note(self.host.name, self.status.wire_version, self.status.daemon.version)

    def to_json(self) -> dict[str, Any]:
        return {
            "host": self.host.name,
            "destination": str(self.host.destination) if self.host.destination else None,
            "reachable": self.reachable,
            "running": self.running,
            "slow": self.slow,
            "error": self.error,
            "wire_version": self.status.wire_version if self.status else None,
            "status": self.status.to_wire() if self.status else None,
        }


def host_report(host: Host, timeout_s: float = HOST_TIMEOUT_S, client: DaemonClient | None = None) -> HostReport:
    """One host's status, or why there is none. `client`: a long-lived one to ask (its backoff
    decides whether an unreachable host is tried again now); else a new one, closed after."""
    own = client is None
    c = client_for(host, timeout_s=timeout_s) if client is None else client
    try:
        return HostReport(host, status=c.status_answer())
    except HostUnreachable as e:
        reason = e.reason + (f" (next try in {e.retry_in_s:.0f} s)" if e.retry_in_s is not None else "")
        return HostReport(host, reachable=False, error=reason)
    except DaemonNotRunning:
        return HostReport(host, error="no llmconsole daemon is running")
    except DaemonError as e:
        return HostReport(host, error=str(e))
    except httpx.TimeoutException:
        return HostReport(host, slow=True, error=slow_reason(timeout_s))
    except httpx.TransportError as e:  # a garbled answer: said as it is
        return HostReport(host, error=f"{type(e).__name__}: {e}")
    finally:
        if own:
            c.close()


def gather(
    hosts: list[Host], timeout_s: float = HOST_TIMEOUT_S, clients: dict[str, DaemonClient] | None = None
) -> list[HostReport]:
    """Every host's report, in the order given, within about `timeout_s` whatever the hosts do:
    one still not answered by then is reported slow, its question left to end on its own timeout."""
    if not hosts:
        return []
    clients = clients or {}
    pool = ThreadPoolExecutor(max_workers=min(8, len(hosts)), thread_name_prefix="host")
    try:
        futures = [pool.submit(host_report, h, timeout_s, clients.get(h.name)) for h in hosts]
        wait(futures, timeout=timeout_s + GRACE_S)
        return [
            f.result() if f.done() else HostReport(h, slow=True, error=slow_reason(timeout_s))
            for h, f in zip(hosts, futures, strict=True)
        ]
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
