"""Screens about one engine: its detail (spec, changes, startup facts, restarts) and its log."""

from __future__ import annotations

import collections
import dataclasses
import json
from typing import TYPE_CHECKING, Any

from rich.table import Table
from rich.text import Text
from textual import getters
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Static

from llmconsole.console.logtext import from_line_start
from llmconsole.console.tui.keys import bindings_for
from llmconsole.console.tui.logfilter import LogView
from llmconsole.console.tui.views.config_memory import SpecVersion, spec_diff
from llmconsole.console.tui.views.status import EngineView, LogChunk, fmt_uptime, na
from llmconsole.console.tui.widgets.footer import ConsoleFooter
from llmconsole.console.tui.widgets.log_view import FollowLog, SearchBar
from llmconsole.console.tui.widgets.panels import DaemonBanner

if TYPE_CHECKING:
    from llmconsole.console.tui.console_state import ConsoleAppType, ConsoleState


def _value(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, (dict, list)):
        return json.dumps(v) if v else "-"
    return str(v)


class EngineScreen(Screen[None]):
    BINDINGS = bindings_for("screen")

    if TYPE_CHECKING:
        app = getters.app(ConsoleAppType)  # the console's state, typed (no runtime check)

    def __init__(self, engine_name: str) -> None:
        super().__init__()
        self.engine_name = engine_name

    def action_back(self) -> None:
        self.app.pop_screen()

    def on_resize(self) -> None:
        self.set_class(self.size.width >= 110, "-wide")


class DetailScreen(EngineScreen):
    def __init__(self, engine_name: str) -> None:
        super().__init__(engine_name)
        self._shown: tuple[object, ...] = ()

    def compose(self) -> ComposeResult:
        yield DaemonBanner()
        yield Static(id="detail-title")
        with VerticalScroll(id="detail-body"):
            with Vertical(classes="detail-column"):
                yield Static(id="detail-startup", classes="detail-section")
                yield Static(id="detail-restarts", classes="detail-section")
                yield Static(id="detail-changes", classes="detail-section")
            with Vertical(classes="detail-column"):
                yield Static(id="detail-spec", classes="detail-section")
        yield ConsoleFooter()

    def on_mount(self) -> None:
        for sid, title in (
            ("startup", "startup"),
            ("restarts", "restart history"),
            ("changes", "changes from the previous version"),
            ("spec", "spec"),
        ):
            self.query_one(f"#detail-{sid}").border_title = title

    def on_screen_resume(self) -> None:
        self.show_state(self.app)

    def show_state(self, app: ConsoleState) -> None:
        self.query_one(DaemonBanner).show(app.lost_reason, app.retry_s)
        e = app.snapshot.engine(self.engine_name) if app.snapshot else None
        prev = app.specs.previous(self.engine_name)
        key = (e, prev)
        if key == self._shown:
            return
        self._shown = key
        title = self.query_one("#detail-title", Static)
        if e is None:
            title.update(Text(f"engine {self.engine_name}: not known to the daemon any more", style="bold red"))
            return
        title.update(
            Text.assemble(
                ("engine ", "bold"), (e.name, "bold"), f"  ·  {e.state_text}  ·  config {e.config_id}  ·  {na(e.url)}"
            )
        )
        self.query_one("#detail-startup", Static).update(self._startup(e))
        self.query_one("#detail-restarts", Static).update(self._restarts(e))
        self.query_one("#detail-changes", Static).update(self._changes(e, prev))
        self.query_one("#detail-spec", Static).update(self._spec(e))

    @staticmethod
    def _startup(e: EngineView) -> Text:
        conc = "N/A"
        if e.max_concurrency is not None:
            conc = f"{e.max_concurrency:.2f}x at {na(e.max_concurrency_len, '{:,}')} tokens per request"
        return Text.assemble(
            ("KV cache          ", "bold"),
            na(e.kv_cache_tokens, "{:,} tokens"),
            "\n",
            ("max concurrency   ", "bold"),
            conc,
            "\n",
            ("pid               ", "bold"),
            na(e.pid),
            "\n",
            ("uptime            ", "bold"),
            fmt_uptime(e.uptime_s) if e.running else "-",
            "\n",
            ("kernel            ", "bold"),
            {"custom": "custom (llmconsole decode)", "stock": "stock (vLLM)"}.get(e.kernel, e.kernel),
            f"\n                  ({e.kernel_note})" if e.kernel_note else "",
        )

    @staticmethod
    def _restarts(e: EngineView) -> Text:
        out = Text.assemble(
            ("restarts          ", "bold"),
            na(e.restarts),
            "  (crash loop: the daemon stopped restarting it)" if e.crash_looping else "",
            "\n",
            ("last exit code    ", "bold"),
            na(e.last_exit_code),
            "\n",
            ("last error        ", "bold"),
            e.last_error or "N/A",
        )
        if e.next_restart_in_s is not None:
            out.append(f"\nnext restart in {e.next_restart_in_s:.0f} s")
        return out

    @staticmethod
    def _changes(e: EngineView, prev: SpecVersion | None) -> Text | Table:
        if prev is None:
            return Text("no earlier version seen", style="dim")
        diff = spec_diff(prev.spec, e.spec)
        if not diff:
            return Text(f"config {prev.config_id} -> {e.config_id}: no field differs", style="dim")
        t = Table(box=None, show_edge=False, pad_edge=False, expand=True)
        t.add_column("field", style="bold", no_wrap=True)
        t.add_column(f"was ({prev.config_id})", style="red", overflow="fold")
        t.add_column(f"now ({e.config_id})", style="green", overflow="fold")
        for field, old, new in diff:
            t.add_row(field, _value(old), _value(new))
        return t

    @staticmethod
    def _spec(e: EngineView) -> Table | Text:
        if not e.spec:
            return Text("N/A", style="dim")
        t = Table(box=None, show_header=False, show_edge=False, pad_edge=False)
        t.add_column("field", style="bold", no_wrap=True)
        t.add_column("value", overflow="fold")
        for k, v in e.spec.items():
            t.add_row(k, _value(v))
        return t


