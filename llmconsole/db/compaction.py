"""Retention of time series: full resolution for the last hour, minutes for a week, then gone.

Only series shrink: configs, runs, actions, alerts, sessions and sweeps are the history that
rollbacks and exports are made from, and they are small, so they are always kept.
"""

from __future__ import annotations

import math
import sqlite3
from dataclasses import dataclass

from llmconsole.db.records import CompactionResult
from llmconsole.db.schema import METRIC_FIELDS, PERCENTILE_FIELDS, bound_fields

DAY_S = 86_400.0

# Gauges whose spikes are the point (a p99, how full the KV cache got) keep the worst value of
# a bucket; averaging them would hide exactly what an operator looks back for.
_MAX_FIELDS = frozenset(f for f in METRIC_FIELDS if f.startswith("p99_") or f == "kv_cache_usage")
_INT_FIELDS = frozenset(f for f in METRIC_FIELDS if f.endswith("_bytes"))
# A percentile's histogram-bucket bounds, by the column they bound.
_BOUNDS = {b: f for f in PERCENTILE_FIELDS for b in bound_fields(f)}


@dataclass(frozen=True)
class Retention:
    full_resolution_s: float = 3600.0  # samples younger than this are kept as recorded
    downsample_to_s: float = 60.0  # older ones become one row per engine per this many seconds
    keep_samples_s: float = 7 * DAY_S  # metric samples older than this are deleted
    keep_trace_s: float = 1 * DAY_S  # batch-window controller ticks older than this are deleted

    def __post_init__(self) -> None:
        if not (self.downsample_to_s > 0 and self.full_resolution_s >= 0):
            raise ValueError("downsample_to_s must be > 0 and full_resolution_s >= 0")
        if self.keep_samples_s < self.full_resolution_s:
            raise ValueError("keep_samples_s must be at least full_resolution_s")


def _bound_aggregate(column: str) -> str:
    """The bounds of a time bucket's folded percentile, honest for the value kept beside them.

    Every sample's figure lies in its own histogram bucket [lower, upper]. The worst figure of
    the time bucket (a p99: MAX) lies in [MAX(lower), MAX(upper)], and with one bucket layout
    that is exactly the bucket it fell in; a mean (a p50: AVG) lies between the least and the
    greatest figure, so in [MIN(lower), MAX(upper)]. An upper NULL is +Inf (past the last finite
    bound), so it wins MAX. One sample with a figure but no recorded bounds makes the folded
    bounds unknown (NULL) too: nothing tighter can be said for it.
    """
    field = _BOUNDS[column]
    lower, upper = bound_fields(field)
    known = f"COUNT({lower}) = COUNT({field})"
    if column == lower:
        fn = "MAX" if field in _MAX_FIELDS else "MIN"
        return f"CASE WHEN {known} THEN {fn}({lower}) END"
    return f"CASE WHEN {known} AND COUNT({upper}) = COUNT({lower}) THEN MAX({upper}) END"


def _aggregate(field: str) -> str:
    if field in _BOUNDS:
        return _bound_aggregate(field)
    fn = "MAX" if field in _MAX_FIELDS else "AVG"
    expr = f"{fn}({field})"
    if field in _INT_FIELDS:
        expr = f"CAST(ROUND({expr}) AS INTEGER)"  # NULL stays NULL
    return expr


def compact(conn: sqlite3.Connection, retention: Retention, now_s: float) -> CompactionResult:
    """Downsample and expire series; `conn` must already be inside a write transaction.

    Only whole buckets older than `full_resolution_s` are folded, so a bucket is never split
    between a coarse row and fine rows. A coarse row is stamped with its bucket's start; if a
    bucket already has one (fine rows that arrived late, after it was folded), the existing
    coarse row is kept and the late rows are dropped.
    """
    w = retention.downsample_to_s
    fold_before_s = math.floor((now_s - retention.full_resolution_s) / w) * w
    expire_before_s = now_s - retention.keep_samples_s

    expired = conn.execute("DELETE FROM metric_samples WHERE at_s < ?", (expire_before_s,)).rowcount

    cols = ", ".join(_aggregate(f) for f in METRIC_FIELDS)
    buckets = conn.execute(
        f"SELECT engine, CAST(at_s / :w AS INTEGER) * :w AS bucket_s, {cols} FROM metric_samples "
        "WHERE resolution_s < :w AND at_s < :before GROUP BY engine, bucket_s",
        {"w": w, "before": fold_before_s},
    ).fetchall()
    folded = conn.execute("DELETE FROM metric_samples WHERE resolution_s < ? AND at_s < ?", (w, fold_before_s)).rowcount
    names = ", ".join(METRIC_FIELDS)
    marks = ", ".join("?" * (len(METRIC_FIELDS) + 3))
    before = conn.total_changes
    conn.executemany(
        f"INSERT OR IGNORE INTO metric_samples (engine, at_s, resolution_s, {names}) VALUES ({marks})",
        [(b[0], float(b[1]), w, *b[2:]) for b in buckets],
    )
    written = conn.total_changes - before

    trace_expired = conn.execute("DELETE FROM window_trace WHERE at_s < ?", (now_s - retention.keep_trace_s,)).rowcount
    return CompactionResult(
        raw_rows_downsampled=folded,
        downsampled_rows_written=written,
        samples_expired=expired,
        trace_rows_expired=trace_expired,
    )
