"""The console app: polls a StateSource, applies each snapshot on the UI thread, sends commands.

Data flows one way. A thread worker polls the source and posts `StatusPolled` (or `DaemonLost`);
the UI thread keeps the newest snapshot, adds it to the bounded histories and lets only the
active screen render it. The next poll is armed when the current one has been applied, so a slow
daemon stretches the period instead of piling up requests. The selected engine's log is read by
a worker of its own (`LogRead`), one read at a time: a host that takes a log read and never
answers holds up that read only, never the poll that refreshes every host. Commands run in their own thread
workers and come back as `CommandSent` or `CommandFailed`. Every failure ends as a notification:
nothing a daemon or an engine does can stop the console.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import work
from textual.app import App
from textual.screen import Screen
from textual.timer import Timer
from textual.worker import Worker, WorkerState

from llmconsole.console.client import DaemonError, DaemonNotRunning
from llmconsole.console.tui import toasts
from llmconsole.console.tui.actions import ConsoleActions
from llmconsole.console.tui.charts.series import SeriesHistory
from llmconsole.console.tui.console_state import ConsoleState
from llmconsole.console.tui.keys import bindings_for, check_keymap
from llmconsole.console.tui.logfilter import LogView
from llmconsole.console.tui.messages import (
    CommandFailed,
    CommandSent,
    DaemonLost,
    HistoryFetched,
    PollFailed,
    StatusPolled,
)
from llmconsole.console.tui.screens.dashboard import DashboardScreen
from llmconsole.console.tui.screens.hosts import FleetDashboardScreen
from llmconsole.console.tui.sources.daemon import Command, StateSource
from llmconsole.console.tui.sources.log_reader import LogReading
from llmconsole.console.tui.views.config_memory import SpecMemory
from llmconsole.console.tui.views.status import LogChunk, Snapshot
from llmconsole.console.tui.widgets.engine_panel import Switch

SWITCH_EXTRA_S = 10.0  # a mode switch is a restart, plus draining its requests and a smoke request


@dataclass
class _Switching:
    mode: str
    began_s: float
    expected_s: float | None
    restarted: bool = False


class ConsoleApp(LogReading, ConsoleActions, App[str]):
    CSS_PATH = Path(__file__).parent / "console.tcss"  # absolute: subclasses live elsewhere
    TITLE = "llmconsole"
    BINDINGS = bindings_for("app")

    def __init__(
        self,
        source: StateSource,
        refresh_s: float = 1.0,
        retry_s: float = 2.0,
        keymap: Mapping[str, str] | None = None,
        cursor_blink: bool = True,
        fleet: bool = False,
    ) -> None:
        super().__init__()
        self.source = source
        self.fleet = fleet  # several hosts: engines grouped by host, named ENGINE@HOST
        self.refresh_s = refresh_s
        self.retry_s = retry_s
        self.keymap = check_keymap(keymap or {})
        self.cursor_blink = cursor_blink
        self.snapshot: Snapshot | None = None
        self.lost_reason: str | None = None
        self.history = SeriesHistory()  # the charts' figures, live and from the daemon's store
        self.chart_range_s = 300.0
        self.chart_pick = "pid"  # the chart a short terminal shows (g switches)
        self.log_view = LogView()
        self.clock = time.monotonic  # tests fix it, so a pictured progress bar holds still
        self._switching: dict[str, _Switching] = {}
        self._fetching: set[str] = set()
        self.specs = SpecMemory()
        self.logs: dict[str, LogChunk] = {}
        self.polls_applied = 0  # polls that brought a status
        self.polls_done = 0  # polls that finished, whatever they brought
        self.fetches_done = 0  # answers (or failures) of the daemon's stored history
        self._logs_out: set[str] = set()  # engines whose log read is out (sources/log_reader.py)
        self._logs_again: set[str] = set()  # ... and asked for again by a poll meanwhile
        self.log_reads_done = 0  # log reads that finished, whatever they brought
        self._timer: Timer | None = None
        self._polling = False
        self._poll_again = False
        self._last_poll_error: str | None = None
        self.hold_polls = False  # tests and benchmarks freeze the screen; commands still poll once
        self._bindings_key: tuple[object, ...] = ()

    # --- polling --------------------------------------------------------------------------

    def get_default_screen(self) -> Screen[None]:
        return FleetDashboardScreen() if self.fleet else DashboardScreen()

    def on_mount(self) -> None:
        if self.keymap:
            self.set_keymap(self.keymap)
        self.call_after_refresh(self._tick)

    def _arm(self, delay_s: float) -> None:
        if self._timer is not None:
            self._timer.stop()
        self._timer = self.set_timer(max(delay_s, 0.001), self._tick)  # a zero-delay timer breaks on stop

    def _tick(self) -> None:
        if self._polling:
            return
        self._polling = True
        self._poll()

    def poll_soon(self) -> None:
        """Poll now (after a command), without starting a second chain of polls."""
        if self._polling:
            self._poll_again = True
        else:
            self._arm(0)

    def _polled(self, delay_s: float) -> None:
        self._polling = False
        self.polls_done += 1
        if self._poll_again or not self.hold_polls:
            self._arm(0 if self._poll_again else delay_s)
        self._poll_again = False

    @work(thread=True, group="poll", exit_on_error=False)
    def _poll(self) -> None:
        try:
            status = self.source.poll()
            snapshot = Snapshot.parse(status)
        except DaemonNotRunning as e:
            self.post_message(DaemonLost(str(e)))
            return
        except Exception as e:
            self.post_message(PollFailed(f"{type(e).__name__}: {e}"))
            return
        self.post_message(StatusPolled(snapshot))

    def on_status_polled(self, message: StatusPolled) -> None:
        try:
            was_lost = self.lost_reason is not None
            self.lost_reason = None
            self._last_poll_error = None
            self.snapshot = message.snapshot
            self.history.add(message.snapshot)
            self.specs.add(message.snapshot)
            self._follow_switches(message.snapshot)
            for gone in [n for n in self.logs if message.snapshot.engine(n) is None]:
                del self.logs[gone]
            self.polls_applied += 1
            self._render_active(None)
            self._want_log()
            if was_lost:
                self.notify("the daemon answers again")
            self.refresh_bindings_if_changed()
        except Exception as e:  # a rendering bug must not take the console down
            self.report_failure("showing the status", e)
        finally:
            self._polled(self.refresh_s)

    def on_daemon_lost(self, message: DaemonLost) -> None:
        try:
            first = self.lost_reason is None
            self.lost_reason = message.reason
            self._render_active(None)
            if first:
                self.refresh_bindings_if_changed()
        except Exception as e:
            self.report_failure("showing the daemon as lost", e)
        finally:
            self._polled(self.retry_s)

    def on_poll_failed(self, message: PollFailed) -> None:
        if message.error != self._last_poll_error:
            self._last_poll_error = message.error
            self.notify(f"the daemon's status could not be read: {message.error}", severity="error")
        self._polled(self.retry_s)

    def refresh_bindings_if_changed(self) -> None:
        """The footer recomposes on refresh_bindings: do it only when what keys may do changed."""
        e = self.selected_engine()
        key = (
            type(self.screen).__name__,
            e.name if e else None,
            e.state if e else None,
            self.not_answering(e) is None,
            self.selected_host(),
            bool(self.snapshot and self.snapshot.serving),
        )
        if key != self._bindings_key:
            self._bindings_key = key
            self.refresh_bindings()

    def _render_active(self, chunk: LogChunk | None) -> None:
        screen = self.screen
        show = getattr(screen, "show_state", None)
        if show is not None:
            show(self)
        take = getattr(screen, "take_logs", None)
        if take is not None and chunk is not None:
            take(chunk)

    def report_failure(self, what: str, error: BaseException) -> None:
        """The one error path: say what failed, keep running."""
        self.notify(f"{what} failed: {type(error).__name__}: {error}", severity="error", timeout=8)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.state == WorkerState.ERROR:
            if event.worker.error is not None:  # always set on ERROR
                self.report_failure(event.worker.name or "a background task", event.worker.error)
            if event.worker.group == "poll":
                self._polled(self.retry_s)
            if event.worker.group == "logs":  # never: _read_log posts its failures
                self._logs_out.clear()

    # --- commands -------------------------------------------------------------------------

    def send(self, command: Command) -> None:
        self.notify(f"{toasts.asked(command)}: sent", timeout=3)
        if command.verb == "mode" and command.engine is not None and (command.spec or {}).get("mode") != "auto":
            e = self.snapshot.engine(command.engine) if self.snapshot else None
            last = e.last_start_s if e is not None else None
            self._switching[command.engine] = _Switching(
                str((command.spec or {}).get("mode")), self.clock(), None if last is None else last + SWITCH_EXTRA_S
            )
        self._send(command)

    @work(thread=True, group="commands", exit_on_error=False)
    def _send(self, command: Command) -> None:
        try:
            reply = self.source.send(command)
        except DaemonError as e:
            self.post_message(CommandFailed(command, str(e)))
        except DaemonNotRunning:
            self.post_message(CommandFailed(command, "no daemon answers; nothing was changed"))
        except Exception as e:
            self.post_message(CommandFailed(command, f"{type(e).__name__}: {e}"))
        else:
            self.post_message(CommandSent(command, reply if isinstance(reply, dict) else {}))

    def on_command_sent(self, message: CommandSent) -> None:
        if message.command.verb == "mode":
            self._switching.pop(message.command.engine or "", None)
        self.notify(toasts.done(message.command, message.reply), timeout=5)
        self.poll_soon()

    def on_command_failed(self, message: CommandFailed) -> None:
        if message.command.verb == "mode":
            self._switching.pop(message.command.engine or "", None)
        self.notify(f"{toasts.asked(message.command)} failed: {message.error}", severity="error", timeout=10)
        self.poll_soon()

    # --- what the dashboard draws beyond the status -----------------------------------------

    def _follow_switches(self, snapshot: Snapshot) -> None:
        for name, sw in self._switching.items():
            e = snapshot.engine(name)
            if e is not None and e.state != "ready":
                sw.restarted = True

    def switch_of(self, name: str | None) -> Switch | None:
        """The mode switch of `name` this console is waiting on, as the dashboard shows it."""
        sw = self._switching.get(name or "")
        if sw is None:
            return None
        return Switch(sw.mode, self.clock() - sw.began_s, sw.expected_s, sw.restarted)

    def want_history(self, name: str) -> None:
        """Ask the daemon once for what its store kept of `name` over the charts' range."""
        if name in self._fetching or not self.history.wants_fill(name, self.chart_range_s):
            return
        fetch = getattr(self.source, "samples", None)
        if fetch is None:
            return
        self._fetching.add(name)
        self._fetch_history(name, self.chart_range_s)

    @work(thread=True, group="history", exit_on_error=False)
    def _fetch_history(self, name: str, range_s: float) -> None:
        try:
            answer = self.source.samples(name, since_s=range_s, points=600)
        except Exception:  # an older daemon, or none: the charts fill from the polls alone
            answer = None
        self.post_message(HistoryFetched(name, range_s, answer))

    def on_history_fetched(self, message: HistoryFetched) -> None:
        self._fetching.discard(message.name)
        if message.answer is not None:
            self.history.fill(message.name, message.answer, message.range_s)
        else:
            self.history.of(message.name).filled_s = message.range_s  # do not ask again and again
        self.fetches_done += 1
        self._render_active(None)


if TYPE_CHECKING:
    _SCREENS_READ: type[ConsoleState] = ConsoleApp  # mypy: the app holds all the screens read of it


def make_app(source: StateSource, **kw: Any) -> ConsoleApp:
    """The console around `source` (a DaemonSource in use, a HostsSource over several hosts, a
    RecordedSource in tests); `fleet=True` for the dashboard of several hosts."""
    return ConsoleApp(source, **kw)
