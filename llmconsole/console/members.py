"""Engines of other hosts as members of a gateway group: what the CLI asks their daemons, and the
address the group's gateway connects to.

`group set fast a b@gpu1` asks gpu1's daemon (over the operator's ssh, as every command for
gpu1 does) where b listens and for its API key, works out the URL at which the gateway's host
reaches b, and hands both to the gateway's daemon with the group. That daemon then needs no ssh:
it checks b's /health itself and sends b its requests directly. The key travels in control API
bodies only (the 0600 socket, the ssh channel), never on a command line or in a log.

Where b listens decides the URL:
- a specific address (`engine start b --host 10.0.0.12`): that address;
- every address (0.0.0.0, ::): the address ssh connects to for its host;
- loopback (the default): only a gateway of the same host reaches it; for any other host it is
  refused, with how to bind it elsewhere, even where ssh reaches that host at a loopback address.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any

from llmconsole.console.cli_common import EXIT_USAGE, CliError
from llmconsole.console.client import DaemonClient, DaemonError
from llmconsole.console.hosts import Host, HostCatalog, client_for, split_engine
from llmconsole.engine.gateway.remote import is_loopback
from llmconsole.paths import resolve

_WILDCARD = ("0.0.0.0", "::", "[::]", "")


class MemberError(CliError):
    def __init__(self, message: str) -> None:
        super().__init__(message, EXIT_USAGE)


@dataclass(frozen=True)
class Member:
    """One engine of another host, as the gateway's daemon is told of it."""

    name: str  # ENGINE@HOST
    url: str
    api_key: str | None
    models: tuple[str, ...]
    state: str

    def body(self) -> dict[str, Any]:
        return {"url": self.url, "api_key": self.api_key, "models": list(self.models)}


def _http(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def member_url(label: str, bind: str, port: int, member_at: str | None, gateway_at: str | None) -> str:
    """The URL the gateway's host reaches an engine at. `member_at`/`gateway_at`: the address ssh
    connects to for each host, None for the local host."""
    same = member_at == gateway_at
    bind = bind.strip()
    if is_loopback(bind):
        if same:
            return _http("::1" if bind.strip("[]") == "::1" else "127.0.0.1", port)
        raise MemberError(
            f"{label} listens on {bind}, its own host's loopback, which the gateway's host cannot reach: "
            f"restart it bound to an address the gateway's host does reach "
            f"(`llmconsole engine restart {label} --host ADDR --port PORT`), with an API key "
            f"(--api-key-env or --api-key-file), since whatever reaches that address reaches the engine"
        )
    if bind in _WILDCARD:
        if same:
            return _http("127.0.0.1", port)
        if member_at is None:
            raise MemberError(
                f"{label} listens on every address of this host, and which of them the gateway's host "
                f"reaches is not known here: restart it bound to that one (--host ADDR)"
            )
        return _http(member_at, port)
    return _http(bind.strip("[]"), port)


def machine_of(host: Host) -> str | None:
    """The address ssh connects to for `host` (after the operator's ssh config), or None for the
    local host. A destination on this machine's loopback is another host all the same (another
    user, another network namespace, a tunnel's end): what listens on its loopback is its own."""
    if host.destination is None:
        return None
    from llmconsole.console.ssh import resolved_hostname

    return resolved_hostname(str(host.destination)) or host.destination.hostname


def _member_client(host: Host) -> DaemonClient:
    return DaemonClient(resolve()) if host.is_local else client_for(host)


def resolve_members(catalog: HostCatalog, gateway: Host, texts: list[str]) -> tuple[list[str], list[Member]]:
    """The group's member names as the gateway's daemon knows them (its own engines bare, the
    others ENGINE@HOST under the host's name), and what it needs of the others."""
    names: list[str] = []
    remote: list[Member] = []
    gateway_at: list[str | None] = []  # asked once, and only when a member needs it (ssh -G)
    for text in texts:
        engine, at = split_engine(text)
        host = catalog.lookup(at) if at is not None else gateway
        if host.name == gateway.name or (host.is_local and gateway.is_local):
            names.append(engine)
            continue
        label = f"{engine}@{socket.gethostname() if host.is_local else host.name}"
        with _member_client(host) as client:
            try:
                facts = client.member(engine)
            except DaemonError as e:
                if e.status == 404:
                    raise MemberError(f"no engine named {engine!r} on {host.name}") from None
                raise CliError(f"{host.name}: {e}") from None
        port = facts.get("port")
        if not isinstance(port, int):
            raise MemberError(f"{label} has no port yet: start it once (or give it --port) first")
        if not gateway_at:
            gateway_at.append(machine_of(gateway))
        url = member_url(label, str(facts.get("bind") or ""), port, machine_of(host), gateway_at[0])
        remote.append(Member(label, url, facts.get("api_key"), tuple(facts.get("models") or ()), str(facts["state"])))
        names.append(label)
    return names, remote
