"""The tune screen's view: the form into the typed request the CLI builds too, and the tuner's events folded
into what the screen shows (trial i of the budget, the best so far, the trial table, the
recommendation at the end).

The tuner sends immutable `TuneProgress` events; `fold_tune` turns each into a new immutable
`TuneView`, so what the screen shows after a given sequence of events is tested without an engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from llmconsole.console.tui.views.estimate import tune_text
from llmconsole.console.tui.views.run import fmt_duration, length, params_text, split_items, ticked, whole_number
from llmconsole.console.tui.views.status import EngineView
from llmconsole.engine.tune.ranges import EngineFacts, TuneSpace
from llmconsole.engine.tune.request import TuneRequest
from llmconsole.engine.tune.settings import TuneSettings
from llmconsole.engine.tune.space import Budget, TrialOutcome
from llmconsole.engine.tune.tuner import TuneProgress, TuneResult
from llmconsole.engine.tune.verdict import infeasible_lines

# The form's fields and their safe small defaults: a short study around the running config.
TUNE_FIELDS: tuple[tuple[str, str, str, str], ...] = (
    ("workload", "workload", "concurrency=2", "the load of every trial: concurrency=N or rate=R"),
    ("slo", "SLO", "p99_e2e_ms=10000", "goodput counts requests within it, e.g. p99_e2e_ms=2000"),
    ("budget", "budget", "6", "trials (6) or minutes (10m)"),
    ("knobs", "knobs", "", "none: batch size and token budget; e.g. max_num_seqs=1:32; kernel=stock,custom"),
    ("input_len", "input length", "64", "tokens: N, uniform:LOW-HIGH or lognormal:MEDIAN[:SIGMA]"),
    ("output_len", "output length", "32", "tokens, same forms"),
    ("num_requests", "requests per trial", "24", "at the full rung (successive halving starts lower)"),
    ("top_k", "re-measured", "2", "best candidates re-measured before one is recommended"),
    ("repeats", "re-measurements", "2", "runs of each candidate"),
)
TUNE_DEFAULTS = {name: default for name, _, default, _ in TUNE_FIELDS}


def snapshot_facts(spec: Mapping[str, Any], window: Mapping[str, int] | None = None) -> EngineFacts:
    """The engine's facts from the console's last status, where no daemon can be asked (a replay)."""
    return EngineFacts(model=str(spec.get("model", "")), spec=dict(spec), window=dict(window) if window else None)


def tune_request(engine: str, form: Mapping[str, str]) -> TuneRequest:
    """The request `llmconsole tune` would make of the same values (the fields the form does not
    show keep the CLI's defaults); ValueError names the field that is wrong."""
    workload = form.get("workload", "").strip()
    if not workload:
        raise ValueError("give the workload, e.g. concurrency=2")
    slo = form.get("slo", "").strip()
    request = TuneRequest(
        engine=engine,
        workload=workload,
        slo=[slo] if slo else [],
        budget=form.get("budget", "").strip(),
        knobs=split_items(form.get("knobs", "")),
        input_len=length(form.get("input_len", ""), "input length"),
        output_len=length(form.get("output_len", ""), "output length"),
        num_requests=whole_number(form.get("num_requests", ""), "requests per trial"),
        top_k=whole_number(form.get("top_k", ""), "re-measured candidates"),
        repeats=whole_number(form.get("repeats", ""), "re-measurements"),
    )
    request.check()
    return request


def tune_settings(engine: str, facts: EngineFacts, form: Mapping[str, str]) -> tuple[TuneSettings, TuneSpace]:
    """The settings `llmconsole tune` would use for the same values, and the space as derived
    (each knob's range and where it came from); ValueError says what is wrong."""
    return tune_request(engine, form).settings(facts)


def confirm_question(engine: str, settings: TuneSettings, view: EngineView | None = None) -> str:
    knobs = "; ".join(k.describe() for k in settings.knobs)
    return (
        f"Tune engine {engine} for {settings.budget.describe()} over {knobs}, at {settings.load.label} "
        f"({settings.search} search). Trial 0 runs {params_text(settings.first_trial)}. {tune_text(settings, view)} "
        "Each trial may RESTART the engine on another config; clients get errors or waits meanwhile. "
        "The engine's knobs are put back at the end; a cancel keeps the study to resume."
    )


@dataclass(frozen=True)
class TuneView:
    budget: Budget
    trial: int | None = None  # the study's number of the trial under way
    params: dict[str, Any] = field(default_factory=dict)
    message: str = "starting: opening the study"
    elapsed_s: float = 0.0
    best_req_s: float | None = None
    trials: tuple[TrialOutcome, ...] = ()  # by trial number; earlier runs of the study too
    phase: str = "searching"  # searching | re-measuring | restored
    cancelling: bool = False

    @property
    def counted(self) -> int:
        """Trials that count toward a budget in trials (interrupted ones are retried)."""
        return sum(1 for t in self.trials if t.state not in ("interrupted", "running"))

    @property
    def best(self) -> TrialOutcome | None:
        done = [(t.goodput_req_s, t) for t in self.trials if t.state == "complete" and t.goodput_req_s is not None]
        return max(done, key=lambda scored: scored[0])[1] if done else None


def _upsert(trials: tuple[TrialOutcome, ...], t: TrialOutcome) -> tuple[TrialOutcome, ...]:
    return tuple(sorted({**{x.number: x for x in trials}, t.number: t}.values(), key=lambda x: x.number))


def with_prior(view: TuneView, prior: Iterable[TrialOutcome]) -> TuneView:
    """The trials the study held before this run (a resumed study shows them too)."""
    trials = view.trials
    for t in prior:
        trials = _upsert(trials, t)
    return dataclasses.replace(view, trials=trials)


def fold_tune(view: TuneView, ev: TuneProgress) -> TuneView:
    v = dataclasses.replace(view, message=ev.message, elapsed_s=ev.elapsed_s, best_req_s=ev.best_req_s)
    if ev.event == "trial_started" and ev.trial is not None:
        v = dataclasses.replace(
            v,
            trial=ev.trial,
            params=dict(ev.params),
            phase="searching",
            trials=_upsert(v.trials, TrialOutcome(ev.trial, dict(ev.params), "running", None, 0)),
        )
    elif ev.event == "trial_finished" and ev.outcome is not None:
        v = dataclasses.replace(v, trials=_upsert(v.trials, ev.outcome))
    elif ev.event == "remeasuring":
        v = dataclasses.replace(v, trial=ev.trial, params=dict(ev.params), phase="re-measuring")
    elif ev.event == "restored":
        v = dataclasses.replace(v, phase="restored")
    return v


def headline(view: TuneView, since_s: float = 0.0) -> str:
    """`trial 3 of 6 · 2 min 10 s elapsed`, or against the minutes of a budget in time."""
    elapsed, _ = ticked(view.elapsed_s, None, since_s)
    running = any(t.state == "running" for t in view.trials)
    i = view.counted + (1 if running else 0)
    if view.phase == "re-measuring":
        where = f"re-measuring candidate trial {view.trial}"
    elif view.budget.trials is not None:
        where = f"trial {i} of {view.budget.trials}"
    else:
        where = f"trial {i}"
    if view.budget.minutes is not None:
        return f"{where} · {fmt_duration(elapsed)} of {fmt_duration(view.budget.minutes * 60)}"
    left = left_s(view, since_s)
    return f"{where} · {fmt_duration(elapsed)} elapsed" + (
        f" · ~{fmt_duration(left)} left of the search" if left is not None else ""
    )


def budget_fraction(view: TuneView, since_s: float = 0.0) -> float | None:
    """How much of the budget is spent: trials done of a budget in trials, or time of one in
    minutes; the re-measurements after it are the last step (None: no figure to show)."""
    if view.phase in ("re-measuring", "restored"):
        return 1.0
    if view.budget.trials:
        return min(1.0, view.counted / view.budget.trials)
    if view.budget.minutes:
        return min(1.0, ticked(view.elapsed_s, None, since_s)[0] / (view.budget.minutes * 60))
    return None


def left_s(view: TuneView, since_s: float = 0.0) -> float | None:
    """Time left of the search: the trials still to run at the mean time of those done so far."""
    elapsed, _ = ticked(view.elapsed_s, None, since_s)
    if view.budget.minutes:
        return max(0.0, view.budget.minutes * 60 - elapsed)
    if not view.budget.trials or not view.counted or view.phase != "searching":
        return None
    return max(0.0, elapsed / view.counted * (view.budget.trials - view.counted))


def best_text(view: TuneView) -> str:
    b = view.best
    if b is None:
        bad = [t for t in view.trials if t.state == "infeasible"]
        if bad:  # why the last one was out, where the operator looks first
            return f"best so far: no feasible trial yet · trial {bad[-1].number} infeasible: {bad[-1].reason or '-'}"
        return "best so far: no feasible trial yet"
    return f"best so far: trial {b.number} · {params_text(b.params)} · {b.goodput_req_s:.2f} req/s goodput"


def current_text(view: TuneView) -> str:
    prefix = (
        "cancelling: the trial under way stops, the knobs go back, the study stays resumable. "
        if view.cancelling and view.phase != "restored"
        else ""
    )
    params = params_text(view.params)
    return prefix + (
        f"trial {view.trial} ({params}): {view.message}"
        if view.trial is not None and params and view.phase != "restored"
        else view.message
    )


TRIAL_HEADERS = ("#", "state", "goodput (req/s)", "requests", "params", "why")


def trial_rows(view: TuneView) -> list[list[str]]:
    """The trial table: a * marks the best so far."""
    best = view.best
    rows = []
    for t in view.trials:
        mark = "*" if best is not None and t.number == best.number else ""
        rows.append(
            [
                f"{t.number}{mark}",
                t.state,
                "-" if t.goodput_req_s is None else f"{t.goodput_req_s:.2f}",
                str(t.requests) if t.requests else "-",
                params_text(t.params),
                t.reason or "",
            ]
        )
    return rows


def outcome_lines(result: TuneResult) -> list[str]:
    """The end: the re-measured candidates, the recommendation, and whether the knobs are back."""
    head = {
        "done": f"study {result.study}: done",
        "failed": f"study {result.study}: failed",
        "cancelled": f"study {result.study}: cancelled; the same settings resume it",
    }.get(result.status, result.status)
    lines = [f"{head} ({len(result.trials)} trials, {result.new_trials} this run)"]
    for m in result.remeasured:
        spread = f" ±{m.spread / 2:.0%}" if m.spread is not None else ""
        lines.append(
            f"re-measured trial {m.number}: mean {m.mean_req_s:.2f} req/s{spread} over "
            f"{len(m.goodputs_req_s)} runs · {params_text(m.params)}"
        )
    w = result.winner
    if w is not None:
        lines.append(f"recommended: {params_text(w.params)} ({w.mean_req_s:.2f} req/s goodput)")
    elif result.status == "done":
        lines.append("no config met the constraints")
    if w is None:
        lines += infeasible_lines(result.trials)
    lines.append(
        f"the engine's knobs are back on config {result.original.config_id}"
        if result.restored
        else f"the engine's original config was NOT restored: {result.restore_error}"
    )
    return lines


def can_apply(result: TuneResult | None) -> bool:
    """As `tune --apply`: only a finished study's winner, with the engine back where it was."""
    return result is not None and result.winner is not None and result.restored and result.status == "done"
