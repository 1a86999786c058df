"""Sweeps and tunes that a console starts, run inside the daemon.

A console is a client: quitting it, or losing the SSH session, must not stop a sweep that is
half-way through and has the engine on another config. So the console sends a typed request
(engine/sweep/request.py, engine/tune/request.py) and the daemon runs it here, keeping each
run's progress events and outcome; any console or CLI polls them, cancels, or picks the
run up again after a reconnect. The CLI's `sweep` and `tune` come here too (commands/runs.py).

Each run gets a thread with its own event loop, as the console gave it before: the load
generator's timings then never wait on supervision, scrapes or the gateway in the daemon's
loop, and a busy run never slows them. The runner drives the engine through `FleetController`
(a restart through the fleet, as any operator change), whose calls are carried over to the
daemon's loop, which owns the fleet. A cancel sets the runner's stop event in its loop; the
runner then finishes what is under way and puts the engine back (its own finally). The
daemon, when it stops, cancels every run and waits for the engines to be put back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from pydantic import ValidationError

from llmconsole.daemon.context import DaemonContext
from llmconsole.daemon.http import NotFound
from llmconsole.daemon.services.fleet_controller import FleetController
from llmconsole.engine.spec import validation_messages
from llmconsole.engine.status import EngineState
from llmconsole.engine.supervisor import EngineBusy
from llmconsole.engine.sweep.plan import SweepProgress
from llmconsole.engine.sweep.probe import ResourceSample
from llmconsole.engine.sweep.report import analyse, picks_text, to_json, write_results
from llmconsole.engine.sweep.request import SweepRequest
from llmconsole.engine.sweep.runner import EngineTarget, SweepRunner
from llmconsole.engine.tune.ranges import EngineFacts
from llmconsole.engine.tune.request import TuneRequest
from llmconsole.engine.tune.space import parse_knob
from llmconsole.engine.tune.study import open_study, outcomes
from llmconsole.engine.tune.tuner import TuneProgress, Tuner

log = logging.getLogger(__name__)

RunKind = Literal["sweep", "tune"]
T = TypeVar("T")

# How long a stopping daemon waits for its runs to put their engines back (an engine restart).
CLOSE_TIMEOUT_S = 600.0
KEEP_FINISHED = 20


class BridgedController:
    """The runner's engine controller in the run's loop, carrying each call to `inner` in the
    daemon's loop (which owns the fleet and the gateway) and waiting for its answer."""

    def __init__(self, inner: FleetController, loop: asyncio.AbstractEventLoop):
        self.inner, self.loop = inner, loop

    async def _there(self, coro: Coroutine[Any, Any, T]) -> T:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, self.loop))

    async def current(self) -> EngineTarget:
        return await self._there(self.inner.current())

    async def apply(self, overrides: dict[str, Any]) -> EngineTarget:
        return await self._there(self.inner.apply(overrides))

    async def restore(self, original: EngineTarget) -> EngineTarget:
        return await self._there(self.inner.restore(original))

    async def resources(self) -> ResourceSample:
        return await self._there(self.inner.resources())

    async def gateway_url(self) -> str:
        return await self._there(self.inner.gateway_url())

    async def window(self) -> dict[str, int]:
        return await self._there(self.inner.window())

    async def set_window(self, bounds: dict[str, int]) -> None:
        await self._there(self.inner.set_window(bounds))

    async def facts(self, *, with_window: bool) -> EngineFacts:
        return await self._there(self.inner.facts(with_window=with_window))


