"""The sweep screen: `llmconsole sweep` for the selected engine, with a live progress view.

It runs the CLI's own parts (the plan from `build_plan`, `SweepRunner` driving the engine through
the daemon with `DaemonController`, the history store, `write_results`), so a sweep started here
is the one the CLI would run: each server point a daemon restart recorded in the history, the
original config restored at the end, also after a failure or a cancel. Results go where
`sweep --out` would put them, under the data dir: sweeps/<time>/.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

from rich.text import Text
from textual.widgets import Static

from llmconsole.console.tui.screens.run_base import RunScreen
from llmconsole.console.tui.sweep_view import (SWEEP_FIELDS, SweepView, confirm_question, current_text, fold_sweep,
                                               headline, outcome_lines, sweep_plan, table)
from llmconsole.engine.sweep.plan import SweepPlan, SweepProgress


class SweepScreen(RunScreen):
    FIELDS = SWEEP_FIELDS
    TITLE = "mini sweep"
    WHAT = "sweep"
    YES = "Sweep"

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.plan: SweepPlan | None = None
        self.view: SweepView | None = None
        self.out_dir: Path | None = None
        self.result = None
        self.files: dict[str, Path] = {}

    def prepare(self, form) -> SweepPlan:
        return sweep_plan(self.engine_name, form)

    def question(self, plan: SweepPlan) -> str:
        return confirm_question(self.engine_name, plan, self.spec)

    def start_view(self, plan: SweepPlan) -> None:
        self.plan = plan
        self.view = SweepView(total=plan.total_points)
        if self.paths is not None:
            self.out_dir = self.paths.data_dir / "sweeps" / time.strftime("%Y%m%d-%H%M%S")
        self.render_status()
        self.set_table(*table(plan, ())[:2])
        self._notes([])

    async def run_async(self, plan: SweepPlan, stop: asyncio.Event, emit) -> Any:
        from llmconsole.console.client import DaemonClient
        from llmconsole.console.commands.sweep import DaemonController
        from llmconsole.db import Store, StoreError
        from llmconsole.engine.sweep.runner import SweepRunner

        client = DaemonClient(self.paths, timeout_s=180.0)
        try:
            store = Store.open(self.paths.database)
        except StoreError:
            store = None  # the sweep runs all the same; only its history row is missing
        try:
            return await SweepRunner(plan, DaemonController(client, self.engine_name), on_progress=emit,
                                     stop=stop, store=store).run()
        finally:
            if store is not None:
                store.close()
            client.close()

    def after_run(self, result) -> Any:
        from llmconsole.engine.sweep.report import write_results

        return result, write_results(result, self.out_dir)

    # --- what it shows ---------------------------------------------------------------------

    def progressed(self, ev: SweepProgress) -> None:
        self.view = fold_sweep(self.view, ev)
        self.render_status()
        if ev.result is not None:
            headers, rows, notes = table(self.plan, self.view.points)
            self.set_table(headers, rows)
            self._notes([f"[{i}] {n}" for i, n in enumerate(notes, 1)])

    def cancelled(self) -> None:
        self.view = dataclasses.replace(self.view, cancelling=True)
        self.render_status()

    def render_status(self) -> None:
        if self.view is None:
            return
        self.query_one("#run-status", Static).update(Text.assemble(
            (headline(self.view, self.since_event_s()), "bold"), "\n", current_text(self.view)))

    def _notes(self, lines: list[str], style: str = "") -> None:
        self.query_one("#run-notes", Static).update(Text("\n".join(lines), style=style))

    def finished_with(self, outcome, error: str | None) -> None:
        from llmconsole.engine.sweep.report import analyse, picks_text

        if error is not None or outcome is None:
            self.render_status()
            self._notes([f"the sweep stopped: {error}",
                         "the runner puts the original config back before it stops; check the engine's state above"],
                        "bold red")
            return
        self.result, self.files = outcome
        self.view = dataclasses.replace(self.view, eta_s=0.0)
        headers, rows, notes = table(self.plan, self.result.points)
        self.set_table(headers, rows)
        self.query_one("#run-status", Static).update(Text.assemble(
            (outcome_lines(self.result, self.files)[0], "bold"),
            f"  ·  {len(self.result.points)} point(s) in {self.result.finished_at_s - self.result.started_at_s:.0f} s"))
        lines = [f"[{i}] {n}" for i, n in enumerate(notes, 1)]
        lines += picks_text(self.result, analyse(self.result)) + outcome_lines(self.result, self.files)[1:]
        self._notes(lines, "" if self.result.restored else "bold red")
