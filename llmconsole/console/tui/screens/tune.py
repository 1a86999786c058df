"""The tune screen: `llmconsole tune` for the selected engine, run by the daemon, with progress,
the best so far and the trial table.

The form becomes the same typed request the CLI builds (engine/tune/request.py), with the ranges
derived from the same engine facts, and the study journal is the daemon's, under its data dir,
so a study started here resumes from the CLI and the other way round. The daemon runs it
(quitting the console stops nothing). A cancel ends the trial under way, puts the engine's knobs
back and leaves the study resumable. The winner is applied only on request, after a question,
through the same guarded apply as `tune --apply`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rich.text import Text
from textual.message import Message
from textual.widgets import Static

from llmconsole.console.tui import progress
from llmconsole.console.tui.charts.runs import knob_chart, knobs_of, tune_chart
from llmconsole.console.tui.screens.confirm import ConfirmScreen
from llmconsole.console.tui.screens.run_base import RunScreen
from llmconsole.console.tui.screens.run_link import NO_DAEMON, error_text
from llmconsole.console.tui.views.run import params_text
from llmconsole.console.tui.views.tune import (
    TRIAL_HEADERS,
    TUNE_FIELDS,
    TuneView,
    best_text,
    budget_fraction,
    can_apply,
    confirm_question,
    current_text,
    fold_tune,
    headline,
    outcome_lines,
    snapshot_facts,
    trial_rows,
    tune_request,
    with_prior,
)
from llmconsole.engine.metrics.latency import Slo
from llmconsole.engine.tune.guard import applied_text
from llmconsole.engine.tune.ranges import EngineFacts
from llmconsole.engine.tune.request import TuneRequest
from llmconsole.engine.tune.settings import TuneSettings
from llmconsole.engine.tune.space import TrialOutcome, parse_budget
from llmconsole.engine.tune.tuner import TuneProgress, TuneResult


class PriorTrials(tuple[TrialOutcome, ...]):
    """The study's trials from earlier runs, read before this run starts."""


@dataclass(frozen=True)
class SpaceDerived:
    """The knobs' ranges as the daemon derived them for the run (where each came from)."""

    lines: tuple[str, ...]


@dataclass(frozen=True)
class TunePrepared:
    request: TuneRequest
    settings: TuneSettings | None  # None for a run picked up from the daemon: it derived them
    space_lines: tuple[str, ...] = ()


# What the daemon's progress events read as: the study's first word (its earlier trials and the
# ranges), then the tuner's own events.
TuneEvent = TuneProgress | list[SpaceDerived | PriorTrials]


class WinnerApplied(Message):
    def __init__(self, reply: dict[str, Any] | None, error: str | None) -> None:
        super().__init__()
        self.reply = reply
        self.error = error