class LogsScreen(EngineScreen):
    """The engine's whole log (its last 256 KiB to start with), followed as it grows until the
    user scrolls up; quiet by default (v shows every line), and narrowed by a search (/) of its
    own, which Esc clears before a second Esc leaves."""

    FIRST_BYTES = 256 * 1024
    MAX_LINES = 5000

    def __init__(self, engine_name: str) -> None:
        super().__init__(engine_name)
        self.log_offset: int | None = None
        self.log_search = ""  # this pane's search: the dashboard's pane has its own
        self._raw: collections.deque[str] = collections.deque(maxlen=self.MAX_LINES)
        self._partial = ""
        self._hidden = 0

    def compose(self) -> ComposeResult:
        yield DaemonBanner()
        yield Static(id="logs-title")
        yield FollowLog(max_lines=self.MAX_LINES, highlight=False, id="logs")
        yield SearchBar()
        yield ConsoleFooter()

    def on_mount(self) -> None:
        self._title()

    @property
    def view(self) -> LogView:
        return dataclasses.replace(self.app.log_view, search=self.log_search)

    def _title(self) -> None:
        self.query_one("#logs-title", Static).update(
            Text.assemble(("log of ", "bold"), (self.engine_name, "bold"), f"  ·  {self.view.describe(self._hidden)}")
        )

    def log_request(self) -> tuple[str, int | None, int]:
        return (self.engine_name, self.log_offset, self.FIRST_BYTES if self.log_offset is None else 1024 * 1024)

    def show_state(self, app: ConsoleState) -> None:
        self.query_one(DaemonBanner).show(app.lost_reason, app.retry_s)

    def take_logs(self, chunk: LogChunk) -> None:
        if chunk.name != self.engine_name or chunk.from_offset != self.log_offset:
            return
        log = self.query_one(FollowLog)
        if self.log_offset is not None and chunk.size < self.log_offset:  # truncated or replaced
            log.clear()
            self._raw.clear()
            self._partial, self._hidden = "", 0
            self.log_offset = None
            return
        text = chunk.text
        if self.log_offset is None:  # the tail: it starts mid-line unless it is the whole file
            text = from_line_start(text, cut=chunk.size > self.FIRST_BYTES)
        if text:
            lines = (self._partial + text).split("\n")
            self._partial = lines.pop()
            self._raw.extend(lines)
            shown, hidden = self.view.lines(lines)
            self._hidden += hidden
            if shown:
                log.write_lines(shown)
            if hidden:
                self._title()
        self.log_offset = chunk.offset

    def show_log_view(self) -> None:
        """Quiet or full, a search: the lines kept so far, shown again through the new view."""
        shown, self._hidden = self.view.lines(self._raw)
        log = self.query_one(FollowLog)
        log.clear()
        log.write_lines(shown)
        self._title()

    def open_search(self) -> None:
        self.query_one(SearchBar).open(self.log_search)

    def on_search_bar_searched(self, event: SearchBar.Searched) -> None:
        self.log_search = event.text.strip()
        self.show_log_view()
        if event.done:
            self.query_one(FollowLog).focus()

    def action_back(self) -> None:
        """Esc clears a search first (as the title promises); with none, it leaves."""
        if self.log_search:
            self.log_search = ""
            self.show_log_view()
            return
        super().action_back()
