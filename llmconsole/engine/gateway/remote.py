"""Engines of other hosts in this host's groups: where each one listens, its key, and whether it
answers now.

A remote member is named ENGINE@HOST. Its address and API key come from its own host's daemon:
the CLI asks that daemon (over the operator's ssh) when the operator forms the group, and hands
them to this host's daemon with the group. From then on this daemon needs no ssh and holds no
connection to the other daemon: it asks the member's own /health, over the network path its
requests take, once a second. A member that fails `down_after` checks running, or refuses a
request's connection (the proxy marks it down at once), is down: the group routes around it and
serves on through its other engines. It rejoins at the first check that it passes after that.

What this does not see: the other host's daemon holding its engine for a restart. Requests this
gateway has in flight there when it stops are cut as they would be by a crash; the proxy sends a
request whose answer had not begun to another engine of the group.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from llmconsole.engine.spec_checks import check_name

log = logging.getLogger(__name__)


def split_member(name: str) -> tuple[str, str]:
    """ENGINE@HOST -> (ENGINE, HOST); ValueError for anything else."""
    engine, at, host = name.partition("@")
    if not at or not host or any(c.isspace() or c in "/?#" for c in host):
        raise ValueError(f"{name!r} is not ENGINE@HOST")
    check_name(engine)
    return engine, host


def check_url(url: str) -> str:
    """An engine's base URL as the gateway connects to it: http://HOST:PORT, nothing more."""
    try:
        u = urlsplit(url)
        port = u.port
    except ValueError as e:
        raise ValueError(f"engine URL {url!r}: {e}") from None
    if u.scheme != "http" or not u.hostname or port is None:
        raise ValueError(f"engine URL {url!r} must be http://HOST:PORT")
    if u.path not in ("", "/") or u.query or u.fragment or u.username is not None or u.password is not None:
        raise ValueError(f"engine URL {url!r} must be http://HOST:PORT and nothing more")
    return url.rstrip("/")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class RemoteMember:
    """What the gateway needs of an engine of another host. The key never shows in a repr, a log
    or the control API's answers; it is kept in the daemon's private file only."""

    name: str  # ENGINE@HOST
    url: str
    api_key: str | None = field(default=None, repr=False)
    models: tuple[str, ...] = ()

    @classmethod
    def from_json(cls, name: str, data: Any) -> RemoteMember:
        """A member from the control API's body or the daemon's file; ValueError says what is wrong
        (never with the key in it)."""
        split_member(name)
        if not isinstance(data, dict):
            raise ValueError(f"{name}: expected an object with url, api_key and models")
        unknown = set(data) - {"url", "api_key", "models"}
        if unknown:
            raise ValueError(f"{name}: unknown fields {', '.join(sorted(unknown))}")
        url = data.get("url")
        if not isinstance(url, str):
            raise ValueError(f"{name}: url must be a string")
        key = data.get("api_key")
        if key is not None and (not isinstance(key, str) or not key.strip() or any(c.isspace() for c in key)):
            raise ValueError(f"{name}: api_key must be a non-empty string without spaces, or null")
        models = data.get("models", [])
        if not isinstance(models, list) or not all(isinstance(m, str) and m for m in models):
            raise ValueError(f"{name}: models must be a list of model names")
        return cls(name=name, url=check_url(url), api_key=key, models=tuple(dict.fromkeys(models)))

    def to_json(self) -> dict[str, Any]:
        """Everything, the key included: for the daemon's private file and the PUT body only."""
        return {"url": self.url, "api_key": self.api_key, "models": list(self.models)}

    def public_json(self) -> dict[str, Any]:
        return {"url": self.url, "api_key_set": self.api_key is not None, "models": list(self.models)}


@dataclass
class Health:
    """What the checks said of one member (monotonic seconds)."""

    url: str
    ready: bool = False
    checked_at: float | None = None  # when the last check began
    ok_at: float | None = None  # when the last check that passed began
    failures: int = 0  # checks failed running
    reason: str | None = None  # why the last check failed

    def routable(self, down_at: float | None) -> bool:
        """Whether requests may go there: it passes its checks, and passed one since a request
        last found it refusing."""
        if not self.ready:
            return False
        return down_at is None or (self.ok_at is not None and self.ok_at > down_at)


