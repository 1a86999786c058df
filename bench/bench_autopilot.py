"""Benchmark: one replayed day of traffic under static configs and under the autopilot.

The same trace, through the same gateway, to the same engine (restarted on each config):

  (a) static  every config of a small grid (batch size x KV size x window), the window frozen
  (b) best    the static config of (a) with the highest goodput, chosen in hindsight
  (c) auto    the demo's config (Makefile `run`: 16 seats, 2,048-token context, 256 MiB of KV)
              with `llmconsole autopilot on` and the same SLO

Per run: the share of slots whose p99 met the SLO (a slot is 1/30 of the replay: a minute of a
day compressed to 30 minutes, what the figure means at that scale), goodput (requests within the
SLO per second), errors, engine restarts and config changes, and for the autopilot what each
control changed and why (`autopilot status`). A failed request counts as over the SLO.

The time compression is a flag: `--minutes 30` is the day in 30 minutes; a shorter replay keeps
the day's shape with fewer seconds in each of its hours. The autopilot's own clocks (the tune
interval and its quiet window, how long the SLO burns before the standby) are compressed by the
same factor, so it sees the day as it would at full length. Results: --out (JSON) and its .svg.

    PYTHONPATH=. .venv/bin/python bench/bench_autopilot.py --minutes 4 \
        --statics "max_num_seqs=4,window=4;max_num_seqs=16,kv=8MiB,window=16;max_num_seqs=16,window=16"
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from html import escape
from pathlib import Path
from typing import Any

from llmconsole.db import Store
from llmconsole.engine.load.generator import LoadResult, run_trace
from llmconsole.engine.load.trace import fit_to_context, read_trace, trace_span_s
from llmconsole.engine.load.trace_gen import DayShape, diurnal_day
from llmconsole.engine.metrics.latency import LatencyStats, Slo
from llmconsole.svgplot import COLOURS, fmt_number, nice_ticks, open_svg

ROOT = Path(__file__).resolve().parent.parent
DEMO = {"max_num_seqs": 16, "max_model_len": 2048, "kv_cache_memory_bytes": 256 * 2**20}
SLOTS = 30
_UNITS = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


def cli(home: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, LLMCONSOLE_HOME=str(home))
    r = subprocess.run(
        [sys.executable, "-m", "llmconsole.console.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )
    if r.returncode != 0:
        raise RuntimeError(f"llmconsole {' '.join(args)}: {r.stderr.strip() or r.stdout.strip()}")
    return r


def parse_statics(text: str) -> list[dict[str, int]]:
    """`max_num_seqs=4,kv=8MiB,window=4;...` -> configs (kv in bytes; unset: the demo's)."""
    out = []
    for part in text.split(";"):
        cfg: dict[str, int] = {}
        for item in part.split(","):
            key, _, value = item.strip().partition("=")
            if key == "kv":
                unit = next((u for u in _UNITS if value.endswith(u)), None)
                cfg["kv_cache_memory_bytes"] = int(value.removesuffix(unit)) * _UNITS[unit] if unit else int(value)
            elif key in ("max_num_seqs", "window"):
                cfg[key] = int(value)
            else:
                raise SystemExit(f"--statics: unknown key {key!r} (max_num_seqs, kv, window)")
        out.append(cfg)
    return out


def engine_flags(cfg: dict[str, int]) -> list[str]:
    spec = {**DEMO, **{k: v for k, v in cfg.items() if k != "window"}}
    return [a for k, v in spec.items() for a in (f"--{k.replace('_', '-')}", str(v))]


def slot_figures(result: LoadResult, slo: Slo, span_s: float) -> list[dict[str, Any]]:
    """Each slot's requests (by when they were sent), its p99 of the SLO's metric, and whether
    that p99 met the SLO's limit (a failed request is over it)."""
    target = slo.targets[0]
    width = span_s / SLOTS
    slots: list[list[float]] = [[] for _ in range(SLOTS)]
    for r in result.records:
        if r.warmup:
            continue  # a cancelled request (the run's time cap) is a miss, as a failed one is
        i = min(SLOTS - 1, max(0, int(r.start_s / width)))
        value = {"ttft": r.ttft_s, "e2e": r.e2e_s, "tpot": r.tpot_s}.get(target.metric) if r.ok else None
        slots[i].append(float("inf") if value is None else value)
    out = []
    for i, values in enumerate(slots):
        finite = [v for v in values if v != float("inf")]
        over = len(values) - len(finite)
        p = LatencyStats.of_seconds(finite).at(target.percentile) if finite else None
        # a failure counts as over the limit: once more than 1% fail, the p99 is over it
        met = bool(values) and p is not None and p <= target.limit_ms and over <= len(values) * 0.01
        out.append({"slot": i, "requests": len(values), "failed": over, "p_ms": p, "met": met if values else None})
    return out


def config_changes(home: Path, since_s: float, engine: str) -> list[dict[str, Any]]:
    with Store.open(home / "llmconsole.db") as store:
        return [
            {"at_s": a.at, "kind": a.kind, "automatic": a.automatic, "outcome": a.outcome}
            for a in store.actions(since=since_s, engine=engine)
            if a.to_config_id and a.to_config_id != a.from_config_id
        ]


def replay(home: Path, trace: Any, scale: float, slo: Slo, model: str) -> LoadResult:
    """The trace through the demo engine's door; a run is cut at 1.5x the replay's length plus
    a minute (what was still unanswered then counts as a miss)."""
    e = next(x for x in json.loads(cli(home, "status", "--json").stdout)["engines"] if x["name"] == "demo")
    cap_s = trace_span_s(trace) / scale * 1.5 + 60.0
    return asyncio.run(
        run_trace(
            e["gateway_url"], "tiny", trace, scale, tokenizer_source=model, slo=slo, warmup=2, max_duration_s=cap_s
        )
    )


def run_one(home: Path, label: str, cfg: dict[str, int] | None, ns: argparse.Namespace, trace: Any) -> dict[str, Any]:
    slo = Slo.parse(ns.slo)
    scale = 86_400.0 / (ns.minutes * 60.0)
    t0 = time.monotonic()
    cli(home, "engine", "restart", "demo", *engine_flags(cfg or {}), timeout=900)
    print(f"{label}: engine ready in {time.monotonic() - t0:.0f} s", flush=True)
    before = next(x for x in json.loads(cli(home, "status", "--json").stdout)["engines"] if x["name"] == "demo")
    if cfg is not None:
        cli(home, "window", "demo", "--set", str(cfg.get("window", 8)))
    else:
        cli(
            home,
            "autopilot",
            "on",
            "demo",
            "--slo",
            ",".join(ns.slo),
            "--tune-every",
            str(max(10.0, ns.tune_every_h * 3600 / scale)),
            "--tune-trials",
            "1",
            "--tune-quiet",
            str(600.0 / scale),  # ten minutes of the day, compressed too
            "--standby-after",
            str(120.0 / scale * ns.standby_scale),
        )
        pilots = json.loads(cli(home, "autopilot", "status", "--json").stdout)
        print(f"{label}: autopilot on: {pilots['pilots'][0]['controls']}", flush=True)
    began = time.time()
    result = replay(home, trace, scale, slo, ns.model)
    after = next(x for x in json.loads(cli(home, "status", "--json").stdout)["engines"] if x["name"] == "demo")
    run: dict[str, Any] = {"label": label, "config": cfg if cfg is not None else {**DEMO, "autopilot": True}}
    pilot: dict[str, Any] | None = None
    if cfg is None:
        pilot = json.loads(cli(home, "autopilot", "status", "--json").stdout)["pilots"][0]
        cli(home, "autopilot", "off", "demo")
    s = result.summary
    slots = slot_figures(result, slo, trace_span_s(trace) / scale)
    judged = [x for x in slots if x["met"] is not None]
    run.update(
        slots=slots,
        slots_met_share=sum(1 for x in judged if x["met"]) / len(judged) if judged else None,
        goodput_req_s=s.goodput_req_s,
        throughput_req_s=s.request_throughput_req_s,
        requests=s.requests,
        completed=s.completed,
        failed=s.failed,
        cancelled=s.cancelled,
        errors_by_kind=s.errors_by_kind,
        p99_ms=s.latency(slo.targets[0].metric).at(slo.targets[0].percentile),
        duration_s=s.duration_s,
        crash_restarts=(after.get("restarts") or 0) - (before.get("restarts") or 0),
        config_changes=config_changes(home, began, "demo"),
        autopilot=pilot,
    )
    print(
        f"{label}: {run['slots_met_share']:.0%} of slots met, goodput {s.goodput_req_s or 0:.2f} req/s, "
        f"{s.failed} errors, {s.cancelled} unanswered at the cap, p99 {run['p99_ms'] or 0:.0f} ms, {len(run['config_changes'])} config changes",
        flush=True,
    )
    return run


def chart(runs: list[dict[str, Any]], slo_ms: float, title: str, path: Path) -> None:
    """Each run's p99 per slot against the SLO's line (log scale: a broken slot is often 10x)."""
    import math

    w, h, left, top, right, bottom = 760, 360, 60, 34, 170, 40
    pw, ph = w - left - right, h - top - bottom
    values = [x["p_ms"] for r in runs for x in r["slots"] if x["p_ms"]]
    lo, hi = math.log10(max(1.0, min(values + [slo_ms]) / 1.5)), math.log10(max(values + [slo_ms]) * 1.5)

    def y(v: float) -> float:
        return top + ph - (math.log10(max(v, 1.0)) - lo) / (hi - lo) * ph

    def x(i: float) -> float:
        return left + i / (SLOTS - 1) * pw

    out = open_svg(w, h, left, title)
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#ccc"/>')
    for t in nice_ticks(lo, hi, 4):
        if lo <= t <= hi:
            v = 10**t
            out.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{fmt_number(v)}</text>')
    for i in range(0, SLOTS, 5):
        out.append(f'<text x="{x(i):.1f}" y="{top + ph + 16}" text-anchor="middle">{i}</text>')
    out.append(
        f'<text x="{left + pw / 2}" y="{h - 6}" text-anchor="middle">slot (1/30 of the day; 0 = midnight)</text>'
    )
    out.append(
        f'<text x="14" y="{top + ph / 2}" transform="rotate(-90 14 {top + ph / 2})" text-anchor="middle">p99 ms</text>'
    )
    out.append(
        f'<line x1="{left}" x2="{left + pw}" y1="{y(slo_ms):.1f}" y2="{y(slo_ms):.1f}" stroke="#000" '
        'stroke-dasharray="5 4"/>'
    )
    for k, r in enumerate(runs):
        colour = COLOURS[k % len(COLOURS)]
        pts = " ".join(f"{x(s['slot']):.1f},{y(s['p_ms']):.1f}" for s in r["slots"] if s["p_ms"])
        out.append(f'<polyline points="{pts}" fill="none" stroke="{colour}" stroke-width="1.6"/>')
        share = r["slots_met_share"] or 0.0
        out.append(
            f'<text x="{left + pw + 10}" y="{top + 14 + 16 * k}" fill="{colour}">{escape(r["label"])} '
            f"({share:.0%})</text>"
        )
    out.append(f'<text x="{left + pw + 10}" y="{top + 14 + 16 * len(runs)}">- - SLO {slo_ms:g} ms</text>')
    out.append("</svg>")
    path.write_text("\n".join(out))


def save(ns: argparse.Namespace, runs: list[dict[str, Any]], state: str) -> None:
    """What is measured so far, kept after every run (a later failure loses nothing)."""
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    ns.out.with_suffix(".partial.json").write_text(json.dumps({"state": state, "runs": runs}, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trace", default=str(ROOT / "bench" / "traces" / "diurnal-day.csv"))
    ap.add_argument(
        "--day-requests", type=int, default=None, help="replay a generated day of about N requests instead of --trace"
    )
    ap.add_argument("--minutes", type=float, default=30.0, help="the day replayed in this many minutes")
    ap.add_argument("--slo", action="append", default=None, help="default p99_e2e_ms=3000")
    ap.add_argument(
        "--statics",
        default="max_num_seqs=4,window=4;max_num_seqs=16,kv=8MiB,window=16;max_num_seqs=16,window=16",
        help="the static grid: CONFIG;CONFIG;... with CONFIG max_num_seqs=N,kv=BYTES|NMiB,window=N",
    )
    ap.add_argument("--tune-every-h", type=float, default=8.0, help="the autopilot's tune interval, hours of the day")
    ap.add_argument("--standby-scale", type=float, default=1.0, help="x the SLO burn before a standby, compressed")
    ap.add_argument("--only", choices=("static", "auto"), default=None)
    ap.add_argument("--model", default=str(ROOT / ".models" / "tiny"))
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "data" / "autopilot.json")
    ns = ap.parse_args()
    ns.slo = ns.slo or ["p99_e2e_ms=3000"]
    slo = Slo.parse(ns.slo)
    if ns.day_requests:
        day = diurnal_day(DayShape(requests=ns.day_requests, burst_requests=max(2, ns.day_requests // 40)), seed=3)
        trace = fit_to_context(day, DEMO["max_model_len"])
        ns.trace = f"generated: DayShape(requests={ns.day_requests}), seed 3"
    else:
        trace = fit_to_context(read_trace(ns.trace), DEMO["max_model_len"])
    statics = parse_statics(ns.statics)
    home = Path(tempfile.mkdtemp(prefix="bench-ap-", dir="/tmp"))
    runs: list[dict[str, Any]] = []
    try:
        t0 = time.monotonic()
        cli(
            home,
            "engine",
            "start",
            "demo",
            "--model",
            ns.model,
            "--served-model-name",
            "tiny",
            *engine_flags({}),
            "--enforce-eager",
            "--cpu-threads-bind",
            "nobind",
            "--env",
            "VLLM_ENABLE_V1_MULTIPROCESSING=0",
        )
        print(f"daemon and engine up in {time.monotonic() - t0:.0f} s", flush=True)
        # The autopilot last: the standby engine it may start stays in the group afterwards.
        if ns.only != "auto":
            for cfg in statics:
                label = "static " + ",".join(f"{k}={v}" for k, v in cfg.items())
                runs.append(run_one(home, label, cfg, ns, trace))
                save(ns, runs, "partial")
        if ns.only != "static":
            runs.append(run_one(home, "autopilot (demo config)", None, ns, trace))
            save(ns, runs, "partial")
    finally:
        env = dict(os.environ, LLMCONSOLE_HOME=str(home))
        subprocess.run(
            [sys.executable, "-m", "llmconsole.console.cli", "daemon", "stop", "--stop-engines", "--yes"],
            env=env,
            capture_output=True,
            timeout=300,
            cwd=ROOT,
        )
        shutil.rmtree(home, ignore_errors=True)
    static_runs = [r for r in runs if r["autopilot"] is None]
    best = max(static_runs, key=lambda r: r["goodput_req_s"] or 0.0, default=None)
    auto = next((r for r in runs if r["autopilot"] is not None), None)
    summary = {
        "trace": ns.trace,
        "requests": len(trace),
        "minutes": ns.minutes,
        "time_scale": 86_400.0 / (ns.minutes * 60.0),
        "slo": slo.as_dict(),
        "slots": SLOTS,
        "best_static_in_hindsight": best["label"] if best else None,
        "autopilot_goodput_vs_best": (auto["goodput_req_s"] or 0) / best["goodput_req_s"]
        if auto and best and best["goodput_req_s"]
        else None,
        "runs": runs,
    }
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    ns.out.write_text(json.dumps(summary, indent=1))
    if runs:
        chart(
            runs,
            slo.targets[0].limit_ms,
            f"p99 {slo.targets[0].metric} per slot, a day in {ns.minutes:g} minutes",
            ns.out.with_suffix(".svg"),
        )
    for r in runs:
        print(
            f"{r['label']:<50} slots met {r['slots_met_share'] or 0:6.1%}  goodput {r['goodput_req_s'] or 0:6.2f} req/s  "
            f"errors {r['failed']:4d}  config changes {len(r['config_changes'])}"
        )
    if best and auto:
        print(
            f"best static in hindsight: {best['label']}; autopilot goodput {summary['autopilot_goodput_vs_best']:.0%} of it"
        )


if __name__ == "__main__":
    main()
