"""The engines table: one keyed row per engine, updated cell by cell.

Where the terminal is wide it adds each engine's live figures (KV use, running, generation
tok/s, p99 TTFT), so the fleet can be compared at a glance.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import DataTable

from llmconsole.console.tui.views.status import NA, EngineView, Snapshot, fmt_count, fmt_pct, fmt_rate, fmt_uptime, na
from llmconsole.console.tui.widgets.rank_rows import engine_ranks

STATE_STYLES = {
    "ready": "green",
    "starting": "yellow",
    "unhealthy": "dark_orange",
    "stopping": "yellow",
    "crashed": "red",
    "failed": "bold red",
    "stopped": "dim",
}

COLUMNS = (
    ("name", "name"),
    ("state", "state"),
    ("model", "model"),
    ("config", "config id"),
    ("restarts", "restarts"),
    ("uptime", "uptime"),
    ("kernel", "kernel"),
)
WIDE_COLUMNS = (("kv", "KV"), ("running", "run"), ("gen", "gen tok/s"), ("ttft", "p99 TTFT"))


def state_cell(e: EngineView) -> Text:
    """The state, and a data-parallel rank that lags its peers named beside it: the table is
    what an operator scans, the rank's figures are in the panel below."""
    cell = Text(e.state_text, style=STATE_STYLES.get(e.state, ""))
    lagging = [r.rank for r in engine_ranks(e) if r.lagging]
    if lagging:
        which = f"rank {lagging[0]}" if len(lagging) == 1 else "ranks " + ",".join(lagging)
        cell.append(f" · {which} lags", style="bold dark_orange")
    return cell


def engine_cells(e: EngineView) -> dict[str, str | Text]:
    return {
        "name": e.name,
        "state": state_cell(e),
        "model": e.model,
        "config": e.config_id,
        "restarts": na(e.restarts),
        "uptime": fmt_uptime(e.uptime_s) if e.running else "-",
        "kernel": e.kernel,
        "kv": fmt_pct(e.metric("kv_cache_usage")),
        "running": fmt_count(e.metric("running")),
        "gen": fmt_rate(e.metric("generation_tok_s")),
        "ttft": e.percentile_text("p99_ttft_s", NA, compact=True),
    }


class EnginesTable(DataTable[str | Text]):
    DEFAULT_CSS = """
    EnginesTable { height: auto; max-height: 9; }
    """

    def __init__(self, **kw: Any) -> None:
        super().__init__(cursor_type="row", zebra_stripes=False, show_cursor=True, **kw)
        self._shown: dict[str, dict[str, str | Text]] = {}
        self._columns: tuple[tuple[str, str], ...] = COLUMNS
        self._restore_cursor: int | None = None

    def on_mount(self) -> None:
        for key, label in self._columns:
            self.add_column(label, key=key)

    def set_wide(self, wide: bool) -> None:
        """Add or drop the live-figure columns; rows come back with the next show()."""
        columns = COLUMNS + WIDE_COLUMNS if wide else COLUMNS
        if columns == self._columns:
            return
        cursor = self.cursor_row
        self._columns = columns
        self.clear(columns=True)
        self._shown.clear()
        for key, label in columns:
            self.add_column(label, key=key)
        self._restore_cursor = cursor

    @property
    def selected_name(self) -> str | None:
        if not self.row_count:
            return None
        try:
            return self.coordinate_to_cell_key(self.cursor_coordinate).row_key.value
        except Exception:
            return None

    def show(self, snapshot: Snapshot) -> None:
        """Add, update and remove rows so they match `snapshot`; untouched cells stay as they are."""
        names = [e.name for e in snapshot.engines]
        for gone in [n for n in self._shown if n not in names]:
            self.remove_row(gone)
            del self._shown[gone]
        keys = [k for k, _ in self._columns]
        for e in snapshot.engines:
            all_cells = engine_cells(e)
            cells = {k: all_cells[k] for k in keys}
            shown = self._shown.get(e.name)
            if shown is None:
                self.add_row(*(cells[k] for k in keys), key=e.name)
            else:
                for key, value in cells.items():
                    if shown.get(key) != value:
                        self.update_cell(e.name, key, value, update_width=True)
            self._shown[e.name] = cells
        restore = self._restore_cursor
        if restore is not None and self.row_count:
            self._restore_cursor = None
            self.move_cursor(row=min(restore, self.row_count - 1))