class TuneScreen(RunScreen[TunePrepared, TuneEvent, TuneResult]):
    FIELDS = TUNE_FIELDS
    CHARTS = ("trials-chart", "knob-chart")
    TITLE = "auto-tune"
    WHAT = "tune"
    KEY = "T"
    YES = "Tune"
    # Narrow, the table keeps the trial, its state, goodput and why: the request count goes
    # first, the params and the reason are cut last (the line under the status and the notes
    # at the end say each infeasible trial's reason in full).
    TABLE_SHORT = {"goodput (req/s)": "req/s", "requests": "reqs"}
    TABLE_DROP = ("requests",)
    TABLE_CUT = ("params", "why")

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.request: TuneRequest | None = None
        self.view: TuneView | None = None
        self.result: TuneResult | None = None
        self.applying = False
        self.applied: dict[str, Any] | None = None
        self._lines: list[str] = []
        self.knob = 0  # which knob the knob chart shows (o steps through them)

    def facts(self, request: TuneRequest) -> EngineFacts:
        """The engine as the daemon reports it (one short local call), so the ranges shown here are
        the ones the run will derive; a replayed console has only its last status."""
        if self.dial is None:
            e = self.app.snapshot.engine(self.shown_as) if self.app.snapshot else None
            c = e.controller if e else None
            window = (
                {"min_window": c.min_window, "max_window": c.max_window}
                if c and c.min_window is not None and c.max_window is not None
                else None
            )
            return snapshot_facts(self.spec, window)
        from llmconsole.console.client import DaemonError, DaemonNotRunning, engine_facts

        try:
            with self.dial(5.0) as client:
                return engine_facts(client, self.engine_name, with_window=request.wants_window())
        except (DaemonError, DaemonNotRunning) as e:
            raise ValueError(str(e)) from None

    def prepare(self, form: Mapping[str, str]) -> TunePrepared:
        request = tune_request(self.engine_name, form)
        settings, space = request.settings(self.facts(request))
        return TunePrepared(request, settings, tuple(space.describe()))

    def request_of(self, prepared: TunePrepared) -> TuneRequest:
        return prepared.request

    def prepared_from_request(self, request: Mapping[str, Any]) -> TunePrepared:
        req = TuneRequest.model_validate(request)
        req.check()
        return TunePrepared(req, None)

    def event_from_json(self, raw: Mapping[str, Any]) -> TuneEvent:
        if raw.get("event") == "prior":  # the daemon's first word: the study's earlier trials, the ranges
            return [
                SpaceDerived(tuple(raw.get("space") or ())),
                PriorTrials(TrialOutcome(**t) for t in raw.get("trials") or ()),
            ]
        return TuneProgress.from_json(dict(raw))

    def outcome_from_json(self, raw: Mapping[str, Any]) -> TuneResult:
        return TuneResult.from_json(dict(raw))

    def question(self, prepared: TunePrepared) -> str:
        assert prepared.settings is not None
        return confirm_question(self.shown_as, prepared.settings, self.engine_view())

    def start_view(self, prepared: TunePrepared) -> None:
        self.request = prepared.request
        self.view = TuneView(budget=parse_budget(prepared.request.budget))
        self.render_status()
        self.set_table(TRIAL_HEADERS, [])
        self._notes(list(prepared.space_lines))

    # --- what it shows ---------------------------------------------------------------------

    def progressed(self, ev: TuneEvent) -> None:
        assert self.view is not None
        for one in ev if isinstance(ev, list) else [ev]:
            if isinstance(one, SpaceDerived):
                self._notes(list(one.lines))
            elif isinstance(one, PriorTrials):
                self.view = with_prior(self.view, one)
            else:
                self.view = fold_tune(self.view, one)
        self.render_status()
        self.set_table(TRIAL_HEADERS, trial_rows(self.view))
        self.draw_charts()

    def draw_charts(self) -> None:
        trials = self.view.trials if self.view is not None else ()
        knobs = knobs_of(trials)
        self.chart("trials-chart", tune_chart(trials))
        self.chart("knob-chart", knob_chart(trials, knobs[self.knob % len(knobs)] if knobs else None))

    def action_next_knob(self) -> None:
        self.knob += 1
        self.draw_charts()

    def cancelled(self) -> None:
        if self.view is not None:
            self.view = dataclasses.replace(self.view, cancelling=True)
        self.render_status()

    def render_status(self) -> None:
        if self.view is None:
            return
        self.query_one("#run-status", Static).update(
            Text.assemble(
                progress.bar(budget_fraction(self.view, self.since_event_s()), 16),
                " ",
                (headline(self.view, self.since_event_s()), "bold"),
                "\n",
                current_text(self.view),
                "\n",
                (best_text(self.view), "green" if self.view.best else ""),
                self.poll_note(),
            )
        )

    def _notes(self, lines: list[str], style: str = "") -> None:
        self._lines = lines
        self.query_one("#run-notes", Static).update(Text("\n".join(lines), style=style))

    def finished_with(self, outcome: TuneResult | None, error: str | None) -> None:
        if error is not None or outcome is None:
            self.render_status()
            self._notes(
                [
                    f"the tune stopped: {error}",
                    "the tuner puts the engine's knobs back before it stops; "
                    "check the engine's state above; the same settings resume the study",
                ],
                "bold red",
            )
            return
        assert self.view is not None
        self.result = outcome
        # The study's own record is the final word (a trial the stop interrupted shows so).
        self.view = dataclasses.replace(self.view, trials=tuple(outcome.trials), trial=None, params={})
        self.set_table(TRIAL_HEADERS, trial_rows(self.view))
        self.draw_charts()
        self.query_one("#run-status", Static).update(
            Text.assemble(
                progress.bar(1.0, 16),
                " ",
                (outcome_lines(outcome)[0], "bold"),
                "\n",
                (best_text(self.view), "green" if self.view.best else ""),
            )
        )
        lines = outcome_lines(outcome)[1:]
        if can_apply(outcome):
            lines.append("a: apply the recommended config through the guarded apply (asks first)")
        self._notes(lines, "" if outcome.restored else "bold red")

    # --- applying the winner ---------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "apply_winner":  # shown only while there is a winner to apply
            return can_apply(self.result) and not self.applying and self.applied is None
        if action == "next_knob":
            return True if self.view is not None and len(knobs_of(self.view.trials)) > 1 else None
        return super().check_action(action, parameters)

    def action_apply_winner(self) -> None:
        if not can_apply(self.result) or self.applying or self.applied is not None:
            return
        assert self.result is not None and self.result.winner is not None
        w = self.result.winner

        def answered(yes: bool | None) -> None:
            if yes and not self.applying:
                self.applying = True
                self._notes(self._lines + [f"applying {params_text(w.params)} ..."])
                self.run_worker(self._apply, thread=True, group="apply", exit_on_error=False)
                self.app.refresh_bindings()

        self.app.push_screen(
            ConfirmScreen(
                f"Apply {params_text(w.params)} ({w.mean_req_s:.2f} req/s goodput) to engine {self.shown_as}? "
                "A guarded apply: the gateway holds requests while the engine restarts on it, and the daemon then "
                "watches the SLO and rolls back on its own if it degrades.",
                "Apply",
            ),
            answered,
        )

    def _apply(self) -> None:
        assert self.result is not None and self.result.winner is not None and self.request is not None

        if self.dial is None:  # a replayed console: no daemon to apply it through
            self.post_message(WinnerApplied(None, NO_DAEMON))
            return
        try:
            with self.dial(900.0) as client:
                reply = client.apply_tuned(
                    self.engine_name,
                    self.result.winner.params,
                    Slo.parse(self.request.slo).as_dict(),
                    self.result.study,
                )
        except Exception as e:  # noqa: BLE001 - shown under the table; nothing else changed
            self.post_message(WinnerApplied(None, error_text(e)))
        else:
            self.post_message(WinnerApplied(reply, None))

    def on_winner_applied(self, message: WinnerApplied) -> None:
        self.applying = False
        lines = [line for line in self._lines if not line.startswith(("a: apply", "applying "))]
        if message.error is not None:
            self._notes(lines + [f"the winner was not applied: {message.error}"], "bold red")
        else:
            self.applied = message.reply
            self._notes(lines + [applied_text(message.reply or {})])
        self.app.refresh_bindings()

    @property
    def busy(self) -> bool:
        """An apply waits for the daemon's answer: the console stays to show it."""
        return self.applying
