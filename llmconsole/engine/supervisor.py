"""Supervision of one engine's lifecycle: launch, readiness, health, restart with backoff.

One `EngineSupervisor` per engine, living in the daemon's event loop. It owns the engine's
process and its state machine (see `EngineState`), and publishes an immutable `EngineStatus`
whenever something in it changes (to the fleet's board: engine/status_board.py; built by
engine/status_build.py); `status()` is the latest one published, never built on a read. What
the engine says of itself (its /metrics, its processes, its log) is its `EngineScraper`'s
(engine/scraper.py), whose ticks publish too. A crash (the process exits, or /health fails
`health_failures_to_crash` times in a row) is seen within about a second, the rest of the
process group is cleaned up, and the engine is restarted after an exponential backoff. Runs that
keep failing (engine/crash_loop.py) mark the config as crash-looping and supervision gives up on
it (the fleet may then roll it back). /health counts only when the engine's own process tree
listens on its port (engine/port_probe.py).

A restart (an operator's, a rollback, a mode switch) is a change that must survive the daemon's
death at any point: before the old process is stopped, the target spec is recorded as the
engine's pending change (`change`, engine/pending_change.py) and the fleet writes it to its
state file (fsync'd); a daemon that starts finds it there beside the process record, and carries
the change on (see Fleet._load_one). The change is cleared once the target config serves, or
fails to. `pause_at` is awaited at each phase of a restart (PAUSE_PHASES) so a test can kill the
daemon there.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import aiohttp

from llmconsole.engine import runtime as runtime_mod
from llmconsole.engine.crash_loop import FailureCounter, RestartDecision
from llmconsole.engine.host import HostProbe
from llmconsole.engine.pending_change import (
    PAUSE_INTENT_SAVED,
    PAUSE_NEW_STARTING,
    PAUSE_OLD_STOPPED,
    PAUSE_PHASES,
    PauseAt,
    PendingChange,
)
from llmconsole.engine.port_probe import ListenerOwnership, connect_host, free_port, moved_port_note, port_holder
from llmconsole.engine.process import EngineProcess, ProcessRecord
from llmconsole.engine.run_log import begin_run
from llmconsole.engine.scraper import EngineScraper
from llmconsole.engine.spec import EngineSpec
from llmconsole.engine.startup_log import StartupFacts
from llmconsole.engine.status import EngineState, EngineStatus
from llmconsole.engine.status_build import CustomKernelRefusals, build_status
from llmconsole.engine.stored_spec import stored_config_id
from llmconsole.engine.supervision_policy import SupervisionPolicy
from llmconsole.engine.tasks import cancel_and_wait

# Names that callers have long imported from here, kept importable from here.
__all__ = [
    "PAUSE_INTENT_SAVED",
    "PAUSE_NEW_STARTING",
    "PAUSE_OLD_STOPPED",
    "PAUSE_PHASES",
    "ChangeEnded",
    "EngineBusy",
    "EngineSupervisor",
    "FailureCounter",
    "PauseAt",
    "PendingChange",
    "PortInUse",
    "RestartDecision",
    "SupervisionPolicy",
    "free_port",
    "port_holder",
    "stored_config_id",
]

log = logging.getLogger(__name__)

# (the supervisor, the change, its outcome, why: None when it is done)
ChangeEnded = Callable[["EngineSupervisor", PendingChange, str, str | None], None]


class EngineBusy(RuntimeError):
    """The request does not fit the engine's current state (e.g. start while running)."""


class PortInUse(ValueError):
    """The port asked for is already someone's: nothing was started or changed."""


