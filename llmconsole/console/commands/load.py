"""`llmconsole load ENGINE ...`: run the load generator against an engine the daemon supervises.

The load goes through the engine's door at the gateway (`gateway_url` in `status --json`), as
clients' requests do, so the batch window admits it and its PID controller sees it: that is
the load the console's PID trace shows. `--direct` sends to the engine's own port instead,
past the window (what sweeps and tunes measure configs with).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import os
import signal
import sys
from typing import Any

from llmconsole.console.cli_common import EXIT_USAGE, CliError, daemon_client, na
from llmconsole.console.client import DaemonClient
from llmconsole.engine.load.generator import LoadResult, run_load, run_trace
from llmconsole.engine.load.trace import TraceError, TraceRequest, fit_to_context, read_trace, trace_span_s
from llmconsole.engine.load.workload import LengthDist, Workload
from llmconsole.engine.metrics.latency import Slo
from llmconsole.wire.status import EngineInfo


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("load", help="send a measured load to an engine: throughput, TTFT, TPOT, goodput")
    p.add_argument("engine", help="the engine's name")
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--concurrency", type=int, metavar="N", help="closed loop: N streams")
    mode.add_argument("--rate", type=float, metavar="R", help="open loop: R requests/s on average")
    mode.add_argument(
        "--trace",
        metavar="FILE",
        help="replay a CSV trace (llmconsole, Azure LLM inference or BurstGPT layout; docs/autopilot.md)",
    )
    p.add_argument(
        "--time-scale",
        type=float,
        default=1.0,
        metavar="X",
        help="replay the trace X times faster (a day in 4 minutes: 360)",
    )
    add_workload_flags(p)
    p.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        metavar="B",
        help="open loop: gamma shape of the arrivals (1 Poisson, <1 burstier)",
    )
    p.add_argument(
        "--max-concurrency", type=int, default=None, metavar="N", help="open loop: at most N requests in flight"
    )
    p.add_argument("--max-duration", type=float, default=None, metavar="S", help="stop after S seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--api-key-env", default=None, metavar="VAR", help="read the engine's API key from VAR")
    p.add_argument(
        "--direct",
        action="store_true",
        help="send to the engine's own port, past the gateway's batch window (default: through it)",
    )
    p.add_argument("--json", action="store_true", help="the summary as JSON")
    p.set_defaults(func=cmd_load)


def add_workload_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--num-requests", type=int, default=64, metavar="N", help="measured requests")
    p.add_argument(
        "--input-len", default="64", metavar="L", help="prompt tokens: N, uniform:LOW-HIGH or lognormal:MEDIAN[:SIGMA]"
    )
    p.add_argument("--output-len", default="64", metavar="L", help="output tokens, same forms")
    p.add_argument("--warmup", type=int, default=2, metavar="N", help="warm-up requests, left out of the figures")
    p.add_argument(
        "--slo",
        action="append",
        default=[],
        metavar="KEY=MS",
        help="e.g. p99_e2e_ms=2000, ttft_ms=500, p50_tpot_ms=50 (repeatable or comma-separated)",
    )
    p.add_argument(
        "--no-ignore-eos",
        dest="ignore_eos",
        action="store_false",
        help="let the model stop early (output lengths then vary)",
    )


def engine_target(client: DaemonClient, name: str) -> EngineInfo:
    e = client.engine_info(name)
    if e is None:
        raise CliError(f"no engine named {name} (see `llmconsole status`)", EXIT_USAGE)
    if e.state != "ready" or not e.url:
        raise CliError(f"engine {name} is {e.state}, not ready; nothing was sent")
    return e


def load_url(e: EngineInfo, direct: bool) -> tuple[str, str]:
    """Where the load goes and how to say so: the gateway's door unless `direct` (or none)."""
    if not direct and e.gateway_url:
        return e.gateway_url, f"through the gateway's batch window at {e.gateway_url} (--direct bypasses it)"
    if not direct:
        return str(e.url), f"directly to {e.url}: the daemon runs no gateway for engine {e.name}"
    return str(e.url), f"directly to {e.url}, past the gateway's batch window"


