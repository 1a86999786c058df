"""The gateway as the daemon runs it: one front door for the host, its engine groups (the
operator's named groups, and a group of its own for every other engine), the controller loop,
and the operator's groups and window settings kept across daemon restarts.

Whenever an engine's state changes the service copies it into its group (its URL, whether it is
ready, its API key): it subscribes to the endpoints it routes to, this host's engines (the
status their supervisors publish) and other hosts' (what their health checks found), both
behind one interface (engine/gateway/endpoint.py), and syncs from that published state every
SETTLE_INTERVAL_S besides (reading no engine, building no status), which gives an engine a
request found refusing back to its groups and lets retired groups that finished go. So a
restarting engine closes its group's gate (when it was the group's last ready engine) and
requests wait in the queue until it is ready again. A group
that a membership change retires stops taking requests at once but keeps serving what it had
admitted or queued, on the same engines, until it is empty. Every controller interval each group's controller
steps and its window moves. The trace stays in memory for the console (bounded by the
controller) and goes to the store through `_store_trace`, the one place that writes it.

The front door's port is stable per LLMCONSOLE_HOME: the gateway_port setting if set
(LLMCONSOLE_GATEWAY_PORT, config.toml or a flag: docs/settings.md), else the port used last time
(in gateway.json), else a free one, which is then remembered. A port that is set or saved and
taken by another process stops the daemon at start with a message saying so: moving silently to
another port would hand that process the clients' prompts and keys. It listens on 127.0.0.1
unless the gateway_host setting says otherwise.

The door's limits are gateway.json's "limits" (see engine/gateway/door.py; any subset, the rest
default). The gateway's own key is the gateway_key setting, else the 0600 file gateway.key in the
data directory; it is required whenever any engine behind the gateway has a key (the file is
then created if there is none) and whenever the operator set one.

A named group may hold engines of other hosts (ENGINE@HOST, see engine/gateway/remote.py): their
address, API key and model names come with the group's PUT and are kept in the 0600 file
remote-members.json (never in gateway.json, which holds no secret). A watch asks each of them
for /health once a second and publishes what it finds, which their groups follow.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import secrets
import stat
import time
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import aiohttp

from llmconsole.atomic import FileWriter, set_aside, write_atomic
from llmconsole.db import Store
from llmconsole.engine.fleet import Fleet, UnknownEngine
from llmconsole.engine.gateway.door import DoorLimits
from llmconsole.engine.gateway.endpoint import Endpoint, EndpointSource, FleetEndpoints, RemoteEndpoints
from llmconsole.engine.gateway.group import EngineGroup, Upstream
from llmconsole.engine.gateway.membership import GroupError, Membership, UnknownGroup
from llmconsole.engine.gateway.pid import PidSettings, TraceSample
from llmconsole.engine.gateway.proxy import Gateway, state_of
from llmconsole.engine.gateway.remote import RemoteMember, RemoteWatch, members_json, read_members
from llmconsole.engine.status import EngineStatus
from llmconsole.settings import Resolved
from llmconsole.settings import load as load_settings

log = logging.getLogger(__name__)

# Another host's engine refused a request's connection after its last health check passed: it is
# out of the group at once, and its checks say more at their next round.
REFUSED_SINCE_CHECK = "refused a connection since its last health check; out until a check passes"
SETTLE_INTERVAL_S = 0.25
_SETTING_KEYS = ("target_ms", "signal", "min_window", "max_window", "start_window", "kp", "ki", "kd")
PORT_ENV = "LLMCONSOLE_GATEWAY_PORT"
_DRAIN_POLL_S = 0.1


class PortTaken(RuntimeError):
    """A port the operator set, or the daemon saved, is held by another process."""


def move_port(settings: Resolved, key: str) -> str:
    """How to move a port the operator set, named by where it was set."""
    origin = settings.origin(key)
    if origin.kind == "env":
        return f"set {origin.where} to a free port"
    return f"change {key} ({origin}) to a free port"


def port_taken(what: str, host: str, port: int, error: OSError, how_to_move: str) -> PortTaken:
    return PortTaken(
        f"the {what} port {host}:{port} is taken by another process ({error.strerror or error}); "
        f"stop that process, or {how_to_move}. The daemon does not move to another port on its own: "
        f"clients would send their requests and keys to whatever holds this one."
    )


class GatewayService:
    def __init__(
        self,
        fleet: Fleet,
        host: str | None = None,
        port: int | None = None,
        store: Store | None = None,
        limits: DoorLimits | None = None,
        settings: Resolved | None = None,
    ):
        self.fleet = fleet
        self.store = store  # None: the trace then lives in memory only
        # The daemon's settings; a service built without them (unit tests) resolves this process's.
        self.settings = settings if settings is not None else load_settings()
        self.host = host or self.settings.settings.gateway_host
        self._file = fleet.paths.data_dir / "gateway.json"
        self.settings_error: str | None = None  # why gateway.json was not read, when it was not
        self.key_file = fleet.paths.data_dir / "gateway.key"
        self.remotes_file = fleet.paths.data_dir / "remote-members.json"
        self.remotes: dict[str, RemoteMember] = self._read_remotes()  # ENGINE@HOST -> where, key
        # Both files are written in threads of their own, off the loop that relays the streams;
        # an operator's change is reported done once they are durable (saved()).
        self._writer = FileWriter(self._file)
        self._remotes_writer = FileWriter(self.remotes_file)
        self._remotes_on_disk = self.remotes_file.exists()
        self._unsaved: list[Future[None]] = []
        self.watch = RemoteWatch()
        # Every engine a group may route to, this host's first, then other hosts': looked up by
        # name, followed by subscription (see _moved).
        self.endpoints: tuple[EndpointSource, ...] = (
            RemoteEndpoints(lambda: self.remotes, self.watch),
            FleetEndpoints(fleet),
        )
        self._unsubscribe: list[Callable[[], None]] = []
        self._sync_due = False
        self._http: aiohttp.ClientSession | None = None
        self._watch_task: asyncio.Task[None] | None = None
        saved = self._read_file()
        set_port = self.settings.settings.gateway_port
        self._port_from = (
            "given" if port is not None else "setting" if set_port is not None else "saved" if saved.get("port") else ""
        )
        self._port = port if port is not None else set_port if set_port is not None else int(saved.get("port") or 0)
        self._saved_groups: dict[str, dict[str, Any]] = saved.get("groups", {})
        self._saved_limits = saved.get("limits")
        if limits is None:
            try:
                limits = DoorLimits.from_json(self._saved_limits)
            except (TypeError, ValueError) as e:
                log.error("the gateway limits in %s are not valid (%s); using the defaults", self._file, e)
                limits = DoorLimits()
        self.membership = Membership.from_json(saved.get("members"))
        self.gateway = Gateway(self.host, self._port, limits=limits, key=self._configured_key())
        self._draining: list[EngineGroup] = []  # retired groups still finishing their requests
        self._task: asyncio.Task[None] | None = None

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> str:
        try:
            url = await self.gateway.start()
        except OSError as e:
            if self._port == 0:
                raise
            how = (
                move_port(self.settings, "gateway_port")
                if self._port_from == "setting"
                else f'remove "port" from {self._file} (a free one is then chosen and saved) or set {PORT_ENV}'
            )
            raise port_taken("gateway", self.host, self._port, e, how) from None
        self.sync()
        self._save()
        await self.saved()
        self.fleet.status_annotators.append(self.annotate)
        self._unsubscribe = [source.subscribe(self._moved) for source in self.endpoints]
        self._task = asyncio.create_task(self._loop(), name="gateway-control")
        # Other hosts' engines: a small pool of its own, apart from the requests' connections.
        self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit_per_host=2))
        self._watch_task = asyncio.create_task(self._watch_loop(), name="gateway-remote-watch")
        return url

    async def close(self) -> None:
        for unsubscribe in self._unsubscribe:
            unsubscribe()
        self._unsubscribe = []
        self._sync_due = True  # a sync already scheduled finds the gateway closing: it does nothing
        for task in (self._task, self._watch_task):
            if task is not None:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        self._save()
        try:
            await self.saved()
        except OSError as e:
            log.error("%s could not be saved as the gateway closed: %s", self._file, e)
        await self.gateway.close()
        if self._http is not None:
            await self._http.close()
            self._http = None

    # --- engines -> groups ----------------------------------------------------------------

    def _moved(self, name: str) -> None:
        """An endpoint changed (a supervisor published, a round of remote checks ended): sync once
        the publisher is done, however many changed meanwhile (a sync for each scrape of each
        engine would be wasted). A change outside the loop is synced at once."""
        if self._sync_due:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.sync()
            return
        self._sync_due = True
        loop.call_soon(self._sync_now)

    def _sync_now(self) -> None:
        if not self._unsubscribe:
            return  # closed meanwhile
        self._sync_due = False
        try:
            self.sync()
        except Exception:  # the front door must keep serving whatever a sync does
            log.exception("gateway sync failed")

    def _endpoint(self, name: str) -> Endpoint | None:
        for source in self.endpoints:
            endpoint = source.endpoint(name)
            if endpoint is not None:
                return endpoint
        return None

    def sync(self) -> None:
        groups = self.gateway.groups
        names = list(self.fleet.engines)
        pruned = self.membership.pruned(names, remote=self.remotes)
        if pruned is not self.membership:
            self.membership = pruned  # engines that left the fleet left their groups
            self._save()
        layout = self.membership.layout(names, remote=self.remotes)
        known: dict[str, Upstream] = {}
        for g in [*self._draining, *groups.values()]:
            known.update(g.upstreams)
        for gname, members in layout.items():
            group = groups.get(gname)
            if group is None:
                group = self.gateway.add_group(EngineGroup(gname, settings=self._settings_for(gname, members)))
                saved = self._saved_groups.get(gname, {})
                if saved.get("frozen"):
                    group.set_window(int(saved.get("window", group.controller.window)))
            models: set[str] = set()
            for name in members:
                if name not in group.upstreams and name in known:
                    group.upstreams[name] = known[name]  # one object: its outstanding count carries over
                endpoint = self._endpoint(name)
                if endpoint is None:
                    continue
                up = group.upstreams.get(name)
                ready = endpoint.routable(up.down_at if up is not None else None)
                group.set_upstream(name, endpoint.url, ready, endpoint.api_key, remote=endpoint.remote)
                models |= endpoint.models
            group.model_names = models
        if self.gateway.key is None and any(g.api_keys() for g in groups.values()):
            self.gateway.key = self._ensure_key_file()  # an engine has a key: so must the door
        for gname in [n for n in groups if n not in layout]:
            self._draining.append(groups.pop(gname))  # new arrivals find no such group: 404
        self._drain()

    def _drain(self) -> None:
        """Let retired groups finish what they admitted or queued, on the engines they had."""
        still = []
        for g in self._draining:
            # Engines that left the fleet leave it; another host's engine stays until it is empty.
            for name in [n for n, u in g.upstreams.items() if n not in self.fleet.engines and not u.remote]:
                g.remove_upstream(name)
            g.refresh_open()
            if g.admission.in_flight or g.admission.queued:
                still.append(g)
        self._draining = still

    def _settings_for(self, name: str, members: tuple[str, ...] = ()) -> PidSettings:
        """A group's saved settings; a new named group starts from its first engine's."""
        saved = self._saved_groups.get(name) or (self._saved_groups.get(members[0], {}) if members else {})
        try:
            return PidSettings(**{k: saved[k] for k in _SETTING_KEYS if k in saved})
        except (TypeError, ValueError) as e:
            log.warning("window settings of %s in %s are not valid (%s); using defaults", name, self._file, e)
            return PidSettings()

    async def _loop(self) -> None:
        """Step every group's window controller each interval. The engines' state arrives by
        subscription (see _moved); the groups are also synced from the published state every
        SETTLE_INTERVAL_S, which reads no engine and builds no status: it gives an engine a
        request found refusing back to its groups, and lets retired groups that finished go."""
        next_step = time.monotonic()
        while True:
            try:
                self.sync()
                now = time.monotonic()
                if now >= next_step:
                    next_step = now + PidSettings().interval_s
                    samples = []
                    for group in self.gateway.groups.values():
                        s = group.step(now)
                        if s is not None and s.action not in ("hold-idle", "hold-samples", "hold-settling"):
                            samples.append((group.name, s))
                    if samples and self.store is not None:
                        await asyncio.to_thread(self._store_trace, samples)
            except asyncio.CancelledError:
                raise
            except Exception:  # the front door must keep serving whatever a step does
                log.exception("gateway control step failed")
            await asyncio.sleep(SETTLE_INTERVAL_S)

    async def _watch_loop(self) -> None:
        while True:
            try:
                await self.check_remotes()
            except asyncio.CancelledError:
                raise
            except Exception:  # the watch must keep going whatever one round does
                log.exception("checking the engines of other hosts failed")
            await asyncio.sleep(self.watch.interval_s)

    async def check_remotes(self) -> None:
        """Ask every remote member for its health now, and route by what they said."""
        if self._http is None:
            return
        await self.watch.check_all(self._http, dict(self.remotes))
        self.sync()  # now, for the caller; what the watch publishes is synced on the loop's next turn

    def _store_trace(self, samples: list[tuple[str, TraceSample]]) -> None:
        """Write controller steps to the store when the daemon has one; idle holds are not kept."""
        if self.store is None:
            return
        try:
            write_trace(self.store, samples)
        except Exception:
            log.exception("writing the window trace to the store failed")

    # --- the key ----------------------------------------------------------------------------

    def _configured_key(self) -> str | None:
        """The gateway_key setting, else the key file when there is one."""
        key = self.settings.settings.gateway_key
        if key is not None:
            return key.get_secret_value()
        return read_key_file(self.key_file)

    def _ensure_key_file(self) -> str:
        key = read_key_file(self.key_file)
        if key is None:
            key = secrets.token_urlsafe(32)
            write_atomic(self.key_file, key + "\n")  # 0600 from its first byte, durable
            log.info("an engine has an API key, so the gateway requires one too: created %s (0600)", self.key_file)
        return key

    def key_source(self) -> str | None:
        if self.gateway.key is None:
            return None
        if self.settings.settings.gateway_key is None:
            return str(self.key_file)
        origin = self.settings.origin("gateway_key")
        return origin.where if origin.kind == "env" else str(origin)  # the variable, or file:line

    def door_state(self) -> dict[str, Any]:
        """The door for the control API: URL, limits, connections, refusals, where the key is."""
        return {**state_of(self.gateway), "key_source": self.key_source(), "settings_error": self.settings_error}

    # --- a restart of one engine ------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def held(self, engine: str, drain_timeout_s: float) -> AsyncIterator[int]:
        """Hold `engine` out of routing and let its requests in flight finish (for at most
        `drain_timeout_s`) before the caller stops or restarts it, as a guarded apply does: the
        group serves on through its other engines, or queues. Yields what is still in flight
        when the drain ended (0 unless it timed out). The hold ends after the body, once the
        gateway has seen the engine's new state."""
        self.sync()
        self.hold_engine(engine, True)
        try:
            deadline = time.monotonic() + max(0.0, drain_timeout_s)
            while self.outstanding(engine) and time.monotonic() < deadline:
                await asyncio.sleep(_DRAIN_POLL_S)
            left = self.outstanding(engine)
            if left:
                log.warning(
                    "engine %s still has %d requests in flight after %.0f s of drain; they are cut",
                    engine,
                    left,
                    drain_timeout_s,
                )
            yield left
        finally:
            self.sync()
            self.hold_engine(engine, False)

    def _holding(self, engine: str) -> list[EngineGroup]:
        """Every group that routes to `engine`: its own or named group, a retired group still
        finishing, a primary's group that serves it as a standby."""
        return [g for g in [*self.gateway.groups.values(), *self._draining] if engine in g.upstreams]

    def hold_engine(self, engine: str, held: bool) -> None:
        """Take one engine out of routing before it restarts, or give it back. The group keeps
        serving through its other ready engines; with none left, arrivals wait in its queue."""
        for g in self._holding(engine):
            g.hold(engine, held)

    def outstanding(self, engine: str) -> int:
        """Requests the engine has now, through any group: what a restart would cut."""
        ups = {id(u): u for u in (g.upstreams[engine] for g in self._holding(engine))}
        return sum(u.outstanding for u in ups.values())

    # --- what status and the control API see ----------------------------------------------

    def group_of(self, engine: str) -> EngineGroup | None:
        """The group an engine is served in, or None (an engine not yet synced, or one whose name
        a named group holds)."""
        group = self.gateway.groups.get(self.membership.group_of(engine))
        return group if group is not None and engine in group.upstreams else None

    def group(self, name: str) -> EngineGroup:
        """A group by its name, or the group of the engine by that name."""
        self.sync()
        if name in self.membership.groups and name in self.gateway.groups:
            return self.gateway.groups[name]
        self.fleet.get(name)  # UnknownEngine for a name that is neither
        group = self.group_of(name)
        if group is None:
            raise UnknownEngine(name)
        return group

    def annotate(self, status: EngineStatus) -> EngineStatus:
        group = self.group_of(status.name)
        if group is None:
            return status
        return dataclasses.replace(
            status,
            gateway_url=self.gateway.group_url(group.name),
            window=group.admission.window,
            controller=group.state_json(trace_points=60),
        )

    def window_state(self, name: str, trace_points: int = 600) -> dict[str, Any]:
        group = self.group(name)
        state = group.state_json(trace_points)
        return {
            "engine": name,
            "group": group.name,
            "gateway_url": self.gateway.group_url(group.name),
            **state,
            "engines": self._members_state(state["engines"]),
        }

    def _members_state(self, engines: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        """A group's engines as the control API shows them; another host's with what its checks
        found (never its key), and why it is out when a request took it out before a check did."""
        out = {}
        for name, e in engines.items():
            if e.get("remote"):
                health = self.watch.state_json(name)
                if not e["ready"] and health["answering"] and health["reason"] is None:
                    health = {**health, "reason": REFUSED_SINCE_CHECK}
                e = {**e, "health": health}
            out[name] = e
        return out

    # --- named groups ---------------------------------------------------------------------

    def groups_state(self) -> list[dict[str, Any]]:
        """Every group the gateway serves, named or an engine's own, for `group ls`; then the
        retired groups still finishing what they had (their route is gone: no URL)."""
        self.sync()
        out = []
        served = [(name, g, False) for name, g in sorted(self.gateway.groups.items())]
        for name, g, retired in [*served, *((g.name, g, True) for g in self._draining)]:
            st = g.admission.stats()
            out.append(
                {
                    "group": name,
                    "named": not retired and name in self.membership.groups,
                    "retired": retired,
                    "engines": list(g.upstreams),
                    "members": self._members_state(g.state_json(trace_points=0)["engines"]),
                    "gateway_url": None if retired else self.gateway.group_url(name),
                    "window": st.window,
                    "frozen": g.controller.frozen,
                    "in_flight": st.in_flight,
                    "queued": st.queued,
                    "admitted_total": st.admitted_total,
                }
            )
        return out

    def set_group(
        self, name: str, engines: list[str], remote: Mapping[str, RemoteMember] | None = None
    ) -> dict[str, Any]:
        """Form or change a named group; bad input raises GroupError and changes nothing.
        `remote`: where the group's engines of other hosts (ENGINE@HOST) listen, and their keys;
        one named again without them keeps what the daemon had."""
        remote = dict(remote or {})
        stray = sorted(set(remote) - set(engines))
        if stray:
            raise GroupError(f"an address was given for engines the group does not name: {', '.join(stray)}")
        new = self.membership.with_group(name, engines, self.fleet.engines, remote=[*self.remotes, *remote])
        group = self.gateway.groups.get(name)
        self.membership = new
        self.remotes.update(remote)
        self._prune_remotes()
        if group is not None:  # engines the group no longer names go back to groups of their own
            gone = [n for n, u in group.upstreams.items() if (n in self.fleet.engines or u.remote) and n not in engines]
            for n in gone:
                group.remove_upstream(n)
        self.sync()
        self._save()
        return self.group_state(name)

    def group_state(self, name: str) -> dict[str, Any]:
        """A named group as `group ls` shows it."""
        return next(g for g in self.groups_state() if g["group"] == name and not g["retired"])

    def remove_group(self, name: str) -> list[str]:
        """Dissolve a named group; its engines go back to groups of their own."""
        if name not in self.membership.groups:
            raise UnknownGroup(name)
        members = list(self.membership.groups[name])
        self.membership = self.membership.without_group(name)
        self._prune_remotes()
        group = self.gateway.groups.get(name)
        if group is not None and name in self.fleet.engines:  # the group was named after one of its
            for other in [e for e in members if e != name]:  # engines: it goes on as that one's own
                group.remove_upstream(other)
        self.sync()
        self._save()
        return members

    def change_window(
        self,
        name: str,
        *,
        settings: dict[str, Any] | None = None,
        freeze: bool | None = None,
        window: int | None = None,
    ) -> dict[str, Any]:
        """Apply an operator's change; bad input raises ValueError and changes nothing."""
        group = self.group(name)
        settings = {k: v for k, v in (settings or {}).items() if v is not None}
        unknown = set(settings) - set(_SETTING_KEYS)
        if unknown:
            raise ValueError(f"unknown window settings: {', '.join(sorted(unknown))}")
        if window is not None and freeze is False:
            raise ValueError("setting the window freezes the controller; do not also release it")
        old = group.controller.settings
        if ("min_window" in settings or "max_window" in settings) and "start_window" not in settings:
            lo, hi = settings.get("min_window", old.min_window), settings.get("max_window", old.max_window)
            if isinstance(lo, int) and isinstance(hi, int):  # keep the start inside new bounds
                settings["start_window"] = min(max(old.start_window, lo), max(lo, hi))
        new = dataclasses.replace(old, **settings) if settings else old
        if window is not None and not new.min_window <= int(window) <= new.max_window:
            raise ValueError(f"window {window} is outside [{new.min_window}, {new.max_window}]")
        if settings:
            group.configure(**settings)
        if window is not None:
            group.set_window(int(window))
        elif freeze is not None:
            group.freeze(freeze)
        self._save()
        return self.window_state(name, trace_points=60)

    # --- persistence ----------------------------------------------------------------------

    def _prune_remotes(self) -> None:
        """Forget the address and key of another host's engine that no group names any more, and
        keep the file as the daemon holds them."""
        named = {m for members in self.membership.groups.values() for m in members}
        self.remotes = {n: m for n, m in self.remotes.items() if n in named}
        self._save_remotes()

    def _read_remotes(self) -> dict[str, RemoteMember]:
        """remote-members.json: made 0600 first if others could read it (it holds keys)."""
        try:
            if self.remotes_file.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
                log.warning("%s could be read by other users; it is now 0600", self.remotes_file)
                os.chmod(self.remotes_file, 0o600)
            data = json.loads(self.remotes_file.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            log.error("%s cannot be read (%s); groups hold no engine of another host", self.remotes_file, e)
            return {}
        return read_members(data, str(self.remotes_file))

    def _save_remotes(self) -> None:
        """Written whole and replaced at once, 0600 from the start (it holds keys)."""
        if not self.remotes and not self._remotes_on_disk:
            return
        self._remotes_on_disk = True
        self._written(self._remotes_writer.submit(json.dumps(members_json(self.remotes), indent=1)))

    def _written(self, write: Future[None]) -> None:
        """Keep track of a write until saved() is awaited. Without a running loop (a caller that is
        not the daemon's loop) the write is waited for here."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            write.result()
            return
        # Writes that went well need no more watching; a failed one waits for saved() to say so.
        self._unsaved = [f for f in self._unsaved if not f.done() or f.exception() is not None]
        self._unsaved.append(write)

        def logged(f: Future[None]) -> None:
            if (e := f.exception()) is not None:
                log.error("gateway settings not saved: %s", e)

        write.add_done_callback(logged)

    async def saved(self) -> None:
        """Wait until every settings write asked for so far is durable; OSError if one failed."""
        pending, self._unsaved = self._unsaved, []
        for write in pending:
            await asyncio.wrap_future(write)

    def _read_file(self) -> dict[str, Any]:
        """gateway.json, or {} when there is none. One that cannot be read (torn by a crash of an
        older version, edited by hand) is never silently replaced: it is set aside as
        gateway.json.corrupt-<time>, the daemon starts with the defaults, and says so in its log
        and its status (settings_error) for as long as this daemon runs."""
        try:
            data = json.loads(self._file.read_text())
            if not isinstance(data, dict):
                raise ValueError(f"expected a JSON object, found {type(data).__name__}")
            return data
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            why = str(e)
        try:
            aside: Path | None = set_aside(self._file)
        except OSError as e:
            aside = None
            log.error("could not set %s aside (%s)", self._file, e)
        self.settings_error = (
            f"{self._file} could not be read ({why}); "
            + (f"it was kept as {aside.name}; " if aside is not None else "")
            + "the gateway started with the default port, groups and limits"
        )
        log.error("%s", self.settings_error)
        return {}

    def _save(self) -> None:
        groups = dict(self._saved_groups)
        for name, g in self.gateway.groups.items():
            s = g.controller.settings
            groups[name] = {
                **{k: getattr(s, k) for k in _SETTING_KEYS},
                "signal": str(s.signal),
                "frozen": g.controller.frozen,
                "window": g.controller.window,
            }
        groups = {n: v for n, v in groups.items() if n in self.fleet.engines or n in self.membership.groups}
        self._saved_groups = groups
        saved: dict[str, Any] = {"port": self.gateway.port, "groups": groups, "members": self.membership.to_json()}
        if self._saved_limits is not None:
            saved["limits"] = self._saved_limits  # the operator's, kept as written
        self._written(self._writer.submit(json.dumps(saved, indent=1)))


def write_trace(store: Store, samples: list[tuple[str, TraceSample]]) -> int:
    """Controller steps as rows of the store's window_trace table (group, time, terms, window)."""
    return store.add_window_trace(
        [
            {
                "group_name": g,
                "at_s": s.at_s,
                "target": s.target_ms,
                "measured": s.measured_ms,
                "error": s.error,
                "p": s.p,
                "i": s.i,
                "d": s.d,
                "window": float(s.window),
            }
            for g, s in samples
        ]
    )


def read_key_file(path: Path) -> str | None:
    """A key file's key, or None when there is none. A file others can read is made 0600 first."""
    try:
        mode = path.stat().st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            log.warning("%s could be read by other users; it is now 0600", path)
            os.chmod(path, 0o600)
        key = path.read_text().strip()
    except FileNotFoundError:
        return None
    return key or None