class EngineSupervisor:
    def __init__(
        self,
        name: str,
        spec: EngineSpec,
        log_path: Path,
        http: aiohttp.ClientSession,
        policy: SupervisionPolicy,
        probe: HostProbe | None = None,
        on_change: Callable[[EngineSupervisor], None] | None = None,
        on_crash_loop: Callable[[EngineSupervisor], None] | None = None,
        pause_at: PauseAt | None = None,
        on_change_end: ChangeEnded | None = None,
        save_now: Callable[[], Awaitable[bool]] | None = None,
        engine_env: Mapping[str, str] | None = None,
        publish: Callable[[EngineStatus], object] | None = None,
    ) -> None:
        self.name = name
        self.engine_env = engine_env  # what the engine's environment starts from (EngineProcess.launch)
        self.spec = spec
        self.log_path = log_path
        self.policy = policy
        self._http = http
        self._probe = probe
        self._on_change = on_change or (lambda s: None)
        self._on_crash_loop = on_crash_loop or (lambda s: None)
        self._pause_at = pause_at
        self._on_change_end = on_change_end or (lambda s, c, o, r: None)
        # Returns once what on_change reported is durable (the fleet's state file, written off the
        # event loop); False when it could not be written. A restart awaits it before it stops
        # anything, so its target outlives the daemon.
        self._save_now = save_now
        # Where each new status goes (the fleet's status board); the latest is also kept here.
        self._publish = publish

        self.state = EngineState.STOPPED
        self.desired_running = False
        self.runtime: runtime_mod.Runtime | None = spec.runtime
        # Asked for (spec.port), or picked once and then kept for every restart and relaunch (the
        # fleet stores it): other hosts' groups hold this engine's URL.
        self.port: int | None = spec.port
        self.port_note: str | None = None  # why the picked port moved, when it had to
        self.proc: EngineProcess | None = None
        self.restarts = 0
        self.crash_looping = False
        self.last_exit_code: int | None = None
        self.last_error: str | None = None
        self.facts: StartupFacts | None = None
        self.started_at_s: float | None = None
        self.ready_at_s: float | None = None
        self._ready_mono: float | None = None
        self._next_restart_mono: float | None = None
        self.failures = FailureCounter(policy)
        self.backoff_s: float | None = None
        self.gave_up_reason: str | None = None
        # (config id, why): the last config given up on; see EngineStatus.failed_config_id.
        self.failed_config: tuple[str, str] | None = None
        # A stored spec that no longer validates (set by the fleet when it loads the state file):
        # kept verbatim, with why, until it validates again or a new spec replaces it. Meanwhile
        # `spec` is a stand-in that names and guards the engine but is never launched.
        self.stored: dict[str, Any] | None = None
        self.spec_error: str | None = None
        self.record_error: str | None = None  # set by the fleet while its state file cannot be written
        # A restart under way, saved before the old process is stopped (see the module docstring).
        self.change: PendingChange | None = None
        self._listeners = ListenerOwnership()
        self._foreign_note: str | None = None
        self._run_task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        # What the engine says of itself (its log, /metrics, its processes), one loop per run.
        self.scraper = EngineScraper(name, log_path, http, policy.scrape_interval_s, probe, self._scraped)
        self._refusals = CustomKernelRefusals()
        self._published = self._build_status()
        self._published_mono = time.monotonic()

    # --- operator actions -----------------------------------------------------------------

    async def start(self, spec: EngineSpec | None = None) -> None:
        """Start the engine (optionally on a new spec). Returns once launched, not when ready."""
        async with self._lock:
            if self.state.running or self.state == EngineState.CRASHED:
                if self.state != EngineState.STOPPING and (spec is None or spec.config_id == self.config_id):
                    if spec is not None and self.stored is not None:
                        self._apply_spec(spec)  # the same config, now valid again
                        self.publish()
                    return  # already running this config: starting it again is a no-op
                raise EngineBusy(
                    f"engine {self.name} is {self.state} on config {self.config_id}; "
                    "restart it to apply a different config"
                )
            if spec is not None:
                self._apply_spec(spec)
            if self.stored is not None:
                raise EngineBusy(f"engine {self.name} cannot start: {self.spec_error}")
            self._reset_for_fresh_start()
            self._set_state(EngineState.STARTING)
            self._run_task = asyncio.create_task(self._run(first_launch_is_fresh=True), name=f"run-{self.name}")

    async def stop(self, drain_timeout_s: float | None = None) -> None:
        async with self._lock:
            self._end_change("cancelled", "stopped before the target config served")
            await self._stop_locked(drain_timeout_s)

    async def restart(
        self, spec: EngineSpec | None = None, action_id: int | None = None, done_outcome: str = "done"
    ) -> None:
        """Stop the engine and start it on `spec` (or its spec). The target is saved first (the
        fleet's state file, fsync'd): a daemon killed at any point after that carries it on. A
        target that cannot be saved is refused (EngineBusy), with nothing stopped."""
        async with self._lock:
            if spec is None and self.stored is not None:
                raise EngineBusy(f"engine {self.name} cannot be restarted: {self.spec_error}")
            self._end_change("cancelled", "another restart was asked for before the target config served")
            self.change = PendingChange(
                spec if spec is not None else self.spec, self.config_id, action_id, done_outcome
            )
            self._changed()
            saved = await self._save_now() if self._save_now is not None else self.record_error is None
            if not saved and self.proc is not None and self.proc.poll() is None:
                self.change = None
                raise EngineBusy(
                    f"engine {self.name} was not restarted (it keeps serving config {self.config_id}): "
                    f"its target could not be saved first: {self.record_error}"
                )
            await self._pause(PAUSE_INTENT_SAVED)
            await self._stop_locked(None)
            await self._durable()  # "no process" on disk before the target is launched
            await self._pause(PAUSE_OLD_STOPPED)
            if spec is not None:
                self._apply_spec(spec)
            self._reset_for_fresh_start()
            self._set_state(EngineState.STARTING)
            self._run_task = asyncio.create_task(self._run(first_launch_is_fresh=True), name=f"run-{self.name}")

    def _end_change(self, outcome: str, reason: str | None) -> None:
        """The change under way (if any) ended: clear it, and say so to whoever records it."""
        change, self.change = self.change, None
        if change is not None:
            try:
                self._on_change_end(self, change, outcome, reason)
            except Exception:  # recording it must never stop supervision
                log.exception("engine %s: recording the end of a restart failed", self.name)

    async def _durable(self) -> None:
        """Wait until what on_change reported is on disk (the fleet writes off the event loop). A
        failed write is the fleet's to report and retry: supervision goes on meanwhile."""
        if self._save_now is not None:
            await self._save_now()

    async def _pause(self, phase: str) -> None:
        if self._pause_at is not None:
            await self._pause_at(self.name, phase)

    def adopt(self, record: ProcessRecord, restarts: int, fresh: bool = False) -> bool:
        """Take over a running engine left by a previous daemon. False if it is gone.

        `fresh`: the process is a restart's target that had not served yet, so if it never comes
        up its config failed as a fresh start's does (no retry; the fleet may roll it back)."""
        proc = EngineProcess.adopt(record)
        self.restarts = restarts
        self.desired_running = True
        if proc is None:
            return False
        self.proc = proc
        self.port = record.port
        self.started_at_s = record.create_time
        self._set_state(EngineState.STARTING)
        self._run_task = asyncio.create_task(self._run(first_launch_is_fresh=fresh), name=f"run-{self.name}")
        return True

    def resume_change(self, change: PendingChange) -> None:
        """Carry on a restart a previous daemon left with no process running: start its target,
        as a fresh start (one that never comes up is not retried; the fleet may roll it back)."""
        self.change = change
        self._apply_spec(change.target)
        self._reset_for_fresh_start()
        self._set_state(EngineState.STARTING)
        self._run_task = asyncio.create_task(self._run(first_launch_is_fresh=True), name=f"run-{self.name}")

    def resume_after_lost(self, restarts: int, reason: str) -> None:
        """The engine should be running but its process is gone (it died with no daemon)."""
        self.restarts = restarts
        self.desired_running = True
        self.last_error = reason
        self._set_state(EngineState.STARTING)
        self._run_task = asyncio.create_task(self._run(first_launch_is_fresh=False), name=f"run-{self.name}")

    async def detach(self) -> None:
        """Stop supervising but leave the engine running (the daemon is going away)."""
        await self._cancel_tasks()

    # --- a stored spec that no longer validates ---------------------------------------------

    def mark_invalid(self, stored: dict[str, Any], error: str) -> None:
        """The stored spec (and runtime) no longer validate: keep them as they are, say why.

        A process that still runs is adopted as usual (see `adopt`) and supervised until it
        exits; it is never relaunched from the stand-in spec.
        """
        self.stored = stored
        self.spec_error = error
        self.last_error = f"stored spec no longer valid: {error}; fix that, then `llmconsole engine start {self.name}`"
        self.state = EngineState.INVALID
        self.publish()

    def revalidate(self) -> EngineSpec:
        """The stored spec, validated again (the model directory is back, say), which then
        becomes the engine's spec. Raises pydantic's ValidationError, changing nothing, if it
        still does not validate."""
        assert self.stored is not None
        spec = EngineSpec(**self.stored["spec"])
        runtime = runtime_mod.Runtime(**self.stored["runtime"]) if self.stored.get("runtime") else None
        self._apply_spec(spec)
        if runtime is not None:
            self.runtime = runtime
        if self.state == EngineState.INVALID:
            self.last_error = None
            self._set_state(EngineState.STOPPED)
        self.publish()
        return spec

    def _apply_spec(self, spec: EngineSpec) -> None:
        if spec.port is not None:
            self.port = spec.port
            self.port_note = None  # the operator chose a port: whatever moved before is settled
        self.spec = spec
        self.runtime = spec.runtime
        self.stored = None
        self.spec_error = None

    @property
    def config_id(self) -> str:
        return stored_config_id(self.stored["spec"]) if self.stored is not None else self.spec.config_id

    # --- status ---------------------------------------------------------------------------

    def status(self) -> EngineStatus:
        """The latest status this supervisor published (its clock-driven fields current): built
        when something changed, never on a read."""
        return self._published.aged(time.monotonic() - self._published_mono)

    def publish(self) -> EngineStatus:
        """Build the status as things are now and publish it: to the board, and as `status()`."""
        self._published = self._build_status()
        self._published_mono = time.monotonic()
        if self._publish is not None:
            self._publish(self._published)
        return self._published

    def _build_status(self) -> EngineStatus:
        return build_status(self, self._ready_mono, self._next_restart_mono, self._refusals.refusal(self.runtime))

    def process_record(self) -> ProcessRecord | None:
        """The process to find again after a daemon restart: while one runs, whatever the state."""
        if self.proc is None:
            return None
        if self.state.running or self.proc.poll() is None:
            return self.proc.record
        return None

    # --- internals ------------------------------------------------------------------------

    def _changed(self) -> None:
        """Something the status shows changed: publish it, then tell the fleet (which saves)."""
        self.publish()
        self._on_change(self)

    def _set_state(self, state: EngineState) -> None:
        if state != self.state:
            log.info("engine %s: %s -> %s", self.name, self.state, state)
            self.state = state
            self._changed()

    def _reset_for_fresh_start(self) -> None:
        if self.failed_config is not None and self.failed_config[0] == self.config_id:
            self.failed_config = None  # that config is tried again: its old failure is not this run's
        self.desired_running = True
        self.crash_looping = False
        self.last_error = None
        self.last_exit_code = None
        self.gave_up_reason = None
        self.backoff_s = None
        self.failures.reset()

    async def _stop_locked(self, drain_timeout_s: float | None) -> None:
        self.desired_running = False
        await self._cancel_tasks()
        if self.proc is not None and self.proc.poll() is None:
            self._set_state(EngineState.STOPPING)
            code = await self.proc.terminate(
                self.policy.drain_timeout_s if drain_timeout_s is None else drain_timeout_s
            )
            self.last_exit_code = code
        elif self.proc is not None:
            await self.proc.kill_group()  # survivors of a dead leader
        self.proc = None
        self._ready_mono = None
        self._set_state(EngineState.STOPPED)
        if self.stored is not None:
            self._set_state(EngineState.INVALID)  # stopped, and it cannot start again as stored

    @property
    def _scrape_task(self) -> asyncio.Task[None] | None:
        return self.scraper.task

    def _scraped(self) -> None:
        self.publish()

    async def _cancel_tasks(self) -> None:
        task = self._run_task
        if task is not None and task is not asyncio.current_task():
            await cancel_and_wait(task)
        self._run_task = None
        await self.scraper.stop()

    def _launch(self) -> None:
        if self.runtime is None:
            self.runtime = runtime_mod.detect()
        if self.port is None:
            self.port = free_port(connect_host(self.spec.host))
        elif self.spec.port is None and (holder := port_holder(self.spec.host, self.port)) is not None:
            # The port picked for it before is someone else's now; only a port asked for is kept.
            # Moving changes its URL: this host's groups follow at their next sync, another host's
            # group that holds it does not, so the move is said loudly and stays in the status.
            old = self.port
            self.port = free_port(connect_host(self.spec.host))
            self.port_note = moved_port_note(self.name, old, self.port, holder)
            log.error("engine %s: %s", self.name, self.port_note)
        argv = self.spec.argv(self.runtime, self.port)
        self.scraper.run_began(begin_run(self.log_path, self.name, self.spec.config_id, argv))
        self.facts = None
        self.ready_at_s = None
        self._ready_mono = None
        self._listeners.forget()
        self._foreign_note = None
        self.started_at_s = time.time()
        self.proc = EngineProcess.launch(
            argv,
            self.spec.launch_env(self.runtime),
            self.log_path,
            self.port,
            self.spec.config_id,
            base_env=self.engine_env,
        )

    async def _check_health(self) -> bool:
        url = f"http://{connect_host(self.spec.host)}:{self.port}/health"
        try:
            timeout = aiohttp.ClientTimeout(total=self.policy.health_timeout_s)
            async with self._http.get(url, timeout=timeout) as r:
                if r.status != 200:
                    return False
        except (TimeoutError, aiohttp.ClientError, OSError):
            return False
        return await self._answered_by_engine()

    async def _answered_by_engine(self) -> bool:
        """Whether what answers on the port is this engine (engine/port_probe.py); a new
        reason it is not is logged once and kept as the engine's last error."""
        assert self.proc is not None and self.port is not None
        problem = await self._listeners.problem(self.proc.pid, self.port, self.spec.host)
        if problem is None:
            self._foreign_note = None
            return True
        if problem != self._foreign_note:
            log.warning("engine %s: /health answered, but %s: not counted as healthy", self.name, problem)
            self._foreign_note = problem
            self.last_error = problem
            self._changed()
        return False

    async def _run(self, first_launch_is_fresh: bool) -> None:
        fresh = first_launch_is_fresh
        try:
            while self.desired_running and self.state != EngineState.INVALID:
                if self.proc is None:
                    self._set_state(EngineState.STARTING)
                    try:
                        self._launch()
                    except (OSError, runtime_mod.RuntimeNotFound) as e:
                        if self.proc is None:  # nothing runs: the launch itself failed
                            self.last_error = f"could not launch: {e}"
                            self.desired_running = False
                            self._end_change("failed", self.last_error)
                            self._set_state(EngineState.FAILED)
                            return
                        log.exception("engine %s: launched pid %d, then failed", self.name, self.proc.pid)
                    # The new pid must reach the state file before anything else (the fleet keeps
                    # it in memory and retries if the file cannot be written just now).
                    self._changed()
                    await self._durable()
                    if self.change is not None:
                        await self._pause(PAUSE_NEW_STARTING)
                outcome, code, was_ready = await self._watch()
                await self._after_exit(outcome, code, was_ready, fresh)
                fresh = False
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug here must not leave the engine unsupervised silently
            log.exception("engine %s: supervision failed", self.name)
            self.last_error = "supervision failed; see the daemon log"
            self._end_change("failed", self.last_error)
            self._set_state(EngineState.FAILED)

    async def _watch(self) -> tuple[str, int | None, bool]:
        """Watch the current process until it exits or is judged dead."""
        assert self.proc is not None and self.port is not None
        p = self.policy
        self.scraper.watch(f"http://{connect_host(self.spec.host)}:{self.port}", self.proc.pid)
        launched = time.monotonic()
        ready = False
        failures = 0
        next_health = launched
        while True:
            code = self.proc.poll()
            if code is not None:
                return "exited", code, ready
            now = time.monotonic()
            if now >= next_health:
                next_health = now + p.health_interval_s
                healthy = await self._check_health()
                code = self.proc.poll()
                if code is not None:
                    # It died while its /health was asked (a kill closes the port first): a
                    # crash, never a moment of "unhealthy" before it.
                    return "exited", code, ready
                if healthy:
                    failures = 0
                    if not ready:
                        ready = True
                        self._became_ready()
                    elif self.state == EngineState.UNHEALTHY:
                        self._set_state(EngineState.READY)
                elif ready:
                    failures += 1
                    self._set_state(EngineState.UNHEALTHY)
                    if failures >= p.health_failures_to_crash:
                        return "unhealthy", None, ready
                elif now - launched > p.start_timeout_s:
                    return "start_timeout", None, ready
            if ready and self._ready_mono and now - self._ready_mono >= p.stable_after_s:
                if self.failures.consecutive:
                    self.failures.served()
                    self.publish()  # the streak it reports is over
            await asyncio.sleep(p.poll_interval_s)

    def _became_ready(self) -> None:
        self._end_change("done", None)  # the restart's target serves (recorded before it says ready)
        self.ready_at_s = time.time()
        self._ready_mono = time.monotonic()
        self.scraper.log.follow()  # what it logged up to now (its kernel's lines) counts as it reports ready
        self.facts = self.scraper.log.startup_facts()
        self._set_state(EngineState.READY)
        self.scraper.serving()

    async def _after_exit(self, outcome: str, code: int | None, was_ready: bool, fresh: bool) -> None:
        p = self.policy
        await self.scraper.stop()
        assert self.proc is not None
        await self.proc.kill_group()  # engine core and workers must not outlive their server
        self.last_exit_code = code if code is not None else self.proc.poll()
        self.proc = None
        now = time.monotonic()
        stable = self._ready_mono is not None and now - self._ready_mono >= p.stable_after_s
        self._ready_mono = None
        if outcome == "unhealthy":
            reason = f"/health failed {p.health_failures_to_crash} times in a row; killed"
        elif outcome == "start_timeout":
            reason = f"not ready within {p.start_timeout_s:.0f} s; killed"
        else:
            reason = self.scraper.log.failure_reason() or f"exited with code {self.last_exit_code}"
        if self._foreign_note and not was_ready:
            reason = f"{reason} ({self._foreign_note})"
        self.last_error = reason
        log.warning("engine %s: %s (%s)", self.name, outcome, reason)

        if self.stored is not None:
            self._end_change("failed", f"{reason}; stored spec no longer valid: {self.spec_error}")
            # It ran on a spec that no longer validates: nothing can be relaunched from that.
            self.last_error = f"{reason}; not restarted: stored spec no longer valid: {self.spec_error}"
            self._set_state(EngineState.CRASHED)
            self._set_state(EngineState.INVALID)
            return

        if fresh and not was_ready:
            # A config the operator just asked for never came up: say why, do not retry it. It
            # failed as surely as a crash loop, so the fleet hears of it the same way (and may
            # roll the engine back to the config it ran before).
            self.desired_running = False
            self.gave_up_reason = f"the config asked for never came up: {reason}"
            self.failed_config = (self.config_id, reason)
            self._end_change("failed", self.gave_up_reason)
            self._set_state(EngineState.FAILED)
            self._on_crash_loop(self)
            return

        decision = self.failures.record(now, stable)
        if decision.give_up is not None:
            self.crash_looping = True
            self.desired_running = False
            self.gave_up_reason = f"crash-looping ({decision.give_up}); not restarted again"
            self.last_error = f"crash-looping ({decision.give_up}): {reason}"
            self.failed_config = (self.config_id, self.last_error)
            self._set_state(EngineState.FAILED)
            self._on_crash_loop(self)
            return

        self.backoff_s = decision.delay_s
        self._next_restart_mono = now + decision.delay_s
        self._set_state(EngineState.CRASHED)
        await asyncio.sleep(decision.delay_s)
        self._next_restart_mono = None
        self.backoff_s = None
        self.restarts += 1