def cmd_load(ns: argparse.Namespace) -> int:
    try:
        slo = Slo.parse(ns.slo)
        common = dict(warmup_requests=ns.warmup, max_duration_s=ns.max_duration, seed=ns.seed, ignore_eos=ns.ignore_eos)
        lin, lout = LengthDist.parse(ns.input_len), LengthDist.parse(ns.output_len)
        if ns.trace is not None:
            wl = Workload.open(1.0, 1, lin, lout, **common)  # replaced by the trace's own
        elif ns.concurrency is not None:
            wl = Workload.closed(ns.concurrency, ns.num_requests, lin, lout, **common)
        else:
            wl = Workload.open(
                ns.rate, ns.num_requests, lin, lout, burstiness=ns.burstiness, concurrency=ns.max_concurrency, **common
            )
    except ValueError as e:
        raise CliError(str(e), EXIT_USAGE) from None
    trace = _read_trace(ns)
    api_key = os.environ.get(ns.api_key_env) if ns.api_key_env else None
    with daemon_client() as client:
        target = engine_target(client, ns.engine)
    url, where = load_url(target, ns.direct)
    if trace is not None:
        max_len = target.spec.get("max_model_len")
        trace = fit_to_context(trace, int(max_len)) if isinstance(max_len, int) else trace
        where += f"; trace {ns.trace}: {len(trace)} requests over {trace_span_s(trace) / ns.time_scale:.0f} s"
    if not ns.json:
        print(f"load on {ns.engine} {where}", file=sys.stderr)
    result = asyncio.run(
        _run(
            target.model_copy(update={"url": url}),
            wl,
            slo,
            api_key,
            show=sys.stderr.isatty() and not ns.json,
            trace=trace,
            time_scale=ns.time_scale,
        )
    )
    out = result_json(result)
    if trace is not None:
        out["trace"] = {"file": ns.trace, "requests": len(trace), "time_scale": ns.time_scale}
    print(json.dumps(out, indent=2) if ns.json else render_summary(result))
    return 130 if result.stopped_early == "interrupted" else 0


def _read_trace(ns: argparse.Namespace) -> tuple[TraceRequest, ...] | None:
    """The trace to replay (None: no --trace); a bad file or scale is a usage error, nothing sent."""
    if ns.trace is None:
        if ns.time_scale != 1.0:
            raise CliError("--time-scale applies to --trace only", EXIT_USAGE)
        return None
    if not ns.time_scale > 0 or not math.isfinite(ns.time_scale):
        raise CliError("--time-scale must be a number above 0 (10: ten times faster)", EXIT_USAGE)
    try:
        return read_trace(ns.trace)
    except TraceError as e:
        raise CliError(str(e), EXIT_USAGE) from None


async def _run(
    e: EngineInfo,
    wl: Workload,
    slo: Slo,
    api_key: str | None,
    show: bool,
    trace: tuple[TraceRequest, ...] | None = None,
    time_scale: float = 1.0,
) -> LoadResult:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, stop.set)  # Ctrl-C: stop sending, keep what finished

    def progress(done: int, total: int) -> None:
        if show:
            sys.stderr.write(f"\r{done}/{total} requests")
            sys.stderr.flush()

    try:
        if trace is not None:
            return await run_trace(
                str(e.url),
                e.served_model_name or str(e.model),
                trace,
                time_scale,
                tokenizer_source=str(e.model),
                slo=slo,
                stop=stop,
                on_progress=progress,
                api_key=api_key,
                seed=wl.seed,
                warmup=wl.warmup_requests,
                max_duration_s=wl.max_duration_s,
            )
        return await run_load(
            str(e.url),
            e.served_model_name or str(e.model),
            wl,
            tokenizer_source=str(e.model),
            slo=slo,
            stop=stop,
            on_progress=progress,
            api_key=api_key,
        )
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        if show:
            sys.stderr.write("\r\033[K")


def result_json(r: LoadResult) -> dict[str, Any]:
    s = dataclasses.asdict(r.summary)
    s["error_rate"] = r.summary.error_rate
    return {
        "url": r.url,
        "model": r.model,
        "workload": r.workload.describe(),
        "stopped_early": r.stopped_early,
        "summary": s,
    }


def render_summary(r: LoadResult) -> str:
    s = r.summary
    lines = [
        f"{s.completed} of {s.requests} requests completed in {s.duration_s:.2f} s"
        + (f" (stopped early: {r.stopped_early}; {s.cancelled} cancelled)" if r.stopped_early else ""),
        f"throughput: {s.request_throughput_req_s:.2f} req/s, {s.output_throughput_tok_s:.1f} output tok/s, "
        f"{s.total_token_throughput_tok_s:.1f} total tok/s",
        f"{'latency (ms)':<14} {'mean':>9} {'median':>9} {'p99':>9}",
    ]
    for name in ("ttft", "tpot", "itl", "e2e"):
        st = s.latency(name)
        lines.append(
            f"{name.upper():<14} {na(st.mean_ms, '{:.1f}'):>9} {na(st.median_ms, '{:.1f}'):>9} "
            f"{na(st.p99_ms, '{:.1f}'):>9}"
        )
    if s.slo:
        lines.append(
            f"SLO {', '.join(f'{k}={v:g}' for k, v in s.slo.items())}: goodput "
            f"{s.goodput_req_s:.2f} req/s, attainment {s.slo_attainment:.1%}"
            + (f"; missed: {'; '.join(s.slo_broken)}" if s.slo_broken else "; met")
        )
    if s.errors_by_kind:
        lines.append("errors: " + ", ".join(f"{k}: {n}" for k, n in sorted(s.errors_by_kind.items())))
    return "\n".join(lines)