@dataclass
class Run:
    id: int
    kind: RunKind
    engine: str
    request: dict[str, Any]
    actor: str
    started_at: float
    state: str = "running"  # running | done | cancelled | failed
    events: list[dict[str, Any]] = field(default_factory=list)
    outcome: dict[str, Any] | None = None
    error: str | None = None
    finished_at: float | None = None
    cancel_requested: bool = False
    _stop: asyncio.Event | None = None  # in the run's own loop
    _loop: asyncio.AbstractEventLoop | None = None
    _done: asyncio.Event = field(default_factory=asyncio.Event)

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "engine": self.engine,
            "state": self.state,
            "actor": self.actor,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "request": self.request,
            "events": len(self.events),
            "cancel_requested": self.cancel_requested,
            "error": self.error,
        }

    def to_json(self, since: int = 0) -> dict[str, Any]:
        return {**self.summary(), "events_from": since, "new_events": self.events[since:], "outcome": self.outcome}

    def emit(self, event: dict[str, Any]) -> None:
        """From the run's thread: list.append is atomic, and readers only ever slice."""
        self.events.append({**event, "at": time.time()})


class RunService:
    def __init__(self, ctx: DaemonContext):
        self.ctx = ctx
        self.runs: dict[int, Run] = {}
        self._ids = itertools.count(1)
        self._threads: dict[int, threading.Thread] = {}

    # --- starting ----------------------------------------------------------------------------

    def start(self, kind: str, request: dict[str, Any], actor: str) -> Run:
        """Check the request and the engine, then start the run; ValueError (bad input), UnknownEngine,
        EngineBusy (not ready, or another run holds it) leave nothing started."""
        body: Callable[[Run, BridgedController], Awaitable[dict[str, Any]]]
        kernels: tuple[object, ...] = ()  # the kernels the run would start the engine on
        if kind == "sweep":
            sweep = _validated(SweepRequest, request)
            kernels = sweep.plan().grid.get("kernel", ())  # ValueError for a bad plan before anything is started
            engine = sweep.engine

            def body(run: Run, ctl: BridgedController) -> Awaitable[dict[str, Any]]:
                return self._sweep(run, sweep, ctl)
        elif kind == "tune":
            tune = _validated(TuneRequest, request)
            tune.check()
            kernels = next((k.choices for k in map(parse_knob, tune.knobs) if k.name == "kernel"), ())
            engine = tune.engine

            def body(run: Run, ctl: BridgedController) -> Awaitable[dict[str, Any]]:
                return self._tune(run, tune, ctl)
        else:
            raise ValueError(f"unknown run kind {kind!r}: sweep or tune")
        sup = self.ctx.fleet.get(engine)  # UnknownEngine
        refusal = sup.status().custom_kernel_refusal if "custom" in kernels else None
        if refusal is not None:
            raise ValueError(f"kernel=custom: {refusal}")
        if sup.state != EngineState.READY:
            raise EngineBusy(f"engine {engine} is {sup.state}, not ready; nothing was started")
        busy = next((r for r in self.runs.values() if r.engine == engine and r.state == "running"), None)
        if busy is not None:
            raise EngineBusy(f"a {busy.kind} of {engine} is under way (run {busy.id}); cancel it first")
        run = Run(next(self._ids), "sweep" if kind == "sweep" else "tune", engine, dict(request), actor, time.time())
        self.runs[run.id] = run
        ctl = BridgedController(
            FleetController(self.ctx.fleet, engine, gateway=self.ctx.gateway), asyncio.get_running_loop()
        )
        daemon_loop = asyncio.get_running_loop()
        thread = threading.Thread(
            target=self._thread, args=(run, body, ctl, daemon_loop), name=f"run-{run.id}-{kind}-{engine}", daemon=True
        )
        self._threads[run.id] = thread
        thread.start()
        self._forget_old()
        log.info("%s of %s started by %s (run %d)", kind, engine, actor, run.id)
        return run

    def _thread(
        self,
        run: Run,
        body: Callable[[Run, BridgedController], Awaitable[dict[str, Any]]],
        ctl: BridgedController,
        daemon_loop: asyncio.AbstractEventLoop,
    ) -> None:
        async def main() -> dict[str, Any]:
            run._stop = asyncio.Event()
            run._loop = asyncio.get_running_loop()
            if run.cancel_requested:  # a cancel that came before the loop did
                run._stop.set()
            return await body(run, ctl)

        outcome: dict[str, Any] | None = None
        error: str | None = None
        try:
            result = asyncio.run(main())
        except BaseException as e:  # noqa: BLE001 - whatever ends a run is its outcome, never a dead thread
            log.exception("run %d (%s of %s) failed", run.id, run.kind, run.engine)
            state, error = "failed", f"{type(e).__name__}: {e}"
        else:
            state, outcome = str(result.get("status", "done")), result
            error = result.get("error")
        daemon_loop.call_soon_threadsafe(self._finished, run, state, outcome, error)

    def _finished(self, run: Run, state: str, outcome: dict[str, Any] | None, error: str | None) -> None:
        run.state, run.outcome, run.error, run.finished_at = state, outcome, error, time.time()
        run._done.set()
        log.info("run %d (%s of %s) ended: %s", run.id, run.kind, run.engine, state)

    # --- the runs ----------------------------------------------------------------------------

    async def _sweep(self, run: Run, request: SweepRequest, ctl: BridgedController) -> dict[str, Any]:
        def progressed(ev: SweepProgress) -> None:
            run.emit(ev.to_json())

        assert run._stop is not None
        result = await SweepRunner(
            request.plan(), ctl, on_progress=progressed, stop=run._stop, store=self.ctx.store
        ).run()
        out = self.ctx.data_dir / "sweeps" / time.strftime("%Y%m%d-%H%M%S", time.localtime(run.started_at))
        files = await asyncio.to_thread(write_results, result, out)
        return {
            **to_json(result),
            "picks": picks_text(result, analyse(result)),
            "files": {k: str(v) for k, v in files.items()},
        }

    async def _tune(self, run: Run, request: TuneRequest, ctl: BridgedController) -> dict[str, Any]:
        facts = await ctl.facts(with_window=request.wants_window())
        settings, space = await asyncio.to_thread(request.settings, facts)
        storage = self.ctx.data_dir / "tuning" / "studies.journal"
        prior = await asyncio.to_thread(
            lambda: outcomes(open_study(storage, settings.name, settings.seed, settings.budget))
        )
        run.emit({"event": "prior", "trials": [dataclasses.asdict(t) for t in prior], "space": space.describe()})

        def progressed(ev: TuneProgress) -> None:
            run.emit(ev.to_json())

        assert run._stop is not None
        result = await Tuner(settings, ctl, storage, on_progress=progressed, stop=run._stop).run()
        return {**result.to_json(), "slo": settings.plan.slo.as_dict()}

    # --- reading and cancelling --------------------------------------------------------------

    def get(self, run_id: int) -> Run:
        run = self.runs.get(run_id)
        if run is None:
            raise UnknownRun(run_id)
        return run

    def cancel(self, run_id: int) -> Run:
        run = self.get(run_id)
        if run.state != "running" or run.cancel_requested:
            return run
        run.cancel_requested = True
        loop, stop = run._loop, run._stop
        if loop is not None and stop is not None:
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:
                pass  # its loop just ended: the run is over anyway
        log.info("run %d (%s of %s): cancel requested", run.id, run.kind, run.engine)
        return run

    def _forget_old(self) -> None:
        finished = sorted((r for r in self.runs.values() if r.state != "running"), key=lambda r: r.id)
        for r in finished[:-KEEP_FINISHED]:
            del self.runs[r.id]
            self._threads.pop(r.id, None)

    async def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        running = [r for r in self.runs.values() if r.state == "running"]
        for r in running:
            self.cancel(r.id)
        if running:
            log.info("waiting for %d run(s) to put their engines back", len(running))
            try:
                await asyncio.wait_for(asyncio.gather(*(r._done.wait() for r in running)), timeout_s)
            except TimeoutError:
                log.warning("runs still under way after %.0f s; the daemon stops without them", timeout_s)


R = TypeVar("R", SweepRequest, TuneRequest)


def _validated(model: type[R], request: dict[str, Any]) -> R:
    try:
        return model.model_validate(request)
    except ValidationError as e:
        raise ValueError("; ".join(validation_messages(e))) from None


class UnknownRun(NotFound):
    def __str__(self) -> str:
        return f"no run {self.args[0]} (finished runs are kept only for the last {KEEP_FINISHED})"
