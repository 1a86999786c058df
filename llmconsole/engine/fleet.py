"""The host's engines: the supervisors, their persisted state, and adoption after a restart.

The state file is what lets engines outlive the daemon: every change of an engine's process or
desired state is written to it (atomically, 0600) before the change is reported, and a new
daemon reads it to adopt the engines that are still serving and to restart the ones that died
while no daemon was watching. It holds the engines' API keys, which a restart needs, and the
values of the secret-named env vars (HF_TOKEN, ...) each engine has run with, by name, which a
rollback to an older version needs; so it is private to the user like ~/.netrc, and nothing else
the console writes ever holds them (the config history keeps those names only). The keys of
other hosts' engines that the gateway's groups route to are kept apart, in the gateway's own
0600 file remote-members.json.

Nothing in it is ever dropped. A stored spec that no longer validates (its model directory was
moved, a field from a newer version) stays, verbatim, and its engine stays listed as `invalid`
with the reason until `engine start` finds it valid again. A write that fails (a full disk, no
file descriptor left) never stops supervision: the engines' records stay in memory, every
status says the file is not saved, and the write is retried until it succeeds.

A restart (an operator's, a rollback, a mode switch) writes its target to the file as the
engine's `change`, with the engine desired running, before the old process is stopped; each
process record names the config it runs. A daemon killed half-way through leaves one of three
states, and the next daemon resumes each (`_load_one`): the old process still runs (it is
adopted, on the old config; the change is not made), no process runs (the target is started,
as a fresh start: one that never comes up is rolled back as a failed apply is), or the target's
process is starting (it is adopted). What it found for each engine is kept in `found`, for the
actions the dead daemon left unfinished.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any, TypeVar

import aiohttp
from pydantic import ValidationError

from llmconsole.atomic import FileWriter
from llmconsole.engine.host import HostProbe, tree_rss_bytes
from llmconsole.engine.modes.memory import with_default_kv
from llmconsole.engine.plan.validate import Neighbour, Verdict, explicit_kv_bytes
from llmconsole.engine.plan.validate import enforce as enforce_plan
from llmconsole.engine.process import ProcessRecord
from llmconsole.engine.runtime import Runtime
from llmconsole.engine.spec import EngineSpec, validation_messages
from llmconsole.engine.spec_checks import check_name, enforce_kernel, enforce_runnable, spec_device
from llmconsole.engine.status import EngineState, EngineStatus
from llmconsole.engine.status_board import StatusBoard
from llmconsole.engine.supervision_policy import SupervisionPolicy
from llmconsole.engine.supervisor import (
    ChangeEnded,
    EngineBusy,
    EngineSupervisor,
    PauseAt,
    PendingChange,
    PortInUse,
    port_holder,
)
from llmconsole.paths import Paths

log = logging.getLogger(__name__)

_T = TypeVar("_T")

STATE_VERSION = 1


class UnknownEngine(KeyError):
    def __str__(self) -> str:
        return f"no engine named {self.args[0]!r}"


class NeedsRestart(EngineBusy):
    """A start asked a running engine for another config: nothing changed; a restart applies it."""


def _check_launchable(spec: EngineSpec) -> None:
    """Refuse (ValueError: nothing changes) a spec that still holds a stand-in for a secret."""
    missing = spec.unresolved_secrets()
    if missing:
        raise ValueError(
            f"env {', '.join(missing)} holds the stand-in of a stored secret, not its value: "
            f"give it with --env {missing[0]}=..."
        )


def _spec_to_record(spec: EngineSpec) -> dict[str, Any]:
    d = spec.config_dict()
    d["api_key"] = spec.api_key.get_secret_value() if spec.api_key else None
    return d


# The model of a stand-in spec when the stored one names none.
_NO_MODEL = "unknown-model"


def _stand_in_spec(raw: dict[str, Any]) -> EngineSpec:
    """A spec for an engine whose stored spec no longer validates: every field that still
    validates, the others at their defaults, and the model as stored. It names and guards the
    engine (host, port, key) while the stored spec is kept; it is never launched."""
    fields = {k: v for k, v in raw.items() if k in EngineSpec.model_fields and k != "model"}
    for _ in range(len(fields) + 1):
        try:
            spec = EngineSpec(model=_NO_MODEL, **fields)
            break
        except ValidationError as e:
            bad = {str(err["loc"][0]) for err in e.errors() if err["loc"]}
            if not bad & set(fields):  # only fields that disagree with each other: keep the basics
                bad = set(fields) - {"host", "port", "api_key", "served_model_name"}
            fields = {k: v for k, v in fields.items() if k not in bad}
    else:
        spec = EngineSpec(model=_NO_MODEL)
    model = raw.get("model")
    return spec.model_copy(update={"model": model}) if isinstance(model, str) and model else spec


class Fleet:
    def __init__(
        self,
        paths: Paths,
        policy: SupervisionPolicy | None = None,
        pause_at: PauseAt | None = None,
        cpu_kv_budget_bytes: int | None = None,
        engine_env: Mapping[str, str] | None = None,
    ):
        self.paths = paths
        self.policy = policy or SupervisionPolicy()
        # The memory a CPU engine given no KV size gets its share of (the daemon's setting; None:
        # a share of the host's memory, engine/modes/memory.py).
        self.cpu_kv_budget_bytes = cpu_kv_budget_bytes
        # The environment engines start from: the daemon's own, handed down (engine/ never reads
        # the environment); llmconsole's variables are taken out of it at launch (process.py).
        # None: the spec's variables only.
        self.engine_env = engine_env
        self.pause_at = pause_at  # a fault-injection point for tests (see EngineSupervisor)
        # What the daemon found of each engine at its start ("engine running on config X (the
        # target)", ...): what the actions a dead daemon left unfinished are closed with.
        self.found: dict[str, str] = {}
        self.probe = HostProbe()
        self.engines: dict[str, EngineSupervisor] = {}
        # The latest status of every engine, as its supervisor published it: what the API, the
        # recorder, the exporter and the gateway read (engine/status_board.py).
        self.board = StatusBoard()
        self._http: aiohttp.ClientSession | None = None
        # Who hears of changes (the recorder) and of configs the supervisor gave up on (a crash
        # loop, or a fresh start that never came up: the rollback). A listener that fails is
        # logged and skipped: nothing it does may stop supervision.
        self.status_listeners: list[Callable[[EngineStatus], None]] = []
        self.config_failed_listeners: list[Callable[[str], None]] = []
        # What adds to each status before it is reported (the gateway: its URL and window).
        self.status_annotators: list[Callable[[EngineStatus], EngineStatus]] = []
        # Who records how a restart asked for by an action ended (the daemon's action log).
        self.change_listeners: list[ChangeEnded] = []
        # Why the state file could not be written (None: every record is saved), and the task
        # that retries the write meanwhile.
        self.record_error: str | None = None
        self._save_retry: asyncio.Task[None] | None = None
        self._save_retry_s = (0.5, 10.0)  # first and longest pause between tries
        # Entries of the state file this version cannot read at all: written back untouched.
        self._unreadable: dict[str, Any] = {}
        # Per engine, the value of every secret-named env var it has run with (the latest one).
        self._secret_env: dict[str, dict[str, str]] = {}
        # The state file is written (and fsynced) in a thread of its own, in order, never on the
        # event loop that relays the gateway's streams (see _changed and _save).
        self._writer = FileWriter(paths.state_file)

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
        if self._save_retry is not None:
            self._save_retry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._save_retry
        for _ in range(10):
            if self._persist(retry=False):
                break
            await asyncio.sleep(0.5)
        else:
            log.error(
                "engine state file %s could not be written before the daemon stopped; engines left "
                "running are missing from it: %s",
                self.paths.state_file,
                ", ".join(f"{n} pid {r.pid}" for n, s in self.engines.items() if (r := s.process_record())) or "none",
            )
        await asyncio.sleep(0)  # the listeners hear of the last changes, now saved, before we return
        if self._http is not None:
            await self._http.close()

    # --- operator actions -----------------------------------------------------------------

    def get(self, name: str) -> EngineSupervisor:
        try:
            return self.engines[name]
        except KeyError:
            raise UnknownEngine(name) from None

    def secret_env(self, name: str) -> dict[str, str]:
        """The values of the secret-named env vars `name` has run with, by name (the latest of
        each): what a rollback to a stored version, which names them only, launches with."""
        sup = self.engines.get(name)
        return {**self._secret_env.get(name, {}), **(sup.spec.secret_env() if sup else {})}

    async def start(self, name: str, spec: EngineSpec | None, force: bool = False) -> EngineSupervisor:
        """Start `name`, creating it if new. With no spec, start it on its last one.

        A config that cannot fit is refused (ConfigDoesNotFit, with the numbers) before anything
        changes, unless `force`. So is another config for an engine that runs (NeedsRestart,
        naming the restart that would apply it): a start never changes a running engine.
        """
        check_name(name)
        sup = self.engines.get(name)
        if sup is not None and spec is None and sup.stored is not None:
            spec = sup.revalidate()  # pydantic's ValidationError if it still does not: nothing changes
        if spec is not None:
            spec = self.launch_spec(spec)
        elif sup is not None and not (sup.state.running or sup.state == EngineState.CRASHED):
            launched = self.launch_spec(sup.spec)  # a last spec stored before KV sizes were given
            spec = launched if launched != sup.spec else None
        target = spec if spec is not None else (sup.spec if sup is not None else None)
        if target is not None:
            _check_launchable(target)
            enforce_kernel(target)
            enforce_runnable(target)
        if (
            sup is not None
            and spec is not None
            and spec != sup.spec
            and (sup.state.running or sup.state == EngineState.CRASHED)
        ):
            flags = " ".join(sup.spec.restart_flags(spec)) or "(a change of secret values only)"
            raise NeedsRestart(
                f"engine {name} is {sup.state} on config {sup.spec.config_id}; start does not change a running "
                f"engine. To apply the change: llmconsole engine restart {name} {flags}".rstrip()
            )
        if target is not None:
            self.enforce_fit(name, target, force)
            if sup is None or not (sup.state.running or sup.state == EngineState.CRASHED):
                # Only a port asked for is held to: one picked before is picked anew if taken.
                self._check_port(name, target.host, target.port, probe=True)
        if sup is None:
            if spec is None:
                raise UnknownEngine(name)
            sup = self._new_supervisor(name, spec)
            self.engines[name] = sup
            await sup.start()
        else:
            await sup.start(spec)
        await self._save()
        return sup

    async def stop(self, name: str, drain_timeout_s: float | None = None) -> EngineSupervisor:
        sup = self.get(name)
        await sup.stop(drain_timeout_s)
        await self._save()
        return sup

    async def restart(
        self,
        name: str,
        spec: EngineSpec | None = None,
        force: bool = False,
        *,
        action_id: int | None = None,
        done_outcome: str = "done",
    ) -> EngineSupervisor:
        """Restart `name` (on `spec`). With `action_id`, that action is ended (`done_outcome`,
        `failed` or `cancelled`) when the target serves or is given up on: see change_listeners."""
        sup = self.get(name)
        if spec is None and sup.stored is not None:
            spec = sup.revalidate()
        launched = self.launch_spec(spec if spec is not None else sup.spec)
        if spec is not None or launched != sup.spec:
            spec = launched
        if spec is not None:
            _check_launchable(spec)
        target = spec if spec is not None else sup.spec
        enforce_kernel(target)
        enforce_runnable(target)
        self.enforce_fit(name, target, force)
        # Its own listener is on its port until the restart stops it: probe only another port.
        self._check_port(name, target.host, target.port, probe=not (sup.state.running and target.port == sup.port))
        await sup.restart(spec, action_id, done_outcome)
        await self._save()
        return sup

    async def remove(self, name: str) -> None:
        sup = self.get(name)
        if sup.state.running or sup.state == EngineState.CRASHED:
            raise EngineBusy(f"engine {name} is {sup.state}; stop it before removing it")
        del self.engines[name]
        self.board.withdraw(name)
        self._secret_env.pop(name, None)
        await self._save()

    def launch_spec(self, spec: EngineSpec) -> EngineSpec:
        """`spec` as the fleet launches it: a CPU engine given no KV size gets the default memory
        mode's share of the CPU budget as an explicit one (engine/modes/memory.py), so its config
        id, its status and its history say what runs. Other specs are returned as they are."""
        device = spec_device(spec)
        if device is None:
            return spec
        launched = with_default_kv(spec, device, self.cpu_kv_budget_bytes)
        if launched is not spec:
            log.info(
                "%s: no KV size given; the default memory mode's: kv_cache_memory_bytes %d",
                spec.display_name,
                launched.kv_cache_memory_bytes or 0,
            )
        return launched

    def neighbours(self, name: str) -> list[Neighbour]:
        """The engines other than `name` that hold (or are about to hold) this host's memory, as
        the fit check counts them: each one's KV size and the resident memory of its processes."""
        out = []
        for other, sup in self.engines.items():
            if other == name or not (sup.state.running or sup.state == EngineState.CRASHED):
                continue
            device = sup.runtime.device if sup.runtime else spec_device(sup.spec)
            kv = explicit_kv_bytes(sup.spec, "cpu")[0] if device == "cpu" else None
            pid = sup.status().pid
            rss = tree_rss_bytes(pid) if pid is not None else None
            out.append(Neighbour(other, kv, rss, kv_allocated=sup.state in (EngineState.READY, EngineState.UNHEALTHY)))
        return out

    def enforce_fit(self, name: str, spec: EngineSpec, force: bool = False) -> Verdict | None:
        """The planner's fit check of `spec` for engine `name`, beside the other engines running
        here (the engine's own memory is freed by its restart): ConfigDoesNotFit, with the
        numbers, before anything changes, unless `force`."""
        if force:
            return None
        return enforce_plan(spec, beside=self.neighbours(name))

    def _check_port(self, name: str, host: str, port: int | None, probe: bool) -> None:
        """Refuse (PortInUse) a port another engine holds, or anything else listens on."""
        if port is None:
            return
        for other_name, other in self.engines.items():
            if (
                other_name != name
                and other.port == port
                and (other.state.running or other.state == EngineState.CRASHED)
            ):
                raise PortInUse(
                    f"port {port} is engine {other_name}'s ({other.state}); give {name} another "
                    "--port, or none for a free one"
                )
        holder = port_holder(host, port) if probe else None
        if holder is not None:
            raise PortInUse(
                f"port {port} is already in use on {host} by {holder}; give {name} another "
                "--port, or none for a free one"
            )

    def status(self, name: str) -> EngineStatus:
        """The engine's latest published status (UnknownEngine for a name the fleet lacks)."""
        st = self.board.get(name)
        return st if st is not None else self.get(name).status()

    def statuses(self) -> list[EngineStatus]:
        """Every engine's latest published status, with what the annotators add (the gateway's
        window): read from the board, nothing is built."""
        out = [self.status(name) for name in self.engines]
        for annotate in self.status_annotators:
            out = [annotate(s) for s in out]
        return out

    # --- persistence ----------------------------------------------------------------------

    def _new_supervisor(self, name: str, spec: EngineSpec) -> EngineSupervisor:
        assert self._http is not None, "Fleet.open() first"
        sup = EngineSupervisor(
            name,
            spec,
            self.paths.engine_log(name),
            self._http,
            self.policy,
            probe=self.probe,
            on_change=self._changed,
            on_crash_loop=lambda s: self._notify(self.config_failed_listeners, s.name),
            pause_at=self.pause_at,
            on_change_end=self._change_ended,
            save_now=self._save,
            engine_env=self.engine_env,
            publish=self.board.publish,
        )
        sup.record_error = self.record_error
        sup.publish()
        return sup

    def _change_ended(self, sup: EngineSupervisor, change: PendingChange, outcome: str, reason: str | None) -> None:
        for listener in self.change_listeners:
            try:
                listener(sup, change, outcome, reason)
            except Exception:
                log.exception("a listener failed on the end of %s's restart", sup.name)

    def _changed(self, sup: EngineSupervisor) -> None:
        """A supervisor's state moved: the state file is rewritten off the loop, and the listeners
        hear of the change once that write is durable (so a daemon killed after the recorder saw
        a new pid always finds that pid in the state file)."""
        status = sup.status() if self.status_listeners else None
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a synchronous caller): write here
            self._persist()
            if status is not None:
                self._notify(self.status_listeners, dataclasses.replace(status, record_error=self.record_error))
            return
        written = self._writer.submit(self._state_json())

        def report(f: Future[None]) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody to tell
                loop.call_soon_threadsafe(self._change_saved, f, status)

        written.add_done_callback(report)

    def _change_saved(self, written: Future[None], status: EngineStatus | None) -> None:
        error = written.exception()
        if isinstance(error, OSError):
            self._save_failed(error, retry=True)
        elif error is not None:
            log.error("engine state file %s not saved", self.paths.state_file, exc_info=error)
        else:
            self._saved()
        if status is not None:
            self._notify(self.status_listeners, dataclasses.replace(status, record_error=self.record_error))

    @staticmethod
    def _notify(listeners: list[Callable[[_T], None]], value: _T) -> None:
        for listener in listeners:
            try:
                listener(value)
            except Exception:
                log.exception("a listener failed on %r", getattr(value, "name", value))

    def _records(self) -> dict[str, Any]:
        engines: dict[str, Any] = dict(self._unreadable)
        for name, sup in self.engines.items():
            rec = sup.process_record()
            stored = sup.stored
            self._secret_env[name] = self.secret_env(name)
            engines[name] = {
                "spec": stored["spec"] if stored is not None else _spec_to_record(sup.spec),
                "secret_env": self._secret_env[name],
                "runtime": (
                    stored.get("runtime") if stored is not None else sup.runtime.model_dump() if sup.runtime else None
                ),
                "port": sup.port,
                "port_note": sup.port_note,
                # A restart under way wants the engine running all along, its old process stopped.
                "desired": "running" if sup.desired_running or sup.change is not None else "stopped",
                "change": None
                if sup.change is None
                else {"spec": _spec_to_record(sup.change.target), "from_config_id": sup.change.from_config_id},
                "state": str(sup.state),
                "restarts": sup.restarts,
                "last_error": sup.last_error,
                "process": None
                if rec is None
                else {
                    "pid": rec.pid,
                    "create_time": rec.create_time,
                    "port": rec.port,
                    "argv": list(rec.argv),
                    "config_id": rec.config_id,
                },
            }
        return engines

    def _state_json(self) -> str:
        return json.dumps({"version": STATE_VERSION, "engines": self._records()}, indent=1)

    def _write_state(self) -> None:
        """Write and wait (at open and close only: blocking there is intended), in order with the
        writes under way. 0600: the file holds secret env values."""
        self.paths.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._writer.write(self._state_json())

    async def _save(self) -> bool:
        """Write the state file off the loop and return once it is durable (an operator's action
        is reported done only then); False, with the engines' record_error set and a retry
        started, when it could not be written."""
        try:
            await asyncio.wrap_future(self._writer.submit(self._state_json()))
        except OSError as e:
            self._save_failed(e, retry=True)
            return False
        self._saved()
        return True

    def _saved(self) -> None:
        if self.record_error is not None:
            log.warning("engine state file %s is saved again", self.paths.state_file)
            self._set_record_error(None)

    def _persist(self, retry: bool = True) -> bool:
        """Write the state file. On failure the records stay in memory, every engine's status
        says they are not saved, and (with `retry`) a task tries again until a write succeeds.
        Never raises: a full disk must not stop supervision of what already runs."""
        try:
            self._write_state()
        except OSError as e:
            self._save_failed(e, retry)
            return False
        self._saved()
        return True

    def _save_failed(self, e: OSError, retry: bool) -> None:
        msg = (
            f"engine state file {self.paths.state_file} not saved ({e.strerror or e}); the engines are "
            "supervised meanwhile and the write is retried"
        )
        if msg != self.record_error:
            log.error("%s", msg)
        self._set_record_error(msg)
        if not retry or (self._save_retry is not None and not self._save_retry.done()):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._save_retry = loop.create_task(self._retry_save(), name="save-engine-state")

    async def _retry_save(self) -> None:
        pause, longest = self._save_retry_s
        while self.record_error is not None:
            await asyncio.sleep(pause)
            if await self._save():
                return
            pause = min(longest, pause * 2)

    def _set_record_error(self, msg: str | None) -> None:
        self.record_error = msg
        for sup in self.engines.values():
            sup.record_error = msg
            sup.publish()

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
            if not isinstance(rec, dict) or not isinstance(rec.get("spec"), dict):
                log.error("engine %s: its entry in %s cannot be read; it is kept there as it is", name, path)
                self._unreadable[name] = rec
                done.append(f"{name}: entry unreadable; kept in the state file as it is")
                continue
            try:
                done.append(self._load_one(name, rec))
                self.engines[name].publish()  # what the entry set on it, seen as one status
            except Exception:  # a bug or an entry malformed in a way not foreseen: keep it as it is
                log.exception("engine %s: could not load its entry; it is kept in %s as it is", name, path)
                self.engines.pop(name, None)
                self.board.withdraw(name)
                self._unreadable[name] = rec
                done.append(f"{name}: entry could not be loaded; kept in the state file as it is")
        self._persist()
        return done

    def _load_one(self, name: str, rec: dict[str, Any]) -> str:
        error = None
        try:
            spec = EngineSpec(**rec["spec"])
            runtime = Runtime(**rec["runtime"]) if rec.get("runtime") else None
        except (ValidationError, TypeError, ValueError) as e:  # e.g. the model directory was moved
            error = "; ".join(validation_messages(e))
            spec = _stand_in_spec(rec["spec"])
            runtime = None
        sup = self._new_supervisor(name, spec)
        self._secret_env[name] = {str(k): str(v) for k, v in (rec.get("secret_env") or {}).items()}
        sup.runtime = runtime
        sup.port = rec.get("port")
        sup.port_note = rec.get("port_note")
        sup.restarts = int(rec.get("restarts", 0))
        sup.last_error = rec.get("last_error")
        if rec.get("state") == str(EngineState.FAILED):
            sup.state = EngineState.FAILED
        self.engines[name] = sup
        proc = rec.get("process")
        record = (
            ProcessRecord(proc["pid"], proc["create_time"], proc["port"], tuple(proc["argv"]), proc.get("config_id"))
            if proc
            else None
        )
        change = self._stored_change(name, rec.get("change")) if error is None else None
        if error is not None and rec.get("change"):
            log.error("engine %s: a restart was under way, but the stored spec no longer validates: not resumed", name)
        self.found[name] = f"engine stopped on config {sup.config_id}"
        if change is not None:
            return self._resume_change(name, sup, change, record)
        if error is not None:
            log.error("engine %s: stored spec no longer valid: %s", name, error)
            sup.mark_invalid({"spec": rec["spec"], "runtime": rec.get("runtime")}, error)
            sup.desired_running = rec.get("desired") == "running"  # kept for when it is valid again
            if record is not None and sup.adopt(record, sup.restarts):
                self.found[name] = f"engine running on config {sup.config_id} (pid {record.pid}); its spec is invalid"
                sup.last_error = (
                    f"stored spec no longer valid: {error}; it keeps serving, but cannot be "
                    f"restarted until that is fixed and `llmconsole engine start {name}` is run"
                )
                return f"{name}: adopted pid {record.pid}; stored spec invalid ({error})"
            return f"{name}: stored spec invalid ({error}); kept, listed as invalid"
        if rec.get("desired") != "running":
            return f"{name}: stopped"
        if record is not None and sup.adopt(record, sup.restarts):
            self.found[name] = f"engine running on config {sup.config_id} (pid {record.pid})"
            return f"{name}: adopted pid {record.pid}"
        sup.resume_after_lost(sup.restarts + 1, "the engine died while no daemon was supervising it")
        self.found[name] = f"no process: restarted config {sup.config_id}"
        return f"{name}: not running any more; restarting"

    @staticmethod
    def _stored_change(name: str, raw: Any) -> PendingChange | None:
        """The restart a previous daemon left under way, or None (none, or its target no
        longer validates: then the engine resumes as it was, and the log says why)."""
        if not isinstance(raw, dict) or not isinstance(raw.get("spec"), dict):
            return None
        try:
            return PendingChange(EngineSpec(**raw["spec"]), str(raw.get("from_config_id") or ""))
        except (ValidationError, TypeError, ValueError) as e:
            log.error(
                "engine %s: a restart was under way, but its target no longer validates (%s): not resumed",
                name,
                "; ".join(validation_messages(e)) if isinstance(e, ValidationError) else e,
            )
            return None

    def _resume_change(
        self, name: str, sup: EngineSupervisor, change: PendingChange, record: ProcessRecord | None
    ) -> str:
        """Carry on the restart a previous daemon died in. Whichever process the file records
        and still runs (checked to be the engine: create time, command line, port) is adopted,
        on the config it was launched with; with none, the target is started."""
        target = change.target.config_id
        if record is not None:
            # A record written before configs were kept in it is the spec's process.
            on_target = (record.config_id or sup.config_id) == target
            if on_target:
                sup.change = change
            if sup.adopt(record, sup.restarts, fresh=on_target):
                if on_target:
                    self.found[name] = f"engine running on config {target} (the target)"
                    return f"{name}: adopted pid {record.pid}, starting the target config {target} of a restart"
                self.found[name] = (
                    f"engine running on config {sup.config_id} (the old config); the change to {target} was not made"
                )
                return f"{name}: adopted pid {record.pid} on the old config; the restart to {target} was not made"
            sup.change = None
        sup.resume_change(change)
        self.found[name] = f"no process: started the target config {target}"
        return f"{name}: a restart was under way and no process runs: starting its target config {target}"
