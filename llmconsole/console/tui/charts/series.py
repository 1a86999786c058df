"""The charts' memory: each engine's figures and its batch window's steps over the last hour.

Two sources fill it. Each poll adds one point per engine whose daemon scrape is newer than the
last one kept (so polling faster than the daemon scrapes adds nothing), timed by the daemon's
own clock (`Snapshot.time_s`), and the controller steps the status carries (the newest 60, each
with its wall-clock time). When an engine is first shown, the daemon's stored history
(GET /v1/engines/{name}/samples) fills in what came before the first live point and in gaps. Everything is
bounded to SPAN_S and updated on the UI thread only.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any

from llmconsole.console.tui.views.status import EngineView, Snapshot

SPAN_S = 3600.0
# A p99 is kept as the top of the vLLM histogram bucket it fell in (`p99_ttft_upper_s`: the p99
# was at most that), never histogram_quantile's figure inside the bucket, which the data cannot
# tell apart from the rest of it; a chart of it says "at most". Past the last finite bound, or
# from a daemon that sends no bounds, there is no top: a gap.
P99_TOPS = {"p99_ttft_upper_s": "p99_ttft_s", "p99_e2e_upper_s": "p99_e2e_s", "p99_tpot_upper_s": "p99_tpot_s"}
METRICS = ("kv_cache_usage", "waiting", "running", "generation_tok_s", "prompt_tok_s", *P99_TOPS)
STEP_FIELDS = ("window", "target_ms", "measured_ms")

Row = tuple[float | None, ...]


def _live(e: EngineView, key: str) -> float | None:
    """A figure of the engine's status; a p99's bucket top from the window's percentile_bounds."""
    field = P99_TOPS.get(key)
    if field is None:
        return e.metric(key)
    bounds = e.metrics.percentile_bounds.get(field) if e.metrics is not None else None
    top = bounds[1] if isinstance(bounds, (list, tuple)) and len(bounds) == 2 else None
    return float(top) if isinstance(top, (int, float)) and e.metric(field) is not None else None


class Timeline:
    """Rows of figures by time, oldest first; a row at or before the newest one is not added twice."""

    def __init__(self, fields: Sequence[str]) -> None:
        self.fields = tuple(fields)
        self.t: list[float] = []
        self.rows: list[Row] = []

    def add(self, t: float, row: Row) -> bool:
        if self.t and t <= self.t[-1]:
            return False
        self.t.append(t)
        self.rows.append(row)
        return True

    def fill(self, t: Sequence[float], rows: Sequence[Row]) -> None:
        """Stored history where this console has none: before its first poll, and in the gaps
        between polls (the daemon did not answer, or the console was elsewhere); live rows win."""
        live = list(zip(self.t, self.rows, strict=True))
        stored = [(a, r) for a, r in zip(t, rows, strict=True) if not self._near(a)]
        merged = sorted(live + stored, key=lambda x: x[0])
        self.t = [a for a, _ in merged]
        self.rows = [r for _, r in merged]

    def _near(self, at: float, within_s: float = 1.5) -> bool:
        i = bisect.bisect_left(self.t, at)
        return any(0 <= j < len(self.t) and abs(self.t[j] - at) < within_s for j in (i - 1, i))

    def trim(self, now_s: float) -> None:
        cut = bisect.bisect_left(self.t, now_s - SPAN_S)
        if cut:
            del self.t[:cut], self.rows[:cut]

    def column(self, name: str, since_s: float) -> tuple[list[float], list[float | None]]:
        i = self.fields.index(name)
        start = bisect.bisect_left(self.t, since_s)
        return self.t[start:], [r[i] for r in self.rows[start:]]

    @property
    def newest_s(self) -> float | None:
        return self.t[-1] if self.t else None


class EngineHistory:
    def __init__(self) -> None:
        self.metrics = Timeline(METRICS)
        self.steps = Timeline(STEP_FIELDS)
        self.last_scrape: float | None = None
        self.filled_s = 0.0  # how far back the daemon's stored history was asked for


class SeriesHistory:
    def __init__(self) -> None:
        self.engines: dict[str, EngineHistory] = {}
        self.now_s: float | None = None  # the daemon's clock at the newest poll

    def of(self, name: str) -> EngineHistory:
        return self.engines.setdefault(name, EngineHistory())

    def add(self, snapshot: Snapshot) -> None:
        now = snapshot.time_s
        if now is not None:
            self.now_s = now
        for e in snapshot.engines:
            h = self.of(e.name)
            taken = e.metrics_taken_at_s
            if now is not None and taken is not None and not e.metrics_stale and taken != h.last_scrape:
                h.last_scrape = taken
                h.metrics.add(now, tuple(_live(e, k) for k in METRICS))
            if e.controller is not None:
                for at, window, target, measured in e.controller.steps:
                    h.steps.add(at, (float(window), target, measured))
            if now is not None:
                h.metrics.trim(now)
                h.steps.trim(now)
        for gone in set(self.engines) - {e.name for e in snapshot.engines}:
            del self.engines[gone]

    def wants_fill(self, name: str, range_s: float) -> bool:
        """Whether the daemon should be asked for `name`'s stored history over `range_s`."""
        h = self.engines.get(name)
        return h is not None and h.filled_s < range_s

    def fill(self, name: str, answer: Mapping[str, Any], range_s: float) -> None:
        """Merge the daemon's answer to GET /v1/engines/{name}/samples (columns, oldest first)."""
        h = self.of(name)
        h.filled_s = max(h.filled_s, range_s)
        m = answer.get("metrics") or {}
        t = [float(x) for x in m.get("at_s") or ()]
        cols = [list(m.get(k) or [None] * len(t)) for k in METRICS]
        h.metrics.fill(t, [tuple(c[i] for c in cols) for i in range(len(t))])
        w = answer.get("window") or {}
        wt = [float(x) for x in w.get("at_s") or ()]
        wcols = [list(w.get(k) or [None] * len(wt)) for k in STEP_FIELDS]
        h.steps.fill(wt, [tuple(c[i] for c in wcols) for i in range(len(wt))])

    def series(self, name: str, key: str, since_s: float = 0.0) -> tuple[list[float], list[float | None]]:
        h = self.engines.get(name)
        if h is None:
            return [], []
        line = h.metrics if key in METRICS else h.steps
        return line.column(key, since_s)
