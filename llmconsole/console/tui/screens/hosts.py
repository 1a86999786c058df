"""The dashboard of a console over several hosts: the engines grouped by host, each host's row with
its gauges or ssh's reason for not answering (widgets/hosts_table.py), and below them the selected
engine as on one host's dashboard, or the selected host: its gauges and how it answers."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.text import Text
from textual.widget import Widget
from textual.widgets import OptionList, Static

from llmconsole.console.tui.screens.dashboard import DashboardScreen
from llmconsole.console.tui.views.status import HostSection
from llmconsole.console.tui.widgets.engine_panel import EnginePanel
from llmconsole.console.tui.widgets.hosts_table import HostsTable

if TYPE_CHECKING:
    from llmconsole.console.tui.console_state import ConsoleState


def host_title(h: HostSection) -> Text:
    """The panel's title for a selected host row."""
    out = Text.assemble(("host ", "bold"), (h.label, "bold"), no_wrap=True, overflow="ellipsis")
    if h.state == "unreachable":
        out.append("  ·  unreachable: ", style="bold red")
        out.append(h.error or "", style="red")
        if h.retry_in_s is not None:
            out.append(f"  ·  next try in {h.retry_in_s:.0f} s")
        return out
    if h.error:
        out.append(f"  ·  {h.error}", style="yellow")
        return out
    version = f"daemon v{h.version}" if h.version else "daemon"
    gpus = f"{len(h.host.gpus)} GPU(s)" if h.host.gpus else "no GPU: host memory and CPU below"
    out.append(f"  ·  {version}  ·  {h.engines} engine(s)  ·  {gpus}  ·  n starts one here")
    if h.wire_note:  # its daemon is another llmconsole: its answers are shown as far as both know
        out.append(f"  ·  {h.wire_note}", style="yellow")
    return out


class FleetDashboardScreen(DashboardScreen):
    def engine_list(self) -> Widget:
        return HostsTable(id="engines")

    @property
    def selected_host(self) -> str | None:
        return self.query_one(HostsTable).selected_host

    def _show_selected(self, app: ConsoleState) -> None:
        super()._show_selected(app)
        snap = app.snapshot
        if snap is None:
            return
        panel, engine = self.query_one(EnginePanel), snap.engine(self.selected_name)
        title = panel.query_one("#engine-title", Static)
        if engine is None:
            section = snap.section(self.selected_host)
            if section is not None:  # a host row: the panel shows that host
                panel.show(None, section.host)
                title.update(host_title(section), layout=False)
        elif (why := snap.unreachable(engine)) is not None:
            title.update(
                Text.assemble((engine.name, "bold"), f"  ·  {engine.state_text} when last seen  ·  ", (why, "red")),
                layout=False,
            )

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        self.selection_moved()

    async def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        if self.selected_name is not None:
            await self.app.run_action("show_detail")
