"""The auto-tuner: goodput under an SLO as the objective, over engine configs and the gateway's
window bounds.

The first trial is the planner's (ranges.py); the next come from a pattern search that
brackets the peak along max_num_seqs, then along each other knob (search.py), and once
that has settled, from Optuna's TPE with the whole history. Each trial is a sweep point: the
engine restarts on the trial's config (through the same `EngineController` the sweep uses;
window bounds are set at the gateway, no restart, and the load then goes through it), one load
level is run and aggregated as a sweep point is. A config that does not start (or a window the
gateway refuses), fails requests or breaks the SLO for most requests is a constraint violation
the sampler learns from, never an error of the tuner. Trials are cut short by successive
halving on the number of requests; the best few are re-measured in interleaved rounds, each
judged on all its runs, the trial's included, before one is recommended (select.py).
The study lives in a journal file under the data dir (study.py), named from engine +
workload + SLO + space, so an interrupted tune resumes where it stopped. Whatever happens, the
engine (and the window) goes back to its original config at the end (the caller may then apply
the winner through the guarded apply).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from llmconsole.engine.load.generator import run_load
from llmconsole.engine.load.workload import Tokenizer, load_tokenizer, plan_requests
from llmconsole.engine.sweep.plan import PointResult
from llmconsole.engine.sweep.probe import RunProbe
from llmconsole.engine.sweep.runner import EngineController, EngineStartFailed, EngineTarget, aggregate
from llmconsole.engine.tune.select import Remeasured, next_remeasure, pick_winner, start_race
from llmconsole.engine.tune.settings import TuneSettings
from llmconsole.engine.tune.space import (
    TrialOutcome,
    constraint_value,
    halving_rungs,
    keep_going,
    split_params,
)
from llmconsole.engine.tune.study import ask_next, history, make_sampler, open_study, outcomes, suggest_params  # noqa: F401

if TYPE_CHECKING:
    import optuna  # imported by study.py where a study is opened: not on every CLI call

log = logging.getLogger(__name__)

_CONSTRAINT = "constraint"


@runtime_checkable
class WindowController(Protocol):
    """What window knobs need beside an `EngineController`: the gateway's window bounds and its
    door (the tune command's TuneController, the daemon's FleetController)."""

    async def window(self) -> dict[str, int]: ...

    async def set_window(self, bounds: dict[str, int]) -> None: ...

    async def gateway_url(self) -> str: ...


@dataclass(frozen=True)
class TuneProgress:
    event: str  # trial_started | trial_finished | remeasuring | restored | resumed
    trial: int | None
    params: dict[str, Any]
    message: str
    best_req_s: float | None
    elapsed_s: float
    outcome: TrialOutcome | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self),
            "outcome": None if self.outcome is None else dataclasses.asdict(self.outcome),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TuneProgress:
        outcome = d.get("outcome")
        return cls(
            d["event"],
            d.get("trial"),
            dict(d.get("params") or {}),
            d.get("message", ""),
            d.get("best_req_s"),
            float(d.get("elapsed_s", 0.0)),
            None if outcome is None else TrialOutcome(**outcome),
        )


@dataclass(frozen=True)
class TuneResult:
    study: str
    trials: tuple[TrialOutcome, ...]
    remeasured: tuple[Remeasured, ...]
    winner: Remeasured | None
    original: EngineTarget
    restored: bool
    restore_error: str | None
    status: str  # done | cancelled | failed
    new_trials: int

    def to_json(self) -> dict[str, Any]:
        def rm(m: Remeasured) -> dict[str, Any]:
            return {
                "trial": m.number,
                "params": m.params,
                "goodputs_req_s": list(m.goodputs_req_s),
                "mean_req_s": m.mean_req_s,
                "median_req_s": m.median_req_s,
                "spread": m.spread,
                "failed": m.failed,
            }

        return {
            "study": self.study,
            "status": self.status,
            "new_trials": self.new_trials,
            "trials": [dataclasses.asdict(t) for t in self.trials],
            "remeasured": [rm(m) for m in self.remeasured],
            "winner": rm(self.winner) if self.winner else None,
            "original_config_id": self.original.config_id,
            "restored": self.restored,
            "restore_error": self.restore_error,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TuneResult:
        """The inverse of to_json, for a client that watched the study run elsewhere."""

        def rm(m: dict[str, Any]) -> Remeasured:
            return Remeasured(int(m["trial"]), dict(m["params"]), tuple(m["goodputs_req_s"]), m.get("failed"))

        original = EngineTarget("", "", "", str(d.get("original_config_id") or ""), {})
        return cls(
            str(d["study"]),
            tuple(TrialOutcome(**t) for t in d.get("trials") or ()),
            tuple(rm(m) for m in d.get("remeasured") or ()),
            rm(d["winner"]) if d.get("winner") else None,
            original,
            bool(d["restored"]),
            d.get("restore_error"),
            str(d["status"]),
            int(d.get("new_trials", 0)),
        )


class Tuner:
    """Runs one study to its budget. `stop` ends it after the trial in progress (the engine is
    restored and the study is left resumable)."""

    def __init__(
        self,
        settings: TuneSettings,
        controller: EngineController,
        storage_path: Path,
        *,
        on_progress: Callable[[TuneProgress], None] | None = None,
        stop: asyncio.Event | None = None,
        api_key: str | None = None,
    ):
        self.s = settings
        self.ctl = controller
        self.storage_path = storage_path
        self.on_progress = on_progress or (lambda ev: None)
        self.stop = stop or asyncio.Event()
        self.api_key = api_key
        self._t0 = time.monotonic()
        self._tok: Tokenizer | None = None
        self._gateway: WindowController | None = None  # set when a knob moves the window
        self._window0: dict[str, int] | None = None

    def _emit(
        self,
        event: str,
        trial: int | None,
        params: dict[str, Any],
        message: str,
        study: optuna.Study,
        outcome: TrialOutcome | None = None,
    ) -> None:
        best = max(
            (o.goodput_req_s for o in outcomes(study) if o.state == "complete" and o.goodput_req_s), default=None
        )
        self.on_progress(TuneProgress(event, trial, params, message, best, time.monotonic() - self._t0, outcome))

    async def run(self) -> TuneResult:
        from optuna.trial import TrialState

        study = open_study(self.storage_path, self.s.name, self.s.seed, self.s.budget)
        stale = [t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))]
        for n in stale:  # a tune killed mid-trial: that trial's figures are lost, its config is not bad
            study.tell(n, state=TrialState.FAIL)
        if study.trials:
            self._emit(
                "resumed",
                None,
                {},
                f"resuming study {study.study_name}: {len(study.trials)} trials so far"
                + (f", {len(stale)} interrupted" if stale else ""),
                study,
            )
        if self._through_gateway:
            if not isinstance(self.ctl, WindowController):
                raise ValueError(
                    "window knobs need a controller that sets the gateway's window "
                    "(window, set_window, gateway_url), such as the tune command's TuneController"
                )
            self._gateway = self.ctl
        original = await self.ctl.current()
        current = original
        self._window0 = await self._gateway.window() if self._gateway is not None else None
        status, new_trials = "done", 0
        remeasured: list[Remeasured] = []
        try:
            self._tok = await asyncio.to_thread(load_tokenizer, original.model)
            deadline = None if self.s.budget.minutes is None else self._t0 + self.s.budget.minutes * 60
            while not self.stop.is_set():
                done = len([t for t in study.trials if t.state != TrialState.FAIL])
                if self.s.budget.trials is not None and done >= self.s.budget.trials:
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    break
                current = await self._trial(study, original, current)
                new_trials += 1
            if not self.stop.is_set():
                current, remeasured = await self._remeasure(study, original, current)
            if self.stop.is_set():
                status = "cancelled"
        except asyncio.CancelledError:
            status = "cancelled"
            raise
        except Exception:
            status = "failed"
            raise
        finally:
            restored, restore_error = await self._restore(original, current, study)
            self.result = TuneResult(
                study.study_name,
                tuple(outcomes(study)),
                tuple(remeasured),
                pick_winner(remeasured),
                original,
                restored,
                restore_error,
                status,
                new_trials,
            )
            self._keep_recommendation(study)
        return self.result

    def _keep_recommendation(self, study: optuna.Study) -> None:
        """The winner, in the study itself: an export reads it there with the trials (the run's
        own answer is gone once its client is)."""
        winner = self.result.to_json()["winner"] if self.result is not None else None
        if winner is None:
            return
        try:
            study.set_user_attr("recommendation", {**winner, "at_s": time.time()})
        except Exception as e:  # the journal is a record of the tune, not a condition for it
            log.warning("the tune's recommendation could not be kept in its study: %s", e)

    @property
    def _through_gateway(self) -> bool:
        return any(split_params({k.name: 0 for k in self.s.knobs})[1])

    async def _switch(self, params: dict[str, Any], current: EngineTarget) -> EngineTarget:
        """Move the engine to `params`: spec fields by a restart (only if they differ), window
        bounds at the gateway. A window the gateway refuses raises ValueError."""
        spec, window = split_params(params)
        if self._window0 and window:  # one bound tuned: the other gives way rather than cross it
            high = window.get("max_window")
            window.setdefault(
                "min_window", self._window0["min_window"] if high is None else min(self._window0["min_window"], high)
            )
            window.setdefault("max_window", max(self._window0["max_window"], window["min_window"]))
        if window.get("min_window", 0) > window.get("max_window", math.inf):
            raise ValueError(f"min_window {window['min_window']} is above max_window {window['max_window']}")
        if spec and not all(current.spec.get(k) == v for k, v in spec.items()):
            current = await self.ctl.apply(spec)
        if window:
            await self._window_control().set_window(window)
        return current

    def _window_control(self) -> WindowController:
        if self._gateway is None:  # run() sets it whenever a knob moves the window
            raise ValueError("no window knob is tuned: the gateway's window stays as it is")
        return self._gateway

    async def _measure(
        self, target: EngineTarget, n_requests: int, params: dict[str, Any], seed: int
    ) -> PointResult | None:
        """One load run of `n_requests` aggregated as a sweep point; None when it was interrupted."""
        plan = dataclasses.replace(self.s.plan, num_requests=n_requests)
        wl = self.s.load.workload(plan, seed=seed)
        if self._tok is None:
            raise RuntimeError("the tokenizer is loaded when the tune starts")
        planned = await asyncio.to_thread(plan_requests, wl, self._tok)
        # With the window as a knob the load must pass the gateway, where the window acts.
        url = await self._gateway.gateway_url() if self._gateway is not None else target.url
        async with RunProbe(target.url, self.ctl.resources) as probe:
            res = await run_load(
                url, target.served_model_name, wl, plan=planned, slo=plan.slo, stop=self.stop, api_key=self.api_key
            )
        if res.stopped_early == "interrupted":
            return None
        return aggregate(plan, 0, params, self.s.load, target.config_id, [(res.summary, probe.figures())])

    async def _trial(self, study: optuna.Study, original: EngineTarget, current: EngineTarget) -> EngineTarget:
        from optuna.trial import TrialState

        trial, params = ask_next(study, self.s.knobs, self.s.start, self.s.search)
        self._emit("trial_started", trial.number, params, "restarting the engine on this config", study)
        try:
            current = await self._switch(params, current)
        except EngineStartFailed as e:
            current = await self._after_failed_start(original)
            self._finish(study, trial, params, "infeasible", None, 0, f"did not start: {e}", 1.0)
            return current
        except ValueError as e:
            self._finish(study, trial, params, "infeasible", None, 0, f"window refused: {e}", 1.0)
            return current
        rungs = halving_rungs(self.s.plan.num_requests, self.s.eta, self.s.min_rung_requests)
        good, reason = 0.0, None
        for i, n in enumerate(rungs):
            point = await self._measure(current, n, params, seed=trial.number)
            if point is None:  # interrupted: the trial is left out, its config is not judged
                study.tell(trial, state=TrialState.FAIL)
                return current
            good, reason = point.goodput_req_s or 0.0, point.reason
            c = constraint_value(
                "failed" if point.status == "failed" else point.status, point.slo_attainment, self.s.bad_attainment
            )
            if c > 0:
                self._finish(study, trial, params, "infeasible", good, n, point.reason or "SLO broken badly", c)
                return current
            trial.report(good, step=n)
            last = i == len(rungs) - 1
            if not last:
                peers = [
                    t.intermediate_values[n]
                    for t in study.get_trials(deepcopy=False)
                    if t.number != trial.number and n in t.intermediate_values
                ]
                if not keep_going(good, peers, self.s.eta, margin=self.s.prune_margin):
                    self._finish(
                        study,
                        trial,
                        params,
                        "pruned",
                        good,
                        n,
                        f"stopped early after {n} requests: {good:.2f} req/s, clearly below the top 1/{self.s.eta}",
                    )
                    return current
        self._finish(study, trial, params, "complete", good, rungs[-1], reason)
        return current

    def _finish(
        self,
        study: optuna.Study,
        trial: optuna.Trial,
        params: dict[str, Any],
        state: str,
        goodput: float | None,
        requests: int,
        reason: str | None,
        constraint: float = 0.0,
    ) -> None:
        from optuna.trial import TrialState

        for k, v in (("outcome", state), ("goodput_req_s", goodput), ("requests", requests), ("reason", reason)):
            trial.set_user_attr(k, v)
        # The sampler's constraint (<= 0 feasible): TPE then keeps away from known-bad regions.
        trial.set_constraint(_CONSTRAINT, constraint)
        if state == "pruned":
            study.tell(trial, state=TrialState.PRUNED)
        else:
            study.tell(trial, goodput or 0.0)
        outcome = TrialOutcome(trial.number, params, state, goodput, requests, reason)
        self._emit("trial_finished", trial.number, params, state + (f": {reason}" if reason else ""), study, outcome)

    async def _remeasure(
        self, study: optuna.Study, original: EngineTarget, current: EngineTarget
    ) -> tuple[EngineTarget, list[Remeasured]]:
        """The best few configs raced in rounds (select.py): at most top_k x repeats runs,
        each pooled with the trial's own run; one that no longer starts is out."""
        cands = start_race(outcomes(study), self.s.top_k)
        runs_left = self.s.top_k * self.s.repeats
        last = next(
            (
                i
                for i, c in enumerate(cands)
                if all(current.spec.get(k) == v for k, v in split_params(c.params)[0].items())
            ),
            None,
        )
        while runs_left > 0 and not self.stop.is_set():
            i = next_remeasure(cands, self.s.repeats, last)
            if i is None:
                break
            cand = cands[i]
            n = len(cand.goodputs_req_s)
            self._emit("remeasuring", cand.number, cand.params, f"re-measuring: run {n + 1} of this config", study)
            try:
                current = await self._switch(cand.params, current)
            except (EngineStartFailed, ValueError) as e:
                current = await self._after_failed_start(original)
                log.warning("candidate %s no longer starts: %s", cand.params, e)
                cands[i], last = dataclasses.replace(cand, failed=str(e)), None
                continue
            point = await self._measure(current, self.s.plan.num_requests, cand.params, seed=1000 + n - 1)
            runs_left -= 1
            if point is None:  # interrupted
                break
            runs = cand.goodputs_req_s + (point.goodput_req_s or 0.0,)
            cands[i], last = dataclasses.replace(cand, goodputs_req_s=runs), i
        return current, cands

    async def _after_failed_start(self, original: EngineTarget) -> EngineTarget:
        """Where the engine is after a config did not start: a refusal left it as it was; else it
        sits failed (or the daemon's own rollback is moving it) and restoring is due."""
        try:
            return await self.ctl.current()
        except Exception:
            return dataclasses.replace(original, spec={}, config_id="(failed start)")

    async def _restore(
        self, original: EngineTarget, current: EngineTarget, study: optuna.Study
    ) -> tuple[bool, str | None]:
        try:
            if self._window0 is not None:  # the window bounds as they were (no restart)
                await asyncio.shield(self._window_control().set_window(self._window0))
        except Exception as e:
            return False, f"window bounds not restored: {type(e).__name__}: {e}"
        if current.config_id == original.config_id:
            return True, None
        # Only the knobs go back: the rest of the spec never moved (and secrets are not in it).
        back, _ = split_params({k.name: original.spec.get(k.name) for k in self.s.knobs})
        try:
            await asyncio.shield(self.ctl.apply(back))
        except Exception as e:
            return False, f"{type(e).__name__}: {e}"
        self._emit("restored", None, {}, f"restored config {original.config_id}", study)
        return True, None
