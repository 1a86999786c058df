"""The host's engines: the supervisors, their persisted state, and adoption after a restart.

The state file is what lets engines outlive the daemon: every change of an engine's process or
desired state is written to it (atomically, 0600) before the change is reported, and a new
daemon reads it to adopt the engines that are still serving and to restart the ones that died
while no daemon was watching. It holds the engines' API keys, which a restart needs, so it is
private to the user like ~/.netrc; nothing else the console writes ever holds them.
"""

from __future__ import annotations

import json
import logging
import os
import re
import tempfile
from collections.abc import Callable
from typing import Any, TypeVar

import aiohttp

from llmconsole.engine.host import HostProbe
from llmconsole.engine.plan.validate import enforce as enforce_fit
from llmconsole.engine.process import ProcessRecord
from llmconsole.engine.runtime import Runtime, RuntimeNotFound, detect
from llmconsole.engine.spec import EngineSpec, KernelUnavailable
from llmconsole.engine.status import EngineState, EngineStatus
from llmconsole.engine.supervisor import EngineBusy, EngineSupervisor, SupervisionPolicy
from llmconsole.paths import Paths

log = logging.getLogger(__name__)

_T = TypeVar("_T")

STATE_VERSION = 1
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class UnknownEngine(KeyError):
    def __str__(self) -> str:
        return f"no engine named {self.args[0]!r}"


def enforce_kernel(spec: EngineSpec) -> None:
    """Refuse (KernelUnavailable, before anything changes) a spec whose kernel its runtime cannot
    run. `force` does not lift it: the runtime's plugin would not put the kernel in either."""
    if spec.kernel == "stock":
        return
    try:
        runtime = spec.runtime or detect()
    except RuntimeNotFound:
        return  # the launch itself fails, saying so
    reason = spec.kernel_refusal(runtime)
    if reason is not None:
        raise KernelUnavailable(reason)


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise ValueError(
            f"engine name {name!r} is not valid: use letters, digits, '.', '_' or '-' "
            "(at most 63, starting with a letter or digit)"
        )
    return name


def _spec_to_record(spec: EngineSpec) -> dict[str, Any]:
    d = spec.config_dict()
    d["api_key"] = spec.api_key.get_secret_value() if spec.api_key else None
    return d


