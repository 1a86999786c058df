"""The tune screen: `llmconsole tune` for the selected engine, with progress, the best so far and
the trial table.

It runs the CLI's own parts: the settings from `build_settings`, the `Tuner` driving the engine
through the daemon with `DaemonController`, and the study journal under the data dir, so a
study started here resumes from the CLI and the other way round. A cancel ends the trial under
way, puts the engine's knobs back and leaves the study resumable. The winner is applied only on
request, after a question, through the same guarded apply as `tune --apply`.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from rich.text import Text
from textual.message import Message
from textual.widgets import Static

from llmconsole.console.tui.screens.confirm import ConfirmScreen
from llmconsole.console.tui.screens.run_base import RunScreen, error_text
from llmconsole.console.tui.run_view import params_text, split_items
from llmconsole.console.tui.tune_view import (TRIAL_HEADERS, TUNE_FIELDS, TuneView, best_text, can_apply,
                                              confirm_question, current_text, fold_tune, headline, outcome_lines,
                                              snapshot_facts, trial_rows, tune_settings, with_prior)
from llmconsole.engine.tune.tuner import TuneProgress, TuneResult, TuneSettings
from llmconsole.engine.tune.ranges import EngineFacts, TuneSpace


class PriorTrials(tuple):
    """The study's trials from earlier runs, read before this run starts."""


class WinnerApplied(Message):
    def __init__(self, reply: dict[str, Any] | None, error: str | None) -> None:
        super().__init__()
        self.reply = reply
        self.error = error


