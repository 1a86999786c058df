"""An engine's recent history from the store, for the console's charts:

  GET /v1/engines/{name}/samples   ?since_s=900 (how far back, in seconds; at most an hour, the
                                   span the store keeps at 1 s) &points=600 (at most this many
                                   per series: longer spans are averaged into equal bins)

  {"engine", "now_s", "since_s", "bin_s",
   "metrics": {"at_s": [...], "kv_cache_usage": [...], "waiting": [...], ...,
               "p99_e2e_s": [...], "p99_e2e_lower_s": [...], "p99_e2e_upper_s": [...], ...},
   "window": {"group", "at_s": [...], "window": [...], "target_ms": [...], "measured_ms": [...]}}

Series are columns, oldest first, null where the figure was missing (an idle engine has no p99).
A p99 comes from a vLLM histogram: each bin keeps its worst (`p99_ttft_s`, histogram_quantile's
interpolation, for machines) and the bucket that one fell in, `p99_ttft_lower_s` and
`p99_ttft_upper_s` (upper null past the last finite bound; both null where the store has no
bucket for it, samples from before it kept them). What a person reads is the bucket: a chart
plots the upper bound, labelled so, never the interpolation. "window" is null when the engine
has no gateway group; the controller's idle ticks are not kept in the store, so its series has
gaps where nothing was measured. 404 for an unknown engine, 503 for a daemon without a history
database.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from llmconsole.daemon.context import DaemonContext, context_of
from llmconsole.daemon.http import error_response
from llmconsole.db import MetricSample
from llmconsole.db.schema import bound_fields
from llmconsole.engine.metrics.percentile import worst

MAX_SINCE_S = 3600.0
METRIC_SERIES = ("running", "waiting", "kv_cache_usage", "generation_tok_s", "prompt_tok_s")
P99_SERIES = ("p99_ttft_s", "p99_e2e_s", "p99_tpot_s")
WINDOW_SERIES = (("window", "window"), ("target_ms", "target"), ("measured_ms", "measured"))


def bins(at_s: Sequence[float], start_s: float, bin_s: float) -> list[list[int]]:
    """The rows (oldest first) falling in each bin of `bin_s` from `start_s`; a row each for 0."""
    if bin_s <= 0:
        return [[row] for row in range(len(at_s))]
    order: dict[int, list[int]] = {}
    for row, t in enumerate(at_s):
        order.setdefault(int(math.floor((t - start_s) / bin_s)), []).append(row)
    return list(order.values())


def binned(
    at_s: Sequence[float],
    columns: dict[str, list[float | None]],
    start_s: float,
    bin_s: float,
) -> tuple[list[float], dict[str, list[float | None]]]:
    """Rows averaged into bins of `bin_s` from `start_s`: each bin's mean time and, per column, the
    mean of its non-null values (null where it has none)."""
    if bin_s <= 0 or not at_s:
        return list(at_s), columns
    groups = bins(at_s, start_s, bin_s)
    times = [sum(at_s[r] for r in rows) / len(rows) for rows in groups]
    out: dict[str, list[float | None]] = {}
    for name, values in columns.items():
        col: list[float | None] = []
        for rows in groups:
            got = [v for r in rows if (v := values[r]) is not None]
            col.append(sum(got) / len(got) if got else None)
        out[name] = col
    return times, out


def worst_p99(rows: Sequence[MetricSample], groups: Sequence[Sequence[int]]) -> dict[str, list[float | None]]:
    """Per p99 series and bin: the bin's worst figure (as compaction keeps a minute's) and the
    bounds of the histogram bucket it fell in; null bounds where any of the bin's figures has none
    recorded, since then nothing honest can be said of the bucket."""
    out: dict[str, list[float | None]] = {}
    for field in P99_SERIES:
        lower_name, upper_name = bound_fields(field)
        value_col: list[float | None] = []
        lower_col: list[float | None] = []
        upper_col: list[float | None] = []
        for group in groups:
            got = [p for r in group if (p := rows[r].percentile(field)) is not None]
            top = (
                worst(got)
                if all(rows[r].bounds_recorded(field) for r in group if getattr(rows[r], field) is not None)
                else None
            )
            value_col.append(max((p.value_s for p in got), default=None))
            lower_col.append(top.lower_s if top is not None else None)
            upper_col.append(top.upper_bound_s if top is not None else None)
        out |= {field: value_col, lower_name: lower_col, upper_name: upper_col}
    return out


def history(ctx: DaemonContext, name: str, since_s: float, points: int, now_s: float) -> dict[str, Any]:
    """What the route answers (blocking: the store is read in a worker thread)."""
    store = ctx.need_store()
    start = now_s - since_s
    bin_s = since_s / points if since_s / points > 1.0 else 0.0  # the store keeps 1 s: no bins below it
    rows = store.metric_samples(name, since_s=start, until_s=now_s)
    at, cols = binned([r.at_s for r in rows], {k: [getattr(r, k) for r in rows] for k in METRIC_SERIES}, start, bin_s)
    cols |= worst_p99(rows, bins([r.at_s for r in rows], start, bin_s))
    window = None
    group = ctx.gateway.group_of(name) if ctx.gateway is not None else None
    if group is not None:
        trace = store.window_trace(group.name, since_s=start, until_s=now_s)
        w_at, w_cols = binned(
            [t.at_s for t in trace],
            {key: [getattr(t, column) for t in trace] for key, column in WINDOW_SERIES},
            start,
            bin_s,
        )
        window = {"group": group.name, "signal": str(group.controller.settings.signal), "at_s": w_at, **w_cols}
    return {
        "engine": name,
        "now_s": now_s,
        "since_s": since_s,
        "bin_s": bin_s,
        "metrics": {"at_s": at, **cols},
        "window": window,
    }


async def get_samples(request: web.Request) -> web.Response:
    ctx = context_of(request)
    name = request.match_info["name"]
    ctx.fleet.get(name)  # 404 for an engine the daemon does not know
    try:
        since_s = float(request.query.get("since_s", 900))
        points = int(request.query.get("points", 600))
    except ValueError:
        return error_response(400, "since_s must be a number of seconds and points a whole number")
    if not (0 < since_s <= MAX_SINCE_S) or points < 1:
        return error_response(400, f"since_s must be in (0, {MAX_SINCE_S:.0f}] and points at least 1")
    return web.json_response(await asyncio.to_thread(history, ctx, name, since_s, points, time.time()))


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/engines/{name}/samples", get_samples)
