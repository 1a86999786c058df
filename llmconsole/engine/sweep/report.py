"""A finished sweep as people and programs read it: the operators' table, the Pareto front, the
best point under the SLO, the knee, and results.json / results.csv / report.md with a plot.

The table is the form operators know,
`params | throughput (req/s) | P99 latency (ms) | memory (GiB) | compute util | bandwidth util`
(memory in GiB, as everywhere else in llmconsole),
each figure with its relative change from the previous measured row. A cell nobody could fill
says N/A and points to a note with the reason.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from llmconsole.engine.sweep.plan import PointResult, SweepPlan
from llmconsole.engine.sweep.plot import tradeoff_chart
from llmconsole.engine.sweep.runner import EngineTarget, SweepResult
from llmconsole.engine.sweep.tradeoff import (
    KneePick,
    TradeoffPoint,
    best_under_slo,
    knee,
    pareto_front,
    relative_change,
)

HEADERS = ("params", "throughput (req/s)", "P99 latency (ms)", "memory (GiB)", "compute util", "bandwidth util")


@dataclass(frozen=True)
class Analysis:
    front: tuple[int, ...]  # positions in result.points
    best: int | None
    knee: KneePick

    def label(self, points: tuple[PointResult, ...], pos: int | None) -> str:
        return "none" if pos is None else points[pos].label


def tradeoff_points(points: tuple[PointResult, ...]) -> list[TradeoffPoint]:
    return [
        TradeoffPoint(
            p.throughput_req_s if p.measured else None,
            p.p99_e2e_ms if p.measured else None,
            p.goodput_req_s,
            p.status == "ok",
        )
        for p in points
    ]


def analyse(result: SweepResult) -> Analysis:
    pts = tradeoff_points(result.points)
    return Analysis(
        tuple(pareto_front(pts)), best_under_slo(pts), knee(pts, result.plan.knee_threshold, result.plan.knee_units)
    )


def _pct(x: float | None) -> str | None:
    return None if x is None else f"{x:+.0%}"


def table_rows(result: SweepResult) -> tuple[list[list[str]], list[str]]:
    """The table's cells (strings) and the numbered notes its N/A cells point to."""
    notes: list[str] = []

    def na(reason: str) -> str:
        if reason not in notes:
            notes.append(reason)
        return f"N/A [{notes.index(reason) + 1}]"

    rows, prev = [], None
    for p in result.points:
        if not p.measured:
            why = f"{p.status}: {p.reason or 'no measurement'}"
            rows.append([p.label] + [na(why)] * 5)
            continue
        thr, lat = p.throughput_req_s, p.p99_e2e_ms
        d_thr = relative_change(prev.throughput_req_s, thr) if prev else None
        d_lat = relative_change(prev.p99_e2e_ms, lat) if prev else None
        thr_s = f"{thr:.2f}" + (f" ({_pct(d_thr)})" if d_thr is not None else "")
        lat_s = f"{lat:.0f}" + (f" ({_pct(d_lat)})" if d_lat is not None else "")
        mem = (
            f"{p.memory_bytes / 2**30:.2f}"
            if p.memory_bytes is not None
            else na(f"memory: {p.memory_na_reason or 'not reported'}")
        )
        util_reason = f"utilization: {p.util_na_reason or 'not reported'}"
        comp = f"{p.compute_util:.0%}" if p.compute_util is not None else na(util_reason)
        bw = f"{p.bandwidth_util:.0%}" if p.bandwidth_util is not None else na(util_reason)
        label = p.label + ("" if p.status == "ok" else f" ({p.status})")
        rows.append([label, thr_s, lat_s, mem, comp, bw])
        prev = p
    return rows, notes


def render_table(result: SweepResult, markdown: bool = False) -> str:
    rows, notes = table_rows(result)
    if markdown:
        out = ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
        out += ["| " + " | ".join(r) + " |" for r in rows]
        out += [""] + [f"[{i}] {n}  " for i, n in enumerate(notes, 1)]
        return "\n".join(out)
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(HEADERS)]

    def line(cells: Sequence[str]) -> str:
        return " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    out = [line(HEADERS), "-+-".join("-" * w for w in widths)] + [line(r) for r in rows]
    out += [f"[{i}] {n}" for i, n in enumerate(notes, 1)]
    return "\n".join(out)


