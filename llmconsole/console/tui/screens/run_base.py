"""What the sweep and tune screens share: a small form, a question before anything restarts the
engine, the run itself in the daemon, its progress polled back, and a cancel that ends it the
way Ctrl-C ends the CLI's run.

The console is a client: the run is a typed request sent to the daemon (POST /v1/runs), which
runs it whatever happens to this console, so quitting or losing the SSH session stops nothing.
The screen polls the run (poll, then re-arm: a slow daemon stretches the period instead of
piling up requests); each poll's new progress events come back, as the runner's own immutable
events, in `RunProgressed` messages, and the end in `RunFinished`. The UI thread folds them
into the screen's view. Opening the screen of an engine whose run is under way picks it up.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pydantic import BaseModel
from rich.text import Text
from textual import getters
from textual.app import ComposeResult
from textual.containers import Container, Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import DataTable, Input, Label, Static

from llmconsole.console.tui.charts.spec import ChartSpec
from llmconsole.console.tui.keys import bindings_for
from llmconsole.console.tui.messages import RunFinished, RunPolled, RunProgressed, RunStarted
from llmconsole.console.tui.screens.confirm import ConfirmScreen
from llmconsole.console.tui.screens.run_link import NO_DAEMON, RunLink
from llmconsole.console.tui.table_fit import SIDE_BY_SIDE, FittedTableScreen
from llmconsole.console.tui.views.status import EngineView
from llmconsole.console.tui.widgets.chart import ChartBox
from llmconsole.console.tui.widgets.footer import ConsoleFooter
from llmconsole.console.tui.widgets.panels import DaemonBanner

if TYPE_CHECKING:
    from llmconsole.console.tui.console_state import ConsoleAppType, ConsoleState
    from llmconsole.console.tui.sources.daemon import Dial

POLL_S = 1.0

PreparedT = TypeVar("PreparedT")  # what the form becomes: the typed request and what is derived from it
EventT = TypeVar("EventT")  # a progress event, as the runner's own value
OutcomeT = TypeVar("OutcomeT")  # the run's outcome, likewise


class RunScreen(FittedTableScreen, Screen[None], Generic[PreparedT, EventT, OutcomeT]):
    """A subclass names its FIELDS (name, label, default, placeholder), builds its typed request
    from the form (`prepare`, ValueError for bad input; `request_of`), reads the daemon's JSON back
    as the runner's own values (`event_from_json`, `outcome_from_json`) and shows its events
    (`progressed`, `finished_with`)."""

    BINDINGS = bindings_for("run")
    FIELDS: tuple[tuple[str, str, str, str], ...] = ()
    CHARTS: tuple[str, ...] = ()  # the ids of the charts the run draws as it goes
    TITLE = "run"
    WHAT = "run"  # the daemon's run kind: sweep | tune
    KEY = "?"  # the dashboard key that opens this screen
    YES = "Run"

    if TYPE_CHECKING:
        app = getters.app(ConsoleAppType)  # the console's state, typed (no runtime check)

    def __init__(
        self,
        engine_name: str,
        dial: Dial | None,
        spec: Mapping[str, Any],
        form: Mapping[str, str] | None = None,
        shown_as: str | None = None,
    ) -> None:
        super().__init__(classes="run-screen")
        self.engine_name = engine_name  # as its daemon knows it
        self.shown_as = shown_as or engine_name  # as the console shows it (ENGINE@HOST over several hosts)
        self.dial = dial  # new clients of the engine's daemon; None: a replayed console
        self.spec = dict(spec)
        self.form_values = {name: default for name, _, default, _ in self.FIELDS} | dict(form or {})
        self.started = False
        self.running = False
        self.cancel_requested = False
        self.clock = time.monotonic  # tests fix it, so a pictured screen holds still
        self._event_at: float | None = None
        self.run_id: int | None = None  # the daemon's run, once it took it
        self.events_seen = 0
        self.poll_error: str | None = None
        self.prepared: PreparedT | None = None
        self.link = RunLink(lambda: self.dial, self.WHAT, self.post_message)  # the daemon, from worker threads

    @property
    def busy(self) -> bool:
        """Nothing here holds the console: a run is the daemon's, and goes on after a quit."""
        return False

    @property
    def farewell_note(self) -> str | None:
        if self.running:
            return f"the {self.WHAT} of {self.shown_as} runs on in the daemon; {self.KEY} on the engine shows it"
        return None

    # --- layout ----------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        blink = getattr(self.app, "cursor_blink", True)
        yield DaemonBanner()
        yield Static(id="run-title")
        with Vertical(id="run-form"):
            for name, label, _default, placeholder in self.FIELDS:
                with Horizontal(classes="run-row"):
                    yield Label(label, classes="run-label")
                    inp = Input(value=self.form_values[name], placeholder=placeholder, compact=True, id=f"run-{name}")
                    inp.cursor_blink = blink
                    yield inp
            yield Static(id="run-error")
            yield Static(f"ctrl+s: {self.WHAT} (asks first)  ·  esc: back", id="run-hint")
        yield Static(id="run-status")
        with Container(id="run-body"):
            with Horizontal(id="run-charts"):
                for chart_id in self.CHARTS:
                    yield ChartBox(id=chart_id)
            yield DataTable(id="run-table", cursor_type="row", zebra_stripes=True)
        with VerticalScroll(id="run-notes-box"):
            yield Static(id="run-notes")
        yield ConsoleFooter()

    def on_resize(self) -> None:
        """Charts beside the table where the screen is wide, above it where not; the table
        fitted again to its new width."""
        self.query_one("#run-body").set_class(self.size.width >= SIDE_BY_SIDE, "-side")
        self.refit_table()

    def chart(self, chart_id: str, spec: ChartSpec) -> None:
        self.query_one(f"#{chart_id}", ChartBox).show(spec)

    def on_mount(self) -> None:
        self._title(self.app)
        if self.FIELDS:
            self.query_one(f"#run-{self.FIELDS[0][0]}", Input).focus()
        if self.dial is not None:  # a run of this engine under way (started by any console) is shown
            self.run_worker(lambda: self.link.find(self.engine_name), thread=True, group="run-io", exit_on_error=False)

    def on_unmount(self) -> None:
        self.link.close()

    def on_screen_resume(self) -> None:
        self.show_state(self.app)

    def show_state(self, app: ConsoleState) -> None:
        self.query_one(DaemonBanner).show(app.lost_reason, app.retry_s)
        self._title(app)

    def _title(self, app: ConsoleState) -> None:
        snap = getattr(app, "snapshot", None)
        e = snap.engine(self.shown_as) if snap else None
        state = f"{e.state_text} · config {e.config_id}" if e else "not known to the daemon"
        self.query_one("#run-title", Static).update(
            Text.assemble((f"{self.TITLE} of {self.shown_as}", "bold"), f"  ·  engine {state}")
        )

    # --- the form --------------------------------------------------------------------------

    def engine_view(self) -> EngineView | None:
        snap = getattr(self.app, "snapshot", None)
        return snap.engine(self.shown_as) if snap else None

    def read_form(self) -> dict[str, str]:
        return {name: self.query_one(f"#run-{name}", Input).value for name, *_ in self.FIELDS}

    def prepare(self, form: Mapping[str, str]) -> PreparedT:
        raise NotImplementedError

    def question(self, prepared: PreparedT) -> str:
        raise NotImplementedError

    def show_error(self, message: str) -> None:
        self.query_one("#run-error", Static).update(Text(message, style="bold red") if message else "")

    def action_start_run(self) -> None:
        if self.started:
            return
        try:
            prepared = self.prepare(self.read_form())
        except ValueError as e:
            self.show_error(str(e))
            return
        if self.dial is None:
            self.show_error(NO_DAEMON)
            return
        self.show_error("")

        def answered(yes: bool | None) -> None:
            if yes and not self.started:
                self.begin(prepared)

        self.app.push_screen(ConfirmScreen(self.question(prepared), self.YES), answered)

    # --- the run ---------------------------------------------------------------------------

    def begin(self, prepared: PreparedT) -> None:
        """Show the progress view and hand the run to the daemon."""
        self.running = True
        self.show_run(prepared)
        self.set_interval(1.0, self.tick)
        request = self.request_of(prepared)
        self.run_worker(lambda: self.link.start(request), thread=True, group="run-io", exit_on_error=False)

    def show_run(self, prepared: PreparedT) -> None:
        """The form gives way to the progress view (tests stage a run's events on it)."""
        self.started = True
        self.prepared = prepared
        self.add_class("-started")
        self.start_view(prepared)
        self.query_one("#run-table", DataTable).focus()
        self.app.refresh_bindings()

    def _poll_later(self, delay_s: float = POLL_S) -> None:
        # A timer of 0 s divides by its interval in Textual: the first poll waits a moment.
        self.set_timer(
            max(0.05, delay_s),
            lambda: self.run_worker(
                lambda: self.link.poll(self.run_id, self.events_seen), thread=True, group="run-io", exit_on_error=False
            ),
        )

    # --- what the daemon said (UI thread) ----------------------------------------------------

    def on_run_started(self, message: RunStarted) -> None:
        run = message.run
        if message.found:
            if self.started:  # this screen started one meanwhile: it is that one
                return
            try:
                prepared = self.prepared_from_request(run["request"])
            except ValueError:
                return
            self.running = True
            self.show_run(prepared)
            self.set_interval(1.0, self.tick)
            self.app.notify(f"a {self.WHAT} of {self.shown_as} is under way (run {run['id']}): showing it")
        self.run_id = int(run["id"])
        if self.cancel_requested:  # a cancel that came before the daemon's answer
            self.run_worker(lambda: self.link.cancel(int(run["id"])), thread=True, group="run-io", exit_on_error=False)
        self._poll_later(0.05)

    def on_run_polled(self, message: RunPolled) -> None:
        if not self.running:
            return
        if message.reply is None:
            self.poll_error = message.error
            self.render_status()
            self._poll_later(POLL_S * 3)
            return
        self.poll_error = None
        reply = message.reply
        for raw in reply["new_events"]:
            self.events_seen += 1
            self.on_run_progressed(RunProgressed(self.event_from_json(raw)))
        if reply["state"] == "running":
            self._poll_later()
            return
        try:
            outcome = None if reply.get("outcome") is None else self.outcome_from_json(reply["outcome"])
        except (KeyError, TypeError, ValueError) as e:
            outcome, reply["error"] = None, f"the daemon's outcome could not be read: {e}"
        self.on_run_finished(RunFinished(outcome, reply.get("error") if outcome is None else None))

    # What a subclass knows: its request, and the daemon's JSON as the runner's own values.
    def request_of(self, prepared: PreparedT) -> BaseModel:
        raise NotImplementedError

    def prepared_from_request(self, request: Mapping[str, Any]) -> PreparedT:
        raise NotImplementedError

    def event_from_json(self, raw: Mapping[str, Any]) -> EventT:
        raise NotImplementedError

    def outcome_from_json(self, raw: Mapping[str, Any]) -> OutcomeT:
        raise NotImplementedError

    def action_cancel_run(self) -> None:
        if not self.running or self.cancel_requested:
            return
        self.cancel_requested = True
        if self.run_id is not None and self.dial is not None:
            run_id = self.run_id
            self.run_worker(lambda: self.link.cancel(run_id), thread=True, group="run-io", exit_on_error=False)
        self.cancelled()
        self.app.refresh_bindings()

    def on_run_progressed(self, message: RunProgressed) -> None:
        self._event_at = self.clock()
        self.progressed(message.event)

    def on_run_finished(self, message: RunFinished) -> None:
        if not self.started:
            return
        self.running = False
        self.finished_with(message.outcome, message.error)
        self.app.refresh_bindings()

    def since_event_s(self) -> float:
        return 0.0 if self._event_at is None or not self.running else self.clock() - self._event_at

    def tick(self) -> None:
        if self.running:
            self.render_status()

    def poll_note(self) -> Text:
        """A line under the status while the daemon does not answer the polls (it is retried)."""
        if not self.poll_error:
            return Text("")
        return Text(f"\nthe daemon did not answer ({self.poll_error}); asking again", style="bold yellow")

    # What a subclass shows.
    def start_view(self, prepared: PreparedT) -> None: ...
    def progressed(self, event: EventT) -> None: ...
    def cancelled(self) -> None: ...
    def render_status(self) -> None: ...
    def finished_with(self, outcome: OutcomeT | None, error: str | None) -> None: ...

    # --- keys ------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "start_run":
            return not self.started
        if action == "cancel_run":
            if not self.running:
                return False
            return None if self.cancel_requested else True
        if action in ("apply_winner", "next_knob"):
            return False  # only a tune has a winner and knobs (its screen says when)
        return True

    def action_back(self) -> None:
        if self.running:
            self.app.notify(
                f"the {self.WHAT} runs on in the daemon; {self.KEY} on {self.shown_as} shows it again, "
                "c there cancels it"
            )
        self.app.pop_screen()
