"""Time series: engines' metric samples and the batch-window controller's ticks, and their
compaction. They arrive every second, so they commit without an fsync (see database.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from operator import attrgetter
from typing import Any, TypeVar, cast

from sqlalchemy import select
from sqlmodel import col

from llmconsole.db import compaction
from llmconsole.db.compaction import Retention
from llmconsole.db.database import StorePart, driver, now
from llmconsole.db.records import CompactionResult, MetricSample, WindowSample
from llmconsole.db.schema import METRIC_FIELDS, WINDOW_FIELDS, MetricSampleRow, WindowTraceRow

_SAMPLE_COLUMNS = ("engine", "at_s", "resolution_s", *METRIC_FIELDS)
_WINDOW_COLUMNS = ("group_name", "at_s", *WINDOW_FIELDS)
_sample_values: Callable[[MetricSample], tuple[Any, ...]] = attrgetter(*_SAMPLE_COLUMNS)
_window_values: Callable[[WindowSample], tuple[Any, ...]] = attrgetter(*_WINDOW_COLUMNS)

_R = TypeVar("_R", MetricSample, WindowSample)


class Series(StorePart):
    retention: Retention

    def add_metric_samples(self, rows: Iterable[MetricSample | Mapping[str, Any]]) -> int:
        """Insert a batch of samples in one transaction; a repeated (engine, at_s) replaces."""
        values = [_row_values(r, MetricSample, _sample_values, _SAMPLE_COLUMNS) for r in rows]
        if not values:
            return 0
        names = ", ".join(_SAMPLE_COLUMNS)
        marks = ", ".join("?" * len(_SAMPLE_COLUMNS))
        with self._write(durable=False) as conn:
            driver(conn).executemany(f"INSERT OR REPLACE INTO metric_samples ({names}) VALUES ({marks})", values)
        return len(values)

    def metric_samples(
        self, engine: str | None = None, *, since_s: float | None = None, until_s: float | None = None
    ) -> list[MetricSample]:
        q = select(MetricSampleRow).order_by(col(MetricSampleRow.engine), col(MetricSampleRow.at_s))
        if engine is not None:
            q = q.where(col(MetricSampleRow.engine) == engine)
        if since_s is not None:
            q = q.where(col(MetricSampleRow.at_s) >= since_s)
        if until_s is not None:
            q = q.where(col(MetricSampleRow.at_s) <= until_s)
        with self._read() as conn:
            return [MetricSample(**r._mapping) for r in conn.execute(q)]

    def add_window_trace(self, rows: Iterable[WindowSample | Mapping[str, Any]]) -> int:
        values = [_row_values(r, WindowSample, _window_values, _WINDOW_COLUMNS) for r in rows]
        if not values:
            return 0
        names = ", ".join(f'"{c}"' for c in _WINDOW_COLUMNS)
        marks = ", ".join("?" * len(_WINDOW_COLUMNS))
        with self._write(durable=False) as conn:
            driver(conn).executemany(f"INSERT OR REPLACE INTO window_trace ({names}) VALUES ({marks})", values)
        return len(values)

    def window_trace(
        self, group_name: str | None = None, *, since_s: float | None = None, until_s: float | None = None
    ) -> list[WindowSample]:
        q = select(WindowTraceRow).order_by(col(WindowTraceRow.group_name), col(WindowTraceRow.at_s))
        if group_name is not None:
            q = q.where(col(WindowTraceRow.group_name) == group_name)
        if since_s is not None:
            q = q.where(col(WindowTraceRow.at_s) >= since_s)
        if until_s is not None:
            q = q.where(col(WindowTraceRow.at_s) <= until_s)
        with self._read() as conn:
            return [WindowSample(**r._mapping) for r in conn.execute(q)]

    def compact(self, now_s: float | None = None) -> CompactionResult:
        """Apply the retention settings; run it every few minutes from the recorder."""
        with self._write(durable=False) as conn:
            return compaction.compact(driver(conn), self.retention, now(now_s))


def _row_values(
    row: _R | Mapping[str, Any], record_cls: type[_R], getter: Callable[[_R], tuple[Any, ...]], columns: tuple[str, ...]
) -> tuple[Any, ...]:
    if isinstance(row, record_cls):
        return getter(row)
    # Not a record, so a mapping: mypy does not narrow a union by isinstance on a TypeVar class.
    fields = cast(Mapping[str, Any], row)
    unknown = set(fields) - set(columns)
    if unknown:
        raise TypeError(f"unknown {record_cls.__name__} fields: {', '.join(sorted(unknown))}")
    values: tuple[Any, ...] = tuple(fields.get(c) for c in columns)
    if record_cls is MetricSample and values[2] is None:
        values = (*values[:2], 1.0, *values[3:])  # resolution_s defaults as in the record
    return values