def picks_text(result: SweepResult, a: Analysis) -> list[str]:
    pts = result.points
    slo = ", ".join(f"{k}={v:g}" for k, v in result.plan.slo.as_dict().items()) or "none given"
    k = a.knee
    steps = (
        "; ".join(
            f"{pts[s.from_index].label} -> {pts[s.to_index].label}: {s.ratio:.2f}{' (taken)' if s.accepted else ''}"
            for s in k.steps
        )
        or "one point on the front"
    )
    return [
        f"Pareto front (throughput vs p99 end-to-end): {', '.join(pts[i].label for i in a.front) or 'none'}",
        f"best under the SLO ({slo}), max goodput: {a.label(pts, a.best)}",
        f"knee (accept a step while ratio > {k.threshold:g}; ratio = {k.units_text}): {a.label(pts, k.index)}",
        f"knee steps along the front: {steps}",
    ]


def to_json(result: SweepResult) -> dict[str, Any]:
    a = analyse(result)
    rows, notes = table_rows(result)
    pts = result.points
    return {
        "engine": result.plan.engine,
        "sweep_id": result.sweep_id,
        "status": result.status,
        "started_at_s": result.started_at_s,
        "finished_at_s": result.finished_at_s,
        "original_config_id": result.original.config_id,
        "restored": result.restored,
        "restore_error": result.restore_error,
        "error": result.error,
        "plan": result.plan.describe(),
        "points": [_point_json(p) for p in pts],
        "table": {"headers": list(HEADERS), "rows": rows, "notes": notes},
        "pareto_front": [pts[i].index for i in a.front],
        "best_under_slo": None if a.best is None else pts[a.best].index,
        "knee": {
            "index": None if a.knee.index is None else pts[a.knee.index].index,
            "threshold": a.knee.threshold,
            "units": a.knee.units,
            "units_text": a.knee.units_text,
            "steps": [
                {
                    "from": pts[s.from_index].index,
                    "to": pts[s.to_index].index,
                    "ratio": s.ratio if s.ratio not in (float("inf"), float("-inf")) else str(s.ratio),
                    "accepted": s.accepted,
                }
                for s in a.knee.steps
            ],
        },
    }


def _point_json(p: PointResult) -> dict[str, Any]:
    return {**p.to_json(), "params": p.params, "label": p.label}


def result_from_json(d: dict[str, Any], plan: SweepPlan) -> SweepResult:
    """A sweep's result back from its results.json form (to_json), for a client that watched it
    run elsewhere: its points, how it ended and whether the engine's config is back."""
    original = EngineTarget("", "", "", str(d.get("original_config_id") or ""), {})
    return SweepResult(
        plan,
        tuple(PointResult.from_json(p) for p in d.get("points") or ()),
        original,
        str(d["status"]),
        float(d["started_at_s"]),
        float(d["finished_at_s"]),
        bool(d["restored"]),
        d.get("restore_error"),
        d.get("error"),
        d.get("sweep_id"),
    )


CSV_FIELDS = (
    "index",
    "label",
    "status",
    "reason",
    "throughput_req_s",
    "throughput_tok_s",
    "goodput_req_s",
    "slo_attainment",
    "error_rate",
    "p50_ttft_ms",
    "p99_ttft_ms",
    "p50_tpot_ms",
    "p99_tpot_ms",
    "p50_itl_ms",
    "p99_itl_ms",
    "p50_e2e_ms",
    "p99_e2e_ms",
    "memory_bytes",
    "compute_util",
    "bandwidth_util",
    "peak_kv_usage",
    "preemptions",
    "repeats",
    "spread_throughput",
    "spread_p99_e2e",
    "flags",
    "config_id",
)


