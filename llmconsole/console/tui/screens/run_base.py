"""What the sweep and tune screens share: a small form, a question before anything restarts the
engine, a run in a thread of its own, its progress as messages, and a cancel that ends it the
way Ctrl-C ends the CLI's run.

The run gets its own thread and event loop: the load generator's timings then never wait on
the console's rendering, and the console stays responsive however busy the run is. The runner's
immutable progress events come back as `RunProgressed` messages; the UI thread folds them into
the screen's view. A cancel sets the runner's stop event inside its loop; the runner then
finishes what is under way and puts the engine back (its own finally).
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Mapping

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import Screen
from textual.widgets import DataTable, Input, Label, Static

from llmconsole.console.tui.keys import bindings_for
from llmconsole.console.tui.screens.confirm import ConfirmScreen
from llmconsole.console.tui.widgets.footer import ConsoleFooter
from llmconsole.console.tui.widgets.panels import DaemonBanner
from llmconsole.paths import Paths

if TYPE_CHECKING:
    from llmconsole.console.tui.app import ConsoleApp

NO_DAEMON = "this console is not attached to a live daemon (a recording replays); nothing was started"


class RunProgressed(Message):
    def __init__(self, event: Any) -> None:
        super().__init__()
        self.event = event


class RunFinished(Message):
    def __init__(self, outcome: Any, error: str | None) -> None:
        super().__init__()
        self.outcome = outcome
        self.error = error


def error_text(e: BaseException) -> str:
    # The CLI's own errors (engine not ready, ...) and the daemon's refusals read as sentences.
    from llmconsole.console.cli_common import CliError
    from llmconsole.console.client import DaemonError

    return str(e) if isinstance(e, (CliError, DaemonError)) else f"{type(e).__name__}: {e}"


class RunScreen(Screen):
    """A subclass names its FIELDS (name, label, default, placeholder), builds its run from the
    form (`prepare`, ValueError for bad input), runs it (`run_async`, in the run's own loop) and
    shows its events (`progressed`, `finished_with`)."""

    BINDINGS = bindings_for("run")
    FIELDS: tuple[tuple[str, str, str, str], ...] = ()
    TITLE = "run"
    WHAT = "run"
    YES = "Run"

    def __init__(self, engine_name: str, paths: Paths | None, spec: Mapping[str, Any],
                 form: Mapping[str, str] | None = None) -> None:
        super().__init__(classes="run-screen")
        self.engine_name = engine_name
        self.paths = paths
        self.spec = dict(spec)
        self.form_values = {name: default for name, _, default, _ in self.FIELDS} | dict(form or {})
        self.started = False
        self.running = False
        self.cancel_requested = False
        self.clock = time.monotonic          # tests fix it, so a pictured screen holds still
        self._event_at: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None

    @property
    def busy(self) -> bool:
        """While a run is under way the console does not quit: the engine may sit on another config."""
        return self.running

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
        yield DataTable(id="run-table", cursor_type="row", zebra_stripes=True)
        yield Static(id="run-notes")
        yield ConsoleFooter()

    def on_mount(self) -> None:
        self._title(self.app)
        if self.FIELDS:
            self.query_one(f"#run-{self.FIELDS[0][0]}", Input).focus()

    def on_screen_resume(self) -> None:
        self.show_state(self.app)

    def show_state(self, app: "ConsoleApp") -> None:
        self.query_one(DaemonBanner).show(app.lost_reason, app.retry_s)
        self._title(app)

    def _title(self, app: "ConsoleApp") -> None:
        snap = getattr(app, "snapshot", None)
        e = snap.engine(self.engine_name) if snap else None
        state = f"{e.state_text} · config {e.config_id}" if e else "not known to the daemon"
        self.query_one("#run-title", Static).update(
            Text.assemble((f"{self.TITLE} of {self.engine_name}", "bold"), f"  ·  engine {state}"))

    # --- the form --------------------------------------------------------------------------

    def read_form(self) -> dict[str, str]:
        return {name: self.query_one(f"#run-{name}", Input).value for name, *_ in self.FIELDS}

    def prepare(self, form: Mapping[str, str]) -> Any:
        raise NotImplementedError

    def question(self, prepared: Any) -> str:
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
        if self.paths is None:
            self.show_error(NO_DAEMON)
            return
        self.show_error("")

        def answered(yes: bool | None) -> None:
            if yes and not self.started:
                self.begin(prepared)

        self.app.push_screen(ConfirmScreen(self.question(prepared), self.YES), answered)

    # --- the run ---------------------------------------------------------------------------

    def begin(self, prepared: Any) -> None:
        """Show the progress view and start the run in its own thread."""
        self.running = True
        self.show_run(prepared)
        self.set_interval(1.0, self.tick)
        self.run_worker(lambda: self._thread(prepared), thread=True, group="run", exit_on_error=False)

    def show_run(self, prepared: Any) -> None:
        """The form gives way to the progress view (tests stage a run's events on it)."""
        self.started = True
        self.add_class("-started")
        self.start_view(prepared)
        self.query_one("#run-table", DataTable).focus()
        self.app.refresh_bindings()

    def _thread(self, prepared: Any) -> None:
        async def main() -> Any:
            stop = asyncio.Event()
            self._stop = stop
            self._loop = asyncio.get_running_loop()
            if self.cancel_requested:  # a cancel that came before the loop did
                stop.set()
            return await self.run_async(prepared, stop, lambda ev: self.post_message(RunProgressed(ev)))

        try:
            outcome = self.after_run(asyncio.run(main()))
        except BaseException as e:  # noqa: BLE001 - whatever ends the run is shown, never raised
            self.post_message(RunFinished(None, error_text(e)))
        else:
            self.post_message(RunFinished(outcome, None))

    async def run_async(self, prepared: Any, stop: asyncio.Event, emit) -> Any:
        raise NotImplementedError

    def after_run(self, outcome: Any) -> Any:
        """Blocking follow-up in the run's thread (writing files); the outcome as shown."""
        return outcome

    def action_cancel_run(self) -> None:
        if not self.running or self.cancel_requested:
            return
        self.cancel_requested = True
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:
                pass  # the loop just ended: the run is over anyway
        self.cancelled()
        self.app.refresh_bindings()

    def on_run_progressed(self, message: RunProgressed) -> None:
        self._event_at = self.clock()
        self.progressed(message.event)

    def on_run_finished(self, message: RunFinished) -> None:
        self.running = False
        self.finished_with(message.outcome, message.error)
        self.app.refresh_bindings()

    def since_event_s(self) -> float:
        return 0.0 if self._event_at is None or not self.running else self.clock() - self._event_at

    def tick(self) -> None:
        if self.running:
            self.render_status()

    # What a subclass shows.
    def start_view(self, prepared: Any) -> None: ...
    def progressed(self, event: Any) -> None: ...
    def cancelled(self) -> None: ...
    def render_status(self) -> None: ...
    def finished_with(self, outcome: Any, error: str | None) -> None: ...

    def set_table(self, headers, rows: list[list[str]]) -> None:
        t = self.query_one("#run-table", DataTable)
        if not t.columns:
            for i, h in enumerate(headers):
                t.add_column(h, key=str(i))
        t.clear()
        for r in rows:
            t.add_row(*r)

    # --- keys ------------------------------------------------------------------------------

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "start_run":
            return not self.started
        if action == "cancel_run":
            if not self.running:
                return False
            return None if self.cancel_requested else True
        if action == "apply_winner":
            return False  # only a tune has a winner (its screen says when)
        return True

    def action_back(self) -> None:
        if self.running:
            self.app.notify(f"the {self.WHAT} is under way: c cancels it (the engine's config is put back), "
                            "then esc leaves", severity="warning")
            return
        self.app.pop_screen()