class RemoteWatch:
    """The health of every remote member, from its own /health. vLLM answers /health without a
    key, so no key travels with the checks."""

    def __init__(self, interval_s: float = 1.0, timeout_s: float = 3.0, down_after: int = 2) -> None:
        self.interval_s, self.timeout_s, self.down_after = interval_s, timeout_s, down_after
        self.health: dict[str, Health] = {}
        # Who hears, after every round, the name of each member it checked or forgot (the gateway).
        self._listeners: list[Callable[[str], None]] = []

    def subscribe(self, listener: Callable[[str], None]) -> Callable[[], None]:
        self._listeners.append(listener)
        return lambda: self.unsubscribe(listener)

    def unsubscribe(self, listener: Callable[[str], None]) -> None:
        if listener in self._listeners:
            self._listeners.remove(listener)

    def _published(self, names: list[str]) -> None:
        for name in names:
            for listener in list(self._listeners):
                try:
                    listener(name)
                except Exception:  # a reader's fault must not stop the checks
                    log.exception("a listener of the remote checks failed on %s", name)

    def routable(self, name: str, down_at: float | None) -> bool:
        h = self.health.get(name)
        return h is not None and h.routable(down_at)

    def state_json(self, name: str) -> dict[str, Any]:
        h = self.health.get(name)
        if h is None:
            return {"checked": False, "answering": None, "reason": None}
        return {
            "checked": h.checked_at is not None,
            "answering": h.ready,
            "reason": h.reason,
            "failures": h.failures,
        }

    async def check_all(self, session: aiohttp.ClientSession, members: Mapping[str, RemoteMember]) -> None:
        """Check every member at once; members that left are forgotten, and a member whose URL
        changed starts over as not yet checked."""
        gone = [n for n in self.health if n not in members]
        for name in gone:
            del self.health[name]
        for name, m in members.items():
            if name not in self.health or self.health[name].url != m.url:
                self.health[name] = Health(url=m.url)
        if members:
            await asyncio.gather(*(self._check(session, m) for m in members.values()))
        self._published([*gone, *members])

    async def _check(self, session: aiohttp.ClientSession, m: RemoteMember) -> None:
        began = time.monotonic()
        reason = await self._ask(session, m.url)
        h = self.health.get(m.name)
        if h is None or h.url != m.url:
            return  # the member changed while it was asked
        h.checked_at = began
        if reason is None:
            if not h.ready:
                back = "answers again; it is back in" if h.ok_at is not None else "answers; it joins"
                log.info("remote engine %s (%s) %s its group", m.name, m.url, back)
            h.ready, h.ok_at, h.failures, h.reason = True, began, 0, None
            return
        h.failures += 1
        h.reason = reason
        if h.ready and h.failures >= self.down_after:
            h.ready = False
            log.warning(
                "remote engine %s (%s) stopped answering (%s); its group serves on through its other engines",
                m.name,
                m.url,
                reason,
            )
        elif h.ok_at is None and h.failures == 1:
            log.warning("remote engine %s (%s) does not answer yet (%s)", m.name, m.url, reason)

    async def _ask(self, session: aiohttp.ClientSession, url: str) -> str | None:
        """None when /health answers 200; else why not."""
        try:
            async with session.get(f"{url}/health", timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as r:
                await r.read()
                return None if r.status == 200 else f"/health answered {r.status}"
        except TimeoutError:
            return f"no answer within {self.timeout_s:g} s"
        except aiohttp.ClientError as e:
            return str(e) or type(e).__name__
        except OSError as e:
            return e.strerror or str(e)


def read_members(data: Any, source: str) -> dict[str, RemoteMember]:
    """The members of the daemon's file; an entry that does not read is left out and logged."""
    out: dict[str, RemoteMember] = {}
    if not isinstance(data, dict):
        return out
    for name, entry in (data.get("members") or {}).items():
        try:
            out[name] = RemoteMember.from_json(name, entry)
        except ValueError as e:
            log.warning("%s: remote member left out: %s", source, e)
    return out


def members_json(members: Mapping[str, RemoteMember]) -> dict[str, Any]:
    return {"members": {n: m.to_json() for n, m in sorted(members.items())}}
