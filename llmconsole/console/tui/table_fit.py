"""A run's table fitted to the width it has, least important columns going first.

A DataTable wider than its box cuts its right-hand columns, whichever they are: at 160 columns
the sweep's table sits beside its chart in half the screen and lost latency. So a table is
fitted before it is shown: shorter headers first, then the columns the operator needs least
are left out (the notes say which), and last the free-text columns are cut with an ellipsis.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from textual.widgets import DataTable

SIDE_BY_SIDE = 150  # screen columns from which a run screen's charts sit beside its table
CELL_PADDING = 2  # DataTable pads each cell by one column on either side
MIN_CUT_WIDTH = 12  # a cut cell keeps at least this much: enough to tell rows apart


@dataclass(frozen=True)
class FittedTable:
    headers: tuple[str, ...]
    rows: list[list[str]]
    hidden: tuple[str, ...]  # the full headers of the columns left out


def _width(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> int:
    return sum(max([len(h), *(len(r[i]) for r in rows)]) + CELL_PADDING for i, h in enumerate(headers))


def fit_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[str]],
    width: int,
    *,
    short: Mapping[str, str] | None = None,
    drop: Sequence[str] = (),
    cut: Sequence[str] = (),
) -> FittedTable:
    """`headers` and `rows` within `width` columns: `short` headers where the full ones do not
    fit, then the `drop` columns left out in that order, then the `cut` columns' cells shortened
    (their header never below its own length). A table that fits is returned as it is."""
    full = list(headers)
    heads = list(headers)
    body = [list(r) for r in rows]
    if _width(heads, body) <= width:
        return FittedTable(tuple(heads), body, ())
    heads = [(short or {}).get(h, h) for h in heads]
    hidden: list[str] = []
    for name in drop:
        if _width(heads, body) <= width:
            break
        if name in full:
            i = full.index(name)
            del full[i], heads[i]
            for r in body:
                del r[i]
            hidden.append(name)
    # The free-text columns share the cut: the widest loses a column at a time, none below
    # its header or MIN_CUT_WIDTH, so a long reason and long params both keep their start.
    limits = {full.index(n): max(len(heads[full.index(n)]), MIN_CUT_WIDTH) for n in cut if n in full}
    widths = {i: max([len(heads[i]), *(len(r[i]) for r in body)]) for i in limits}
    over = _width(heads, body) - width
    while over > 0:
        room = [i for i in widths if widths[i] > limits[i]]
        if not room:
            break
        widest = max(room, key=lambda i: widths[i])
        widths[widest] -= 1
        over -= 1
    for i, keep in widths.items():
        for r in body:
            if len(r[i]) > keep:
                r[i] = r[i][: keep - 1] + "…"
    return FittedTable(tuple(heads), body, tuple(hidden))


class FittedTableScreen:
    """What a run screen needs to show its `#run-table` fitted (mixed into RunScreen): how its
    table gives way, and the last table given, to fit again on a resize."""

    TABLE_SHORT: Mapping[str, str] = {}
    TABLE_DROP: tuple[str, ...] = ()
    TABLE_CUT: tuple[str, ...] = ()
    _table: tuple[tuple[str, ...], list[list[str]]] | None = None

    def table_width(self) -> int:
        """The columns the table has: half the screen beside the charts, else all of it (less
        the scrollbar)."""
        me: Any = self
        width = int(me.size.width or me.app.size.width)
        return max(40, (width // 2 if width >= SIDE_BY_SIDE else width) - 2)

    def set_table(self, headers: Sequence[str], rows: Sequence[Sequence[str]]) -> tuple[str, ...]:
        """Show the table fitted to its width; the headers of the columns left out."""
        self._table = (tuple(headers), [list(r) for r in rows])
        fitted = fit_table(
            headers, rows, self.table_width(), short=self.TABLE_SHORT, drop=self.TABLE_DROP, cut=self.TABLE_CUT
        )
        me: Any = self
        t = me.query_one("#run-table", DataTable)
        if tuple(str(c.label) for c in t.columns.values()) != fitted.headers:
            t.clear(columns=True)
            for i, h in enumerate(fitted.headers):
                t.add_column(h, key=str(i))
        t.clear()
        for r in fitted.rows:
            t.add_row(*r)
        return fitted.hidden

    def refit_table(self) -> None:
        if self._table is not None:
            self.set_table(*self._table)
