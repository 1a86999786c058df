"""The engines of several hosts, grouped by host: a header row per host with its gauges (GPU memory
and utilization where it has GPUs, else CPU and memory) or why it does not answer (ssh's reason),
then its engines in the same columns as the one-host table. Host rows can be selected too: the
panel below then shows that host, and `n` starts an engine there.

Rows are options of an OptionList keyed by HOST_ROW + host and ENGINE_ROW + ENGINE@HOST; a poll
that changes figures only replaces prompts in place, so the cursor stays where it is.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import OptionList
from textual.widgets.option_list import Option

from llmconsole.console.tui.views.status import EngineView, HostSection, Snapshot, fmt_bytes, na
from llmconsole.console.tui.widgets.engines_table import COLUMNS, WIDE_COLUMNS, engine_cells
from llmconsole.console.tui.widgets.gauges import level_style

HOST_ROW, ENGINE_ROW, HEAD_ROW = "host:", "engine:", "columns"
MARKS = {"up": ("●", "green"), "unreachable": ("✖", "bold red"), "connecting": ("○", "dim")}


def bar(fraction: float | None, width: int) -> Text:
    if fraction is None:
        return Text("·" * width, style="dim")
    filled = round(min(1.0, max(0.0, fraction)) * width)
    return Text.assemble(("█" * filled, level_style(fraction)), ("░" * (width - filled), "dim"))


def gauges(h: HostSection, width: int) -> list[Text]:
    """The host's figures, as its daemon last reported them: GPUs first where it has any."""
    v = h.host
    n = 16 if width >= 150 else 10 if width >= 110 else 6
    out = []
    if v.gpus:
        used, total = v.gpu_memory
        util = v.gpu_utilization_pct
        out.append(Text.assemble("GPU mem ", bar(used / total if used is not None and total else None, n)))
        out[-1].append(f" {fmt_bytes(used)} / {fmt_bytes(total)}")
        out.append(Text.assemble("util ", bar(None if util is None else util / 100, n), f" {na(util, '{:.0f}%')}"))
        out.append(Text(f"{len(v.gpus)} GPU" + ("s" if len(v.gpus) > 1 else "")))
    cpu = v.cpu_pct
    if not v.gpus or width >= 110:
        out.append(Text.assemble("CPU ", bar(None if cpu is None else cpu / 100, n), f" {na(cpu, '{:.0f}%')}"))
    if not v.gpus:
        out.append(Text.assemble("mem ", bar(v.memory_fraction, n), f" {fmt_bytes(v.memory_used_bytes)}"))
        out[-1].append(f" / {fmt_bytes(v.memory_total_bytes)}")
        out.append(Text("no GPU", style="dim"))
    return out


def host_row(h: HostSection, width: int) -> Text:
    """The host's header: its name, then its gauges, or what keeps it from answering (ssh's own
    reason on a line of its own, so it is never cut short by the figures)."""
    state = h.state
    mark, style = MARKS.get(state, ("●", "yellow"))
    out = Text.assemble((mark + " ", style), (h.label, "bold"), "  ", no_wrap=True, overflow="ellipsis")
    sep = Text("  ")
    if state in ("up", "slow"):
        parts = gauges(h, width)
        if state == "slow":
            parts.insert(0, Text(f"slow: no answer for {h.waiting_s or 0:.0f} s", style="yellow"))
        parts.append(Text(f"{h.engines} engine" + ("" if h.engines == 1 else "s")))
        out.append_text(sep.join(parts))
        return out
    if state == "connecting":
        out.append("connecting ...", style="dim")
        return out
    out.append(state, style=style)
    if h.retry_in_s is not None:
        out.append(f" · next try in {h.retry_in_s:.0f} s")
    if h.seen and h.engines:
        seen = f" {h.age_s:.0f} s ago" if h.age_s is not None else ""
        out.append(f" · engines as last seen{seen}", style="dim")
    elif state == "no daemon":
        out.append(" · n starts an engine there, and its daemon", style="dim")
    if h.error and state != "no daemon":  # on a line of its own: ssh's words are never cut for the figures
        out.append("\n    " + h.error, style="red" if state == "unreachable" else "yellow")
    return out


def cropped(text: Text, width: int) -> Text:
    """Each line of `text` cut at `width` (an option's prompt would wrap instead)."""
    lines = text.split("\n")
    for line in lines:
        line.truncate(width, overflow="ellipsis")
    return Text("\n").join(lines)


