"""The sweep screen: `llmconsole sweep` for the selected engine, run by the daemon, with a live
progress view.

The form becomes the same typed request the CLI builds (engine/sweep/request.py), so a sweep
started here is the one the CLI would run: each server point a daemon restart recorded in the
history, the original config restored at the end, also after a failure or a cancel. The daemon
runs it (quitting the console stops nothing) and writes the results where `sweep --out` would put
them, under its data dir: sweeps/<time>/.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.text import Text
from textual.widgets import Static

from llmconsole.console.tui import progress
from llmconsole.console.tui.charts.runs import sweep_chart
from llmconsole.console.tui.screens.run_base import RunScreen
from llmconsole.console.tui.views.sweep import (
    SWEEP_FIELDS,
    SweepView,
    confirm_question,
    current_text,
    fold_sweep,
    headline,
    hidden_note,
    outcome_lines,
    sweep_request,
    table,
)
from llmconsole.engine.sweep.plan import SweepPlan, SweepProgress
from llmconsole.engine.sweep.report import analyse, picks_text, result_from_json
from llmconsole.engine.sweep.request import SweepRequest
from llmconsole.engine.sweep.runner import SweepResult

Prepared = tuple[SweepRequest, SweepPlan]
Outcome = tuple[SweepResult, dict[str, Path]]  # the result, and the files the daemon wrote


class SweepScreen(RunScreen[Prepared, SweepProgress, Outcome]):
    FIELDS = SWEEP_FIELDS
    CHARTS = ("sweep-chart",)
    TITLE = "mini sweep"
    WHAT = "sweep"
    KEY = "S"
    YES = "Sweep"
    # Narrow, the table keeps params, throughput and latency: the utilizations go first.
    TABLE_SHORT = {
        "throughput (req/s)": "req/s",
        "P99 latency (ms)": "p99 ms",
        "memory (GiB)": "mem GiB",
        "compute util": "compute",
        "bandwidth util": "bandwidth",
    }
    TABLE_DROP = ("bandwidth util", "compute util", "memory (GiB)")
    TABLE_CUT = ("params",)

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.plan: SweepPlan | None = None
        self.view: SweepView | None = None
        self.result: SweepResult | None = None
        self.files: dict[str, Path] = {}

    def prepare(self, form: Mapping[str, str]) -> Prepared:
        request = sweep_request(self.engine_name, form)
        return request, request.plan()

    def request_of(self, prepared: Prepared) -> SweepRequest:
        return prepared[0]

    def prepared_from_request(self, request: Mapping[str, Any]) -> Prepared:
        req = SweepRequest.model_validate(request)
        return req, req.plan()

    def event_from_json(self, raw: Mapping[str, Any]) -> SweepProgress:
        return SweepProgress.from_json(dict(raw))

    def outcome_from_json(self, raw: Mapping[str, Any]) -> Outcome:
        assert self.plan is not None
        return result_from_json(dict(raw), self.plan), {k: Path(v) for k, v in (raw.get("files") or {}).items()}

    def question(self, prepared: Prepared) -> str:
        return confirm_question(self.shown_as, prepared[1], self.spec, self.engine_view())

    def start_view(self, prepared: Prepared | SweepPlan) -> None:
        plan = prepared[1] if isinstance(prepared, tuple) else prepared
        self.plan = plan
        self.view = SweepView(total=plan.total_points)
        self.render_status()
        self.set_table(*table(plan, ())[:2])
        self.chart("sweep-chart", sweep_chart(plan, ()))
        self._notes([])

    # --- what it shows ---------------------------------------------------------------------

    def progressed(self, ev: SweepProgress) -> None:
        assert self.view is not None and self.plan is not None
        self.view = fold_sweep(self.view, ev)
        self.render_status()
        if ev.result is not None:
            headers, rows, notes = table(self.plan, self.view.points)
            hidden = self.set_table(headers, rows)
            self.chart("sweep-chart", sweep_chart(self.plan, self.view.points))
            self._notes(hidden_note(hidden) + [f"[{i}] {n}" for i, n in enumerate(notes, 1)])

    def cancelled(self) -> None:
        if self.view is not None:
            self.view = dataclasses.replace(self.view, cancelling=True)
        self.render_status()

    def render_status(self) -> None:
        if self.view is None:
            return
        v = self.view
        self.query_one("#run-status", Static).update(
            Text.assemble(
                progress.bar(1.0 if v.restoring else v.done / max(1, v.total), 16),
                " ",
                (headline(v, self.since_event_s()), "bold"),
                "\n",
                current_text(v),
                self.poll_note(),
            )
        )

    def _notes(self, lines: list[str], style: str = "") -> None:
        self.query_one("#run-notes", Static).update(Text("\n".join(lines), style=style))

    def finished_with(self, outcome: Outcome | None, error: str | None) -> None:
        if error is not None or outcome is None:
            self.render_status()
            self._notes(
                [
                    f"the sweep stopped: {error}",
                    "the runner puts the original config back before it stops; check the engine's state above",
                ],
                "bold red",
            )
            return
        assert self.plan is not None and self.view is not None
        self.result, self.files = outcome
        self.view = dataclasses.replace(self.view, eta_s=0.0)
        headers, rows, notes = table(self.plan, self.result.points)
        hidden = self.set_table(headers, rows)
        self.chart("sweep-chart", sweep_chart(self.plan, self.result.points))
        self.query_one("#run-status", Static).update(
            Text.assemble(
                progress.bar(1.0, 16),
                " ",
                (outcome_lines(self.result, self.files)[0], "bold"),
                f"  ·  {len(self.result.points)} point(s) in {self.result.finished_at_s - self.result.started_at_s:.0f} s",
            )
        )
        # Whether the engine is back on its config first: on a short screen the notes scroll.
        lines = outcome_lines(self.result, self.files)[1:] + picks_text(self.result, analyse(self.result))
        lines += hidden_note(hidden) + [f"[{i}] {n}" for i, n in enumerate(notes, 1)]
        self._notes(lines, "" if self.result.restored else "bold red")