class TuneScreen(RunScreen):
    FIELDS = TUNE_FIELDS
    TITLE = "auto-tune"
    WHAT = "tune"
    YES = "Tune"

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.settings: TuneSettings | None = None
        self.view: TuneView | None = None
        self.result: TuneResult | None = None
        self.applying = False
        self.applied: dict[str, Any] | None = None
        self._lines: list[str] = []

    def facts(self, form) -> EngineFacts:
        """The engine as the CLI reads it from the daemon (one short local call), so both derive
        the same ranges; a replayed console has only its last status."""
        if self.paths is None:
            e = self.app.snapshot.engine(self.engine_name) if self.app.snapshot else None
            c = e.controller if e else None
            window = {"min_window": c.min_window, "max_window": c.max_window} \
                if c and c.min_window is not None and c.max_window is not None else None
            return snapshot_facts(self.spec, window)
        from llmconsole.console.cli_common import CliError
        from llmconsole.console.client import DaemonClient, DaemonError, DaemonNotRunning
        from llmconsole.console.commands.tune import engine_facts

        try:
            with DaemonClient(self.paths, timeout_s=5.0) as client:
                return engine_facts(client, self.engine_name, split_items(form.get("knobs", "")))
        except (CliError, DaemonError, DaemonNotRunning) as e:
            raise ValueError(str(e)) from None

    def prepare(self, form) -> tuple[TuneSettings, TuneSpace]:
        return tune_settings(self.engine_name, self.facts(form), form)

    def question(self, prepared: tuple[TuneSettings, TuneSpace]) -> str:
        return confirm_question(self.engine_name, prepared[0])

    def start_view(self, prepared: tuple[TuneSettings, TuneSpace]) -> None:
        self.settings, space = prepared
        self.view = TuneView(budget=self.settings.budget)
        self.render_status()
        self.set_table(TRIAL_HEADERS, [])
        self._notes(space.describe())

    async def run_async(self, prepared: tuple[TuneSettings, TuneSpace], stop: asyncio.Event, emit) -> TuneResult:
        from llmconsole.console.client import DaemonClient
        from llmconsole.console.commands.tune import TuneController
        from llmconsole.engine.tune.tuner import Tuner, open_study, outcomes

        settings = prepared[0]
        storage = self.paths.data_dir / "tuning" / "studies.journal"
        prior = await asyncio.to_thread(
            lambda: outcomes(open_study(storage, settings.name, settings.seed, settings.budget)))
        emit(PriorTrials(prior))
        client = DaemonClient(self.paths, timeout_s=180.0)
        try:
            return await Tuner(settings, TuneController(client, self.engine_name), storage, on_progress=emit,
                               stop=stop).run()
        finally:
            client.close()

    # --- what it shows ---------------------------------------------------------------------

    def progressed(self, ev: TuneProgress | PriorTrials) -> None:
        if isinstance(ev, PriorTrials):
            self.view = with_prior(self.view, ev)
        else:
            self.view = fold_tune(self.view, ev)
        self.render_status()
        self.set_table(TRIAL_HEADERS, trial_rows(self.view))

    def cancelled(self) -> None:
        self.view = dataclasses.replace(self.view, cancelling=True)
        self.render_status()

    def render_status(self) -> None:
        if self.view is None:
            return
        self.query_one("#run-status", Static).update(Text.assemble(
            (headline(self.view, self.since_event_s()), "bold"), "\n", current_text(self.view), "\n",
            (best_text(self.view), "green" if self.view.best else "")))

    def _notes(self, lines: list[str], style: str = "") -> None:
        self._lines = lines
        self.query_one("#run-notes", Static).update(Text("\n".join(lines), style=style))

    def finished_with(self, outcome: TuneResult | None, error: str | None) -> None:
        if error is not None or outcome is None:
            self.render_status()
            self._notes([f"the tune stopped: {error}", "the tuner puts the engine's knobs back before it stops; "
                         "check the engine's state above; the same settings resume the study"], "bold red")
            return
        self.result = outcome
        # The study's own record is the final word (a trial the stop interrupted shows so).
        self.view = dataclasses.replace(self.view, trials=tuple(outcome.trials), trial=None, params={})
        self.set_table(TRIAL_HEADERS, trial_rows(self.view))
        self.query_one("#run-status", Static).update(Text.assemble(
            (outcome_lines(outcome)[0], "bold"), "\n", (best_text(self.view), "green" if self.view.best else "")))
        lines = outcome_lines(outcome)[1:]
        if can_apply(outcome):
            lines.append("a: apply the recommended config through the guarded apply (asks first)")
        self._notes(lines, "" if outcome.restored else "bold red")

    # --- applying the winner ---------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "apply_winner":  # shown only while there is a winner to apply
            return can_apply(self.result) and not self.applying and self.applied is None
        return super().check_action(action, parameters)

    def action_apply_winner(self) -> None:
        if not can_apply(self.result) or self.applying or self.applied is not None:
            return
        w = self.result.winner

        def answered(yes: bool | None) -> None:
            if yes and not self.applying:
                self.applying = True
                self._notes(self._lines + [f"applying {params_text(w.params)} ..."])
                self.run_worker(self._apply, thread=True, group="apply", exit_on_error=False)
                self.app.refresh_bindings()

        self.app.push_screen(ConfirmScreen(
            f"Apply {params_text(w.params)} ({w.mean_req_s:.2f} req/s goodput) to engine {self.engine_name}? "
            "A guarded apply: the gateway holds requests while the engine restarts on it, and the daemon then "
            "watches the SLO and rolls back on its own if it degrades.", "Apply"), answered)

    def _apply(self) -> None:
        from llmconsole.console.client import DaemonClient
        from llmconsole.console.commands.tune import apply_winner

        try:
            with DaemonClient(self.paths, timeout_s=900.0) as client:
                reply = apply_winner(client, self.engine_name, self.result, self.settings)
        except Exception as e:  # noqa: BLE001 - shown under the table; nothing else changed
            self.post_message(WinnerApplied(None, error_text(e)))
        else:
            self.post_message(WinnerApplied(reply, None))

    def on_winner_applied(self, message: WinnerApplied) -> None:
        from llmconsole.console.commands.tune import applied_text

        self.applying = False
        lines = [line for line in self._lines if not line.startswith(("a: apply", "applying "))]
        if message.error is not None:
            self._notes(lines + [f"the winner was not applied: {message.error}"], "bold red")
        else:
            self.applied = message.reply
            self._notes(lines + [applied_text(message.reply)])
        self.app.refresh_bindings()

    @property
    def busy(self) -> bool:
        return self.running or self.applying

