"""A chart on the console: a legend line (title, and a swatch and unit per series) over a plot
drawn by plotext through textual-plotext.

The plot is drawn from a ChartSpec and only when the spec, the size or the theme changed: a
plotext build costs milliseconds of CPU, a comparison of specs microseconds, and the console
must stay under 5% of a core at 1 Hz with four engines.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Static
from textual_plotext import PlotextPlot

from llmconsole.console.tui.charts.spec import ChartSpec, rgb, segments
from llmconsole.console.tui.widgets.panels import pack


def legend(spec: ChartSpec, width: int) -> Text:
    """The title, then a swatch and a label per series; lines break only between entries."""
    parts = [Text(spec.title, style="bold")]
    parts += [Text.assemble((s.glyph, f"bold {s.colour}"), " " + s.label) for s in spec.series if s.label]
    return pack(parts, width, sep="   ")


def draw(plt: Any, spec: ChartSpec) -> None:
    """The spec as plotext calls (plotext has no type information: `plt` is its figure)."""
    for s in spec.series:
        side = "right" if s.right else "left"
        if s.kind == "errorbars":
            pts = [(x, y, e) for x, y, e in zip(s.x, s.y, s.err, strict=True) if y is not None]
            if pts:
                plt.error(
                    [p[0] for p in pts], [p[1] for p in pts], yerr=[p[2] for p in pts], color=rgb(s.colour), yside=side
                )
        elif s.kind == "points":
            xy = [(x, y) for x, y in zip(s.x, s.y, strict=True) if y is not None]
            if xy:
                plt.scatter([p[0] for p in xy], [p[1] for p in xy], color=rgb(s.colour), marker=s.marker, yside=side)
        else:
            for xs, ys in segments(s.x, s.y):
                if len(xs) == 1:
                    plt.scatter(xs, ys, color=rgb(s.colour), marker=s.marker, yside=side)
                else:
                    plt.plot(xs, ys, color=rgb(s.colour), marker=s.marker, yside=side)
    if spec.x_label:
        plt.xlabel(spec.x_label)
    plt.ylabel(spec.y_label)
    if spec.y2_label:
        plt.ylabel(spec.y2_label, yside="right")
    if spec.x_lim:
        plt.xlim(*spec.x_lim)
    if spec.y_lim:
        plt.ylim(*spec.y_lim)
    if spec.y2_lim:
        plt.ylim(*spec.y2_lim, yside="right")
    if spec.x_ticks:
        plt.xticks([t for t, _ in spec.x_ticks], [label for _, label in spec.x_ticks])


class Plot(PlotextPlot):
    """The plot itself: a ChartSpec drawn at the widget's size, kept until something changes."""

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.spec: ChartSpec | None = None
        self._drawn: tuple[object, ...] = ()
        self._text: Text = Text("")
        self.builds = 0  # plotext builds so far (tests and the benchmark count them)

    def set_spec(self, spec: ChartSpec) -> None:
        if spec != self.spec:
            self.spec = spec
            self.refresh()

    def render(self) -> Text:
        spec, (w, h) = self.spec, self.size
        key = (spec, w, h, self.app.theme)
        if key == self._drawn:
            return self._text
        self._drawn = key
        if spec is None or not spec.has_data or w < 12 or h < 4:
            message = "" if spec is None else spec.empty or "no figures yet"
            self._text = Text(message if w >= 12 else "", style="dim", justify="center")
            return self._text
        plt = self._plot
        plt.clear_figure()
        plt.plotsize(w, h)
        plt._set_size(w, h)  # as textual-plotext does: plotsize alone does not always take
        draw(plt, spec)
        plt.theme(self._get_plotext_theme_name(self.app.theme))
        self.builds += 1
        self._text = Text.from_ansi(plt.build(), no_wrap=True, overflow="crop")
        return self._text


class ChartBox(Vertical):
    """Legend over plot. `show` takes a spec; equal specs cost nothing."""

    DEFAULT_CSS = """
    ChartBox { height: 1fr; width: 1fr; }
    ChartBox > .chart-legend { height: auto; max-height: 3; padding: 0 1; }
    ChartBox > Plot { height: 1fr; min-height: 3; }
    """

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self._legend_lines = 0

    def compose(self) -> ComposeResult:
        yield Static(classes="chart-legend")
        yield Plot()

    def show(self, spec: ChartSpec) -> None:
        plot = self.query_one(Plot)
        if spec == plot.spec:
            return
        plot.set_spec(spec)
        self._legend()

    def on_resize(self) -> None:
        self._legend()

    def _legend(self) -> None:
        spec = self.query_one(Plot).spec
        if spec is None:
            return
        text = legend(spec, max(20, self.size.width - 2))
        lines = len(text.plain.splitlines())
        self.query_one(".chart-legend", Static).update(text, layout=lines != self._legend_lines)
        self._legend_lines = lines

    @property
    def plot(self) -> Plot:
        return self.query_one(Plot)
