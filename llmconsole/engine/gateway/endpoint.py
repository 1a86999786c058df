"""An engine behind the gateway, this host's or another's, as one interface.

A group needs the same few things of every engine it routes to: where it listens, the key it
wants, the model names it answers to, and whether requests may go there now. This host's
engines say so in the status their supervisors publish (engine/status_board.py); another host's
in what its health checks found (engine/gateway/remote.py). Each kind comes from an
`EndpointSource` that also says when one of its endpoints changed, so the gateway follows both
by subscription, and copies them into its groups along one path.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from llmconsole.engine.gateway.remote import Health, RemoteMember, RemoteWatch
from llmconsole.engine.status import EngineState, EngineStatus

if TYPE_CHECKING:
    from llmconsole.engine.fleet import Fleet

# Hears the name of an endpoint that changed (or left).
EndpointListener = Callable[[str], None]


class Endpoint(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def url(self) -> str | None: ...

    @property
    def api_key(self) -> str | None: ...

    @property
    def remote(self) -> bool: ...

    @property
    def models(self) -> frozenset[str]: ...

    def routable(self, down_at: float | None) -> bool:
        """Whether requests may go there now; `down_at`: when a request last found it refusing
        (monotonic seconds), or None."""
        ...


class EndpointSource(Protocol):
    def endpoint(self, name: str) -> Endpoint | None: ...

    def subscribe(self, listener: EndpointListener) -> Callable[[], None]: ...


@dataclass(frozen=True)
class LocalEndpoint:
    """One of this host's engines, from its published status. A refusal takes it out until its
    supervisor publishes again (it crashed and restarts, or its next scrape finds it serving)."""

    name: str
    url: str | None
    ready: bool
    models: frozenset[str]
    api_key: str | None = field(default=None, repr=False)
    remote: bool = False

    @classmethod
    def of(cls, status: EngineStatus, api_key: str | None) -> LocalEndpoint:
        models = frozenset(m for m in (status.served_model_name, status.model) if m)
        return cls(status.name, status.url, status.state == EngineState.READY, models, api_key)

    def routable(self, down_at: float | None) -> bool:
        return self.ready


@dataclass(frozen=True)
class RemoteEndpoint:
    """An engine of another host: ready while it passes its health checks, and after a refusal
    only once a check passed since."""

    member: RemoteMember
    health: Health | None
    remote: bool = True

    @property
    def name(self) -> str:
        return self.member.name

    @property
    def url(self) -> str | None:
        return self.member.url

    @property
    def api_key(self) -> str | None:
        return self.member.api_key

    @property
    def models(self) -> frozenset[str]:
        return frozenset(self.member.models)

    def routable(self, down_at: float | None) -> bool:
        return self.health is not None and self.health.routable(down_at)


class FleetEndpoints:
    """This host's engines: the fleet's status board, and each engine's key from its spec."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet

    def endpoint(self, name: str) -> LocalEndpoint | None:
        sup = self.fleet.engines.get(name)
        status = self.fleet.board.get(name)
        if sup is None or status is None:
            return None
        return LocalEndpoint.of(status, sup.spec.api_key.get_secret_value() if sup.spec.api_key else None)

    def subscribe(self, listener: EndpointListener) -> Callable[[], None]:
        return self.fleet.board.subscribe(lambda name, status: listener(name))


class RemoteEndpoints:
    """Other hosts' engines that groups name: where they are (`members`, read at each lookup, as
    the operator's changes replace it) and what their checks found (the watch, which publishes
    after every round)."""

    def __init__(self, members: Callable[[], Mapping[str, RemoteMember]], watch: RemoteWatch) -> None:
        self._members = members
        self.watch = watch

    def endpoint(self, name: str) -> RemoteEndpoint | None:
        member = self._members().get(name)
        return None if member is None else RemoteEndpoint(member, self.watch.health.get(name))

    def subscribe(self, listener: EndpointListener) -> Callable[[], None]:
        return self.watch.subscribe(listener)
