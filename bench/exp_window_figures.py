"""The window experiment's figures, from the gateway's own records: what bench/exp_window.py
prints for every configuration, static or controlled, measured the same way.

Every latency counts for the moment its request was dispatched to the engine, because that is
the window it ran under; rates count requests by when they finished.
"""

from __future__ import annotations

import collections
import statistics

WITHIN = 0.10  # the band: p99 within 10% of the target
MIN_ROLL_SAMPLES = 50  # fewer requests in a rolling span: its p99 is their slowest, no evidence either way


def pct(values: list[float], p: float) -> float | None:
    """Nearest-rank percentile, as the controller computes it."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-p * len(ordered) // 100))
    return ordered[int(rank) - 1]


def dispatched_ttfts(gw_records: list[dict]) -> list[tuple[float, float]]:
    """(dispatch time, engine TTFT in ms) of every request that streamed its first token."""
    out = []
    for r in gw_records:
        if r["outcome"] == "ok" and r["engine_ttft_s"] is not None and r["engine_e2e_s"] is not None:
            out.append((r["at_mono_s"] - r["engine_e2e_s"], r["engine_ttft_s"] * 1000.0))
    return out


def rolling_p99_ms(
    ttfts: list[tuple[float, float]], step_at: float, end: float, roll_s: float
) -> list[tuple[float, float | None]]:
    """(seconds after the step, p99 TTFT of the requests dispatched in the `roll_s` before), one
    point a second. Only requests sent after the step count, so the low phase never flatters the
    first points; a span with too few requests gives None."""
    points = []
    t = 1.0
    while step_at + t <= end + 1e-9:
        lo, hi = max(step_at, step_at + t - roll_s), step_at + t
        values = [v for d, v in ttfts if lo <= d < hi]
        points.append((t, pct(values, 99) if len(values) >= MIN_ROLL_SAMPLES else None))
        t += 1.0
    return points


def settling(points: list[tuple[float, float | None]], target_ms: float) -> float | None:
    """Seconds from the step until the rolling p99 is within 10% of the target and stays there to
    the end of the phase; None when the last point is outside (it never settled)."""
    settled_at = None
    for t, v in points:
        inside = v is not None and abs(v - target_ms) <= WITHIN * target_ms
        if inside and settled_at is None:
            settled_at = t
        elif not inside:
            settled_at = None
    return settled_at


def figures(
    client, gw_records, trace, step_at: float, end: float, settle_s: float, roll_s: float, target_ms: float
) -> dict:
    lo = step_at + settle_s
    span_s = max(1e-9, end - lo)
    ttfts = dispatched_ttfts(gw_records)
    settled = [v for d, v in ttfts if lo <= d <= end]
    ok = [r for r in gw_records if r["outcome"] == "ok" and r["engine_ttft_s"] is not None]
    arrived = [r for r in ok if lo <= r["at_mono_s"] - r["e2e_s"] <= end]
    finished = [r for r in ok if lo <= r["at_mono_s"] <= end]
    met = [r for r in finished if r["engine_ttft_s"] * 1000 <= target_ms]
    points = rolling_p99_ms(ttfts, step_at, end, roll_s)
    after_settle = [v for t, v in points if t >= settle_s]
    f = {
        "p99_engine_ttft_ms": pct(settled, 99),
        "p99_client_ttft_ms": pct([r["ttft_s"] * 1000 for r in arrived], 99),
        "tok_s": sum(r["output_chunks"] for r in finished) / span_s,
        "req_s": len(finished) / span_s,
        "goodput_req_s": len(met) / span_s,
        "goodput_tok_s": sum(r["output_chunks"] for r in met) / span_s,
        "errors": sum(1 for r in client if r.status != 200),
        "settle_s": settling(points, target_ms),
        "share_within": (
            sum(1 for v in after_settle if v is not None and abs(v - target_ms) <= WITHIN * target_ms)
            / len(after_settle)
        )
        if after_settle
        else None,
        "rolling": points,
    }
    if trace:
        after = [t for t in trace if step_at <= t["at_mono_s"] <= end]
        steady = [t["window"] for t in after if t["at_mono_s"] >= lo]
        f.update(
            window_settled=statistics.median(steady) if steady else None,
            window_range=(min(steady), max(steady)) if steady else None,
            actions_after_step=dict(collections.Counter(t["action"] for t in after)),
            trace_after_step=[
                (
                    round(t["at_mono_s"] - step_at),
                    t["window"],
                    None if t["measured_ms"] is None else round(t["measured_ms"]),
                    t["samples"],
                    t["action"],
                )
                for t in after
            ],
        )
    return f
