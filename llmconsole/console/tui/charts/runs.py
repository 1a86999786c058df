"""The sweep's and the tune's charts, drawn as their points arrive.

- sweep: throughput against p99 end-to-end latency, one point per measured grid point, its
  repeats' spread as a bar, the Pareto front and the knee (the CLI's own analysis), and the
  SLO's p99 end-to-end limit as a line;
- tune: each trial's goodput against its number and the best so far, pruned and infeasible
  trials marked; and one knob of the search against goodput (o steps through the knobs).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llmconsole.console.tui.charts.spec import COLOURS, ChartSpec, Series, nice_max
from llmconsole.engine.sweep.plan import PointResult, SweepPlan
from llmconsole.engine.sweep.report import tradeoff_points
from llmconsole.engine.sweep.tradeoff import knee, pareto_front
from llmconsole.engine.tune.space import TrialOutcome


def sweep_chart(plan: SweepPlan, points: Sequence[PointResult]) -> ChartSpec:
    title = "throughput against p99 latency"
    pts = [
        (i, p)
        for i, p in enumerate(points)
        if p.measured and p.p99_e2e_ms is not None and p.throughput_req_s is not None
    ]
    limit = plan.slo.as_dict().get("p99_e2e_ms")
    if not pts:
        return ChartSpec(title, (), "req/s", "p99 end-to-end (ms)", empty="no point measured yet")
    lat = {i: float(p.p99_e2e_ms or 0.0) for i, p in pts}
    thr = {i: float(p.throughput_req_s or 0.0) for i, p in pts}
    analysed = tradeoff_points(tuple(points))
    front = [i for i in pareto_front(analysed) if i in lat]
    front.sort(key=lambda i: lat[i])
    k = knee(analysed, plan.knee_threshold, plan.knee_units).index
    x_lo, x_top, slo_inside = latency_axis(list(lat.values()), limit)
    y_top = nice_max(max(thr.values()) * 1.15)
    series: list[Series] = []
    if len(front) > 1:
        series.append(
            Series("Pareto front", tuple(lat[i] for i in front), tuple(thr[i] for i in front), COLOURS["front"])
        )
    spread = [(i, (p.spread.get("throughput_req_s") or 0.0) * thr[i]) for i, p in pts if p.repeats > 1]
    if any(e > 0 for _, e in spread):
        series.append(
            Series(
                f"spread of {plan.repeats} repeats",
                tuple(lat[i] for i, _ in spread),
                tuple(thr[i] for i, _ in spread),
                COLOURS["points"],
                kind="errorbars",
                err=tuple(e for _, e in spread),
                glyph="┼",
            )
        )
    series.append(
        Series(
            "points (req/s at p99 ms)",
            tuple(lat.values()),
            tuple(thr.values()),
            COLOURS["points"],
            kind="points",
            marker="•",
            glyph="•",
        )
    )
    if k is not None and k in lat:
        series.append(
            Series(
                f"knee: {points[k].label}", (lat[k],), (thr[k],), COLOURS["knee"], kind="points", marker="◆", glyph="◆"
            )
        )
    if limit is not None and slo_inside:
        series.append(Series(f"SLO p99 e2e {limit:,g} ms", (limit, limit), (0.0, y_top), COLOURS["slo"], glyph="│"))
    elif limit is not None:  # far off the data: at the edge it lies beyond, with its value
        right = limit > x_top
        edge = x_top - (x_top - x_lo) * 0.01 if right else x_lo + (x_top - x_lo) * 0.01
        arrow = "→" if right else "←"
        label = f"SLO p99 e2e {limit:,g} ms {arrow}" if right else f"{arrow} SLO p99 e2e {limit:,g} ms"
        ys = tuple(y_top * f for f in (0.2, 0.4, 0.6, 0.8))
        series.append(Series(label, (edge,) * len(ys), ys, COLOURS["slo"], kind="points", marker=arrow, glyph=arrow))
    else:
        series.append(Series("no p99 end-to-end SLO given", (), (), COLOURS["slo"], glyph=" "))
    return ChartSpec(title, tuple(series), "req/s", "p99 end-to-end (ms)", x_lim=(x_lo, x_top), y_lim=(0.0, y_top))


# A reference line (the SLO) up to this many times the data's span beyond it stretches the axis
# to show it; farther, it is drawn at the edge with its value, and the points keep the width.
REFERENCE_STRETCH = 0.5


def latency_axis(values: Sequence[float], limit: float | None) -> tuple[float, float, bool]:
    """The x axis (low, high) for the points' latencies, and whether the SLO line is on it.

    The axis starts at 0 where the points lie near it (a latency is read against 0), else a
    little below the lowest point, so close points do not share one column; it stops a little
    past the highest. The SLO joins when it lies within half the axis' span of it."""
    lo, hi = min(values), max(values)
    span = max(hi - lo, hi * 0.1, 1.0)
    x_lo = 0.0 if lo <= span else lo - span * 0.15
    x_hi = hi + span * 0.15
    inside = False
    if limit is not None:
        if x_lo <= limit <= x_hi:
            inside = True
        elif x_hi < limit <= x_hi + (x_hi - x_lo) * REFERENCE_STRETCH:
            inside, x_hi = True, limit + span * 0.05
        elif x_lo - (x_hi - x_lo) * REFERENCE_STRETCH <= limit < x_lo:
            inside, x_lo = True, max(0.0, limit - span * 0.05)
    x_top = nice_max(x_hi) if x_lo == 0 else x_hi
    return x_lo, x_top, inside