def _cell_len(cell: str | Text) -> int:
    return cell.cell_len if isinstance(cell, Text) else Text(cell).cell_len


def _widths(rows: list[dict[str, str | Text]], columns: tuple[tuple[str, str], ...]) -> list[int]:
    return [max([len(label), *(_cell_len(r[key]) for r in rows)]) for key, label in columns]


def _line(cells: list[str | Text], widths: list[int], indent: str = "  ") -> Text:
    out = Text(indent, no_wrap=True, overflow="ellipsis")
    for i, (cell, w) in enumerate(zip(cells, widths, strict=True)):
        t = cell if isinstance(cell, Text) else Text(cell)
        out.append_text(t)
        if i < len(cells) - 1:
            out.append(" " * (w - t.cell_len + 2))
    return out


def fleet_rows(snapshot: Snapshot, width: int, wide: bool) -> list[tuple[str, Text, bool]]:
    """(option id, prompt, disabled) of every row: the column titles, then each host and its engines."""
    columns = COLUMNS + WIDE_COLUMNS if wide else COLUMNS
    keys = [k for k, _ in columns]
    by_host: dict[str, list[EngineView]] = {}
    for e in snapshot.engines:
        by_host.setdefault(e.host or "", []).append(e)
    cells: dict[str, dict[str, str | Text]] = {}
    for e in snapshot.engines:
        c = engine_cells(e)
        c["name"] = e.name.split("@", 1)[0]
        cells[e.name] = c
    widths = _widths(list(cells.values()), columns)
    rows = [(HEAD_ROW, _line([Text(label, style="bold") for _, label in columns], widths, "    "), True)]
    for h in snapshot.hosts:
        rows.append((HOST_ROW + h.name, cropped(host_row(h, width), width), False))
        for e in by_host.get(h.name, ()):
            line = _line([cells[e.name][k] for k in keys], widths, "    ")
            if not h.current:
                line.stylize("dim")
            rows.append((ENGINE_ROW + e.name, line, False))
    return rows


class HostsTable(OptionList):
    DEFAULT_CSS = """
    HostsTable { height: auto; max-height: 11; border: none; padding: 0; }
    HostsTable:focus { border: none; }
    HostsTable > .option-list--option { padding: 0; }
    HostsTable > .option-list--option-disabled { color: $foreground; }
    """

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self._wide = False
        self._ids: list[str] = []
        self._prompts: dict[str, Text] = {}
        self._snapshot: Snapshot | None = None

    def set_wide(self, wide: bool) -> None:
        self._wide = wide

    def on_resize(self) -> None:
        if self._snapshot is not None:
            self.show(self._snapshot)

    @property
    def selected_id(self) -> str | None:
        option = self.highlighted_option
        return option.id if option is not None else None

    @property
    def selected_name(self) -> str | None:
        """The engine under the cursor (ENGINE@HOST), None on a host row."""
        sid = self.selected_id or ""
        return sid.removeprefix(ENGINE_ROW) if sid.startswith(ENGINE_ROW) else None

    @property
    def selected_host(self) -> str | None:
        """The host under the cursor: its row's, or the selected engine's."""
        sid = self.selected_id or ""
        if sid.startswith(HOST_ROW):
            return sid.removeprefix(HOST_ROW)
        if sid.startswith(ENGINE_ROW):
            return sid.split("@", 1)[1]
        return None

    def show(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot
        width = self.scrollable_content_region.width or self.app.size.width
        rows = fleet_rows(snapshot, width, self._wide)
        ids = [r[0] for r in rows]
        if ids == self._ids:
            for oid, prompt, _ in rows:
                if self._prompts.get(oid) != prompt:
                    self.replace_option_prompt(oid, prompt)
                    self._prompts[oid] = prompt
            return
        keep = self.selected_id
        self.clear_options()
        self.add_options([Option(prompt, id=oid, disabled=off) for oid, prompt, off in rows])
        self._ids, self._prompts = ids, {oid: prompt for oid, prompt, _ in rows}
        if keep in ids:
            self.highlighted = ids.index(keep)
        else:  # the first engine, as the one-host table starts on its first row; else the first host
            first = next((i for i in ids if i.startswith(ENGINE_ROW)), None) or next(
                (i for i in ids if i.startswith(HOST_ROW)), None
            )
            if first is not None:
                self.highlighted = ids.index(first)
