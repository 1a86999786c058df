"""The sweep screen's view: the form into the typed request the CLI builds too, and the runner's events folded into
what the screen shows (point i of n, elapsed and time left, the point under way, the rows so
far in the CLI's table form).

The runner sends immutable `SweepProgress` events; `fold_sweep` turns each into a new
immutable `SweepView`, so what the screen shows after a given sequence of events is fixed and
tested without an engine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from llmconsole.console.tui.views.estimate import sweep_size_text, sweep_text
from llmconsole.console.tui.views.run import fmt_duration, length, params_text, split_items, ticked, whole_number
from llmconsole.console.tui.views.status import EngineView
from llmconsole.engine.sweep.plan import PointResult, SweepPlan, SweepProgress
from llmconsole.engine.sweep.report import HEADERS, table_rows
from llmconsole.engine.sweep.request import SweepRequest
from llmconsole.engine.sweep.runner import EngineTarget, SweepResult

# The form's fields and their safe small defaults: a load-only sweep (no restart) of two light loads.
SWEEP_FIELDS: tuple[tuple[str, str, str, str], ...] = (
    # (name, label, default, placeholder)
    ("grid", "server grid", "", "none: the running config; e.g. max_num_seqs=4,8; max_model_len=512,1024"),
    ("load", "load levels", "concurrency=1,2", "concurrency=1,4 or rate=2,8 (requests/s)"),
    ("slo", "SLO", "p99_e2e_ms=10000", "e.g. p99_e2e_ms=2000, ttft_ms=500 (empty: none)"),
    ("repeats", "repeats per point", "2", "runs per point, reported as the median"),
    ("input_len", "input length", "64", "tokens: N, uniform:LOW-HIGH or lognormal:MEDIAN[:SIGMA]"),
    ("output_len", "output length", "32", "tokens, same forms"),
    ("num_requests", "requests per run", "16", "measured requests of each run"),
)
SWEEP_DEFAULTS = {name: default for name, _, default, _ in SWEEP_FIELDS}


def sweep_request(engine: str, form: Mapping[str, str]) -> SweepRequest:
    """The request `llmconsole sweep` would make of the same values (the fields the form does not
    show keep the CLI's defaults); ValueError names the field that is wrong."""
    loads = split_items(form.get("load", ""))
    if not loads:
        raise ValueError("give at least one load level, e.g. concurrency=1,2")
    slo = form.get("slo", "").strip()
    request = SweepRequest(
        engine=engine,
        grid=split_items(form.get("grid", "")),
        loads=loads,
        slo=[slo] if slo else [],
        repeats=whole_number(form.get("repeats", ""), "repeats per point"),
        num_requests=whole_number(form.get("num_requests", ""), "requests per run"),
        input_len=length(form.get("input_len", ""), "input length"),
        output_len=length(form.get("output_len", ""), "output length"),
    )
    request.plan()  # ValueError for what only the plan can tell (an unknown grid field, a bad SLO)
    return request


def sweep_plan(engine: str, form: Mapping[str, str]) -> SweepPlan:
    """The plan `llmconsole sweep` would run for the same values; ValueError says what is wrong."""
    return sweep_request(engine, form).plan()


def restarts_engine(plan: SweepPlan, spec: Mapping[str, Any]) -> bool:
    """Whether any server point differs from the running config (then the engine restarts)."""
    return any(any(spec.get(k) != v for k, v in point.items()) for point in plan.server_points())


def confirm_question(engine: str, plan: SweepPlan, spec: Mapping[str, Any], view: EngineView | None = None) -> str:
    """The question before a sweep: what it does to the engine, and how long it will take."""
    load = sweep_size_text(plan)
    took = sweep_text(plan, spec, view)
    if restarts_engine(plan, spec):
        return (
            f"Sweep engine {engine}: {load}. {took} It RESTARTS the engine on each server config "
            f"({len(plan.server_points())}); clients get errors or waits meanwhile. The original config "
            "is restored at the end, also after a failure or a cancel."
        )
    return (
        f"Sweep engine {engine} at its running config: {load}. {took} No restart; the sweep's load "
        "competes with the engine's other clients while it runs."
    )


@dataclass(frozen=True)
class SweepView:
    total: int
    index: int = 0  # the point under way (1-based; 0 before the first)
    params: dict[str, Any] = field(default_factory=dict)
    message: str = "starting: reading the engine's config"
    elapsed_s: float = 0.0
    eta_s: float | None = None
    points: tuple[PointResult, ...] = ()
    restoring: bool = False
    cancelling: bool = False

    @property
    def done(self) -> int:
        return len(self.points)


def fold_sweep(view: SweepView, ev: SweepProgress) -> SweepView:
    """The view after one more event (the runner's restore events carry no params)."""
    v = dataclasses.replace(view, total=ev.total, elapsed_s=ev.elapsed_s, eta_s=ev.eta_s, message=ev.message)
    if ev.event in ("point_finished", "point_skipped") and ev.result is not None:
        v = dataclasses.replace(v, points=v.points + (ev.result,))
    elif ev.event in ("engine_restarting", "point_started") and ev.params:
        v = dataclasses.replace(v, index=ev.index, params=dict(ev.params))
    if ev.event == "engine_restarting" and not ev.params:
        v = dataclasses.replace(v, restoring=True)
    elif ev.event == "restored":
        v = dataclasses.replace(v, restoring=False)
    return v


def headline(view: SweepView, since_s: float = 0.0) -> str:
    """`point 2 of 4 · 1 min 05 s elapsed · ~40 s left`, ticked `since_s` after the last event."""
    elapsed, left = ticked(view.elapsed_s, view.eta_s, since_s)
    where = f"point {view.index} of {view.total}" if view.index else f"{view.total} point(s)"
    if view.restoring:
        return f"{where} · {fmt_duration(elapsed)} elapsed · restoring the original config ..."
    left_text = "time left after the first point" if left is None else f"~{fmt_duration(left)} left"
    return f"{where} · {view.done} done · {fmt_duration(elapsed)} elapsed · {left_text}"


def current_text(view: SweepView) -> str:
    params = params_text(view.params)
    now = f"{params}: {view.message}" if params and not view.restoring else view.message
    return (
        "cancelling: the run under way stops, then the original config is restored. "
        if view.cancelling and not view.restoring
        else ""
    ) + now


def table(plan: SweepPlan, points: tuple[PointResult, ...]) -> tuple[tuple[str, ...], list[list[str]], list[str]]:
    """The CLI's table (sweep_report.table_rows) for the points so far: headers, rows, N/A notes."""
    partial = SweepResult(plan, points, EngineTarget("", "", "", "", {}), "running", 0.0, 0.0, True)
    rows, notes = table_rows(partial)
    return HEADERS, rows, notes


def hidden_note(hidden: Sequence[str]) -> list[str]:
    """Which columns the table left out at this width, and where they are."""
    if not hidden:
        return []
    return [f"left out at this width: {', '.join(hidden)} (a wider terminal shows them; results.csv has them)"]


def outcome_lines(result: SweepResult, files: Mapping[str, Any]) -> list[str]:
    """After the end: how it ended, whether the config is back, and where the results are."""
    head = {
        "done": "sweep done",
        "cancelled": "sweep cancelled: points not measured are marked so",
        "failed": f"sweep failed: {result.error}",
    }.get(result.status, result.status)
    lines = [head]
    if result.restored:
        lines.append(f"the engine runs its original config {result.original.config_id}")
    else:
        lines.append(f"the engine's original config was NOT restored: {result.restore_error}")
    if files:
        folder = next(iter(files.values())).parent
        lines.append(f"written to {folder}: " + ", ".join(p.name for p in files.values()))
    return lines