class Fleet:
    def __init__(self, paths: Paths, policy: SupervisionPolicy | None = None):
        self.paths = paths
        self.policy = policy or SupervisionPolicy()
        self.probe = HostProbe()
        self.engines: dict[str, EngineSupervisor] = {}
        self._http: aiohttp.ClientSession | None = None
        # Who hears of changes (the recorder) and of configs the supervisor gave up on (a crash
        # loop, or a fresh start that never came up: the rollback). A listener that fails is
        # logged and skipped: nothing it does may stop supervision.
        self.status_listeners: list[Callable[[EngineStatus], None]] = []
        self.config_failed_listeners: list[Callable[[str], None]] = []
        # What adds to each status before it is reported (the gateway: its URL and window).
        self.status_annotators: list[Callable[[EngineStatus], EngineStatus]] = []

    # --- lifecycle ------------------------------------------------------------------------

    async def open(self) -> list[str]:
        """Load the state file, adopt live engines, restart lost ones. Returns what was done."""
        # Keep-alive connections to each engine make the 1 Hz health checks and scrapes cheap.
        self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit_per_host=4))
        return self._load()

    async def close(self, stop_engines: bool = False) -> None:
        for sup in list(self.engines.values()):
            if stop_engines:
                await sup.stop()
            else:
                await sup.detach()
        self._persist()
        if self._http is not None:
            await self._http.close()

    # --- operator actions -----------------------------------------------------------------

    def get(self, name: str) -> EngineSupervisor:
        try:
            return self.engines[name]
        except KeyError:
            raise UnknownEngine(name) from None

    async def start(self, name: str, spec: EngineSpec | None, force: bool = False) -> EngineSupervisor:
        """Start `name`, creating it if new. With no spec, start it on its last one.

        A config that cannot fit is refused (ConfigDoesNotFit, with the numbers) before anything
        changes, unless `force`.
        """
        check_name(name)
        sup = self.engines.get(name)
        target = spec if spec is not None else (sup.spec if sup is not None else None)
        if target is not None:
            enforce_kernel(target)
            enforce_fit(target, force)
        if sup is None:
            if spec is None:
                raise UnknownEngine(name)
            sup = self._new_supervisor(name, spec)
            self.engines[name] = sup
            await sup.start()
        else:
            await sup.start(spec)
        self._persist()
        return sup

    async def stop(self, name: str, drain_timeout_s: float | None = None) -> EngineSupervisor:
        sup = self.get(name)
        await sup.stop(drain_timeout_s)
        self._persist()
        return sup

    async def restart(self, name: str, spec: EngineSpec | None = None, force: bool = False) -> EngineSupervisor:
        sup = self.get(name)
        enforce_kernel(spec if spec is not None else sup.spec)
        enforce_fit(spec if spec is not None else sup.spec, force)
        await sup.restart(spec)
        self._persist()
        return sup

    async def remove(self, name: str) -> None:
        sup = self.get(name)
        if sup.state.running or sup.state == EngineState.CRASHED:
            raise EngineBusy(f"engine {name} is {sup.state}; stop it before removing it")
        del self.engines[name]
        self._persist()

    def statuses(self) -> list[EngineStatus]:
        out = [sup.status() for sup in self.engines.values()]
        for annotate in self.status_annotators:
            out = [annotate(s) for s in out]
        return out

    # --- persistence ----------------------------------------------------------------------

    def _new_supervisor(self, name: str, spec: EngineSpec) -> EngineSupervisor:
        assert self._http is not None, "Fleet.open() first"
        return EngineSupervisor(
            name,
            spec,
            self.paths.engine_log(name),
            self._http,
            self.policy,
            probe=self.probe,
            on_change=self._changed,
            on_crash_loop=lambda s: self._notify(self.config_failed_listeners, s.name),
        )

    def _changed(self, sup: EngineSupervisor) -> None:
        self._persist()
        if self.status_listeners:
            self._notify(self.status_listeners, sup.status())

    @staticmethod
    def _notify(listeners: list[Callable[[_T], None]], value: _T) -> None:
        for listener in listeners:
            try:
                listener(value)
            except Exception:
                log.exception("a listener failed on %r", getattr(value, "name", value))

    def _persist(self) -> None:
        engines = {}
        for name, sup in self.engines.items():
            rec = sup.process_record()
            engines[name] = {
                "spec": _spec_to_record(sup.spec),
                "runtime": sup.runtime.model_dump() if sup.runtime else None,
                "port": sup.port,
                "desired": "running" if sup.desired_running else "stopped",
                "state": str(sup.state),
                "restarts": sup.restarts,
                "last_error": sup.last_error,
                "process": None if rec is None else {
                    "pid": rec.pid, "create_time": rec.create_time, "port": rec.port, "argv": list(rec.argv),
                },
            }
        data = json.dumps({"version": STATE_VERSION, "engines": engines}, indent=1)
        self.paths.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, tmp = tempfile.mkstemp(dir=self.paths.data_dir, prefix=".engines.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:  # mkstemp creates it 0600
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.paths.state_file)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def _load(self) -> list[str]:
        path = self.paths.state_file
        if not path.exists():
            return []
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise RuntimeError(
                f"engine state file {path} is unreadable ({e}); move it aside to start with no engines"
            ) from e
        if data.get("version") != STATE_VERSION:
            raise RuntimeError(f"engine state file {path} has version {data.get('version')}, expected {STATE_VERSION}")
        done = []
        for name, rec in data.get("engines", {}).items():
            try:
                spec = EngineSpec(**rec["spec"])
            except Exception as e:  # e.g. the model directory was deleted
                log.error("engine %s: stored spec no longer valid: %s", name, e)
                done.append(f"{name}: stored spec invalid ({e}); left stopped")
                continue
            sup = self._new_supervisor(name, spec)
            if rec.get("runtime"):
                sup.runtime = Runtime(**rec["runtime"])
            sup.port = rec.get("port")
            sup.restarts = int(rec.get("restarts", 0))
            sup.last_error = rec.get("last_error")
            if rec.get("state") == str(EngineState.FAILED):
                sup.state = EngineState.FAILED
            self.engines[name] = sup
            if rec.get("desired") != "running":
                done.append(f"{name}: stopped")
                continue
            proc = rec.get("process")
            if proc and sup.adopt(ProcessRecord(proc["pid"], proc["create_time"], proc["port"], tuple(proc["argv"])), sup.restarts):
                done.append(f"{name}: adopted pid {proc['pid']}")
            else:
                sup.resume_after_lost(sup.restarts + 1, "the engine died while no daemon was supervising it")
                done.append(f"{name}: not running any more; restarting")
        self._persist()
        return done