def _marks(trials: Sequence[TrialOutcome], x_of: Any) -> list[Series]:
    """Complete trials as dots; pruned ones (stopped early: the goodput of their short run) and
    infeasible ones (did not start, failed requests, missed the SLO: drawn at 0) as crosses."""
    out = []
    for state, label, colour, marker in (
        ("complete", "trial (req/s)", COLOURS["complete"], "•"),
        ("pruned", "pruned early", COLOURS["pruned"], "x"),
        ("infeasible", "infeasible (at 0)", COLOURS["failed"], "x"),
    ):
        chosen = [t for t in trials if t.state == state and x_of(t) is not None]
        if chosen:
            out.append(
                Series(
                    label,
                    tuple(x_of(t) for t in chosen),
                    tuple(t.goodput_req_s or 0.0 for t in chosen),
                    colour,
                    kind="points",
                    marker=marker,
                    glyph=marker,
                )
            )
    return out


def tune_chart(trials: Sequence[TrialOutcome]) -> ChartSpec:
    title = "goodput per trial"
    done = [t for t in trials if t.state not in ("running", "interrupted")]
    if not done:
        return ChartSpec(title, (), "req/s", "trial", empty="no trial finished yet")
    best: list[float | None] = []
    top: float | None = None
    for t in done:
        if t.state == "complete" and t.goodput_req_s is not None:
            top = max(top or 0.0, t.goodput_req_s)
        best.append(top)
    xs = [float(t.number) for t in done]
    step_x, step_y = [], []
    for i, (x, y) in enumerate(zip(xs, best, strict=True)):  # a staircase: best so far holds until beaten
        if i:
            step_x.append(x)
            step_y.append(best[i - 1])
        step_x.append(x)
        step_y.append(y)
    series = [
        Series("best so far", tuple(step_x), tuple(step_y), COLOURS["best"]),  # under the marks
        *_marks(done, lambda t: float(t.number)),
    ]
    y_top = nice_max(max([t.goodput_req_s or 0.0 for t in done] + [0.1]) * 1.15)
    lo, hi = min(xs), max(xs)
    return ChartSpec(
        title,
        tuple(series),
        "req/s",
        "trial",
        x_lim=(lo - 0.5, hi + 0.5),
        y_lim=(0.0, y_top),
        x_ticks=tuple((float(n), str(n)) for n in range(int(lo), int(hi) + 1)),
    )


def knobs_of(trials: Sequence[TrialOutcome]) -> list[str]:
    seen: dict[str, None] = {}
    for t in trials:
        seen.update(dict.fromkeys(t.params))
    return list(seen)


def knob_chart(trials: Sequence[TrialOutcome], knob: str | None) -> ChartSpec:
    title = f"goodput against {knob}" if knob else "goodput against a knob"
    done = [t for t in trials if t.state not in ("running", "interrupted") and knob in t.params]
    if knob is None or not done:
        return ChartSpec(title, (), "req/s", knob or "knob", empty="no trial finished yet")
    values = [t.params[knob] for t in done]
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    ticks: tuple[tuple[float, str], ...] = ()
    if numeric:

        def x_of(t: TrialOutcome) -> float:
            return float(t.params[knob])

        xs = [float(v) for v in values]
        pad = max(0.5, (max(xs) - min(xs)) * 0.05)
        x_lim = (min(xs) - pad, max(xs) + pad)
    else:  # a list knob (kernel=stock,custom): its values side by side
        names = list(dict.fromkeys(str(v) for v in values))

        def x_of(t: TrialOutcome) -> float:
            return float(names.index(str(t.params[knob])))

        x_lim, ticks = (-0.5, len(names) - 0.5), tuple((float(i), n) for i, n in enumerate(names))
    y_top = nice_max(max([t.goodput_req_s or 0.0 for t in done] + [0.1]) * 1.15)
    knob_label = f"{knob} (o: next knob)"
    return ChartSpec(
        title, tuple(_marks(done, x_of)), "req/s", knob_label, x_lim=x_lim, y_lim=(0.0, y_top), x_ticks=ticks
    )