def to_csv(result: SweepResult) -> str:
    params = list(dict.fromkeys(k for p in result.points for k in p.params))
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(params + list(CSV_FIELDS))
    for p in result.points:
        lat = {f"{k}_ms": v for k, v in p.latency_ms.items()}
        row = {
            "index": p.index,
            "label": p.label,
            "status": p.status,
            "reason": p.reason,
            "throughput_req_s": p.throughput_req_s,
            "throughput_tok_s": p.throughput_tok_s,
            "goodput_req_s": p.goodput_req_s,
            "slo_attainment": p.slo_attainment,
            "error_rate": p.error_rate,
            **lat,
            "memory_bytes": p.memory_bytes,
            "compute_util": p.compute_util,
            "bandwidth_util": p.bandwidth_util,
            "peak_kv_usage": p.peak_kv_usage,
            "preemptions": p.preemptions,
            "repeats": p.repeats,
            "spread_throughput": p.spread.get("throughput_req_s"),
            "spread_p99_e2e": p.spread.get("p99_e2e_ms"),
            "flags": "; ".join(p.flags),
            "config_id": p.config_id,
        }
        w.writerow([p.params.get(k, "") for k in params] + ["" if row.get(f) is None else row[f] for f in CSV_FIELDS])
    return buf.getvalue()


def to_markdown(result: SweepResult) -> str:
    a = analyse(result)
    plan = result.plan
    out = [
        f"# Sweep of engine {plan.engine}",
        "",
        f"Status: **{result.status}**; original config {result.original.config_id} "
        + ("restored." if result.restored else f"NOT restored ({result.restore_error})."),
        "",
        f"Workload per run: {plan.num_requests} requests, input {plan.input_len.describe()} tokens, "
        f"output {plan.output_len.describe()} tokens, {plan.warmup_requests} warm-up; "
        f"{plan.repeats} repeats per point (medians; flagged when they spread over {plan.spread_limit:.0%}).",
        "",
        render_table(result, markdown=True),
        "",
        "## Trade-off",
        "",
    ]
    out += [f"- {line}" for line in picks_text(result, a)]
    out += [
        "",
        "![throughput against p99 latency](tradeoff.svg)",
        "",
        "## Every figure per point",
        "",
        details_table(result),
        "",
    ]
    flagged = [p for p in result.points if p.flags]
    if flagged:
        out += ["## Flags", ""] + [f"- {p.label}: {'; '.join(p.flags)}" for p in flagged] + [""]
    return "\n".join(out)


def details_table(result: SweepResult) -> str:
    """Medians per point beyond the operators' table: tokens, goodput, TTFT/TPOT, KV, preemptions."""

    def f(v: float | None, fmt: str) -> str:
        return "N/A" if v is None else fmt.format(v)

    head = (
        "#",
        "params",
        "status",
        "tok/s",
        "goodput (req/s)",
        "p50 TTFT (ms)",
        "p99 TTFT (ms)",
        "p99 TPOT (ms)",
        "peak KV",
        "preemptions",
        "repeats",
        "spread (thr / p99)",
    )
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p in result.points:
        lat = p.latency_ms
        spread = f"{f(p.spread.get('throughput_req_s'), '{:.0%}')} / {f(p.spread.get('p99_e2e_ms'), '{:.0%}')}"
        out.append(
            "| "
            + " | ".join(
                [
                    str(p.index),
                    p.label,
                    p.status,
                    f(p.throughput_tok_s, "{:.1f}"),
                    f(p.goodput_req_s, "{:.2f}"),
                    f(lat.get("p50_ttft"), "{:.1f}"),
                    f(lat.get("p99_ttft"), "{:.1f}"),
                    f(lat.get("p99_tpot"), "{:.2f}"),
                    f(p.peak_kv_usage, "{:.1%}"),
                    f(p.preemptions, "{}"),
                    str(p.repeats),
                    spread,
                ]
            )
            + " |"
        )
    return "\n".join(out)


def write_results(result: SweepResult, out_dir: Path) -> dict[str, Path]:
    """results.json, results.csv, report.md and tradeoff.svg under out_dir (created)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    a = analyse(result)
    files = {
        "json": out_dir / "results.json",
        "csv": out_dir / "results.csv",
        "markdown": out_dir / "report.md",
        "plot": out_dir / "tradeoff.svg",
    }
    files["json"].write_text(json.dumps(to_json(result), indent=2, default=str) + "\n")
    files["csv"].write_text(to_csv(result))
    files["plot"].write_text(tradeoff_chart(result.points, a.front, a.best, a.knee.index))
    files["markdown"].write_text(to_markdown(result))
    return files
