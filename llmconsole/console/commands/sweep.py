"""`llmconsole sweep ...`: a mini sweep over engine configs and loads, run by the daemon.

The CLI builds the same request the console sends and follows the run (console/run_follow.py): each
server point is a daemon restart with spec overrides (a config version in the history like any
other restart), and the daemon puts the original spec back at the end, whatever happens to the
CLI. The results are written where the daemon keeps them and, with --out, here too.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from llmconsole.console import run_follow
from llmconsole.console.cli_common import EXIT_USAGE, CliError, daemon_client
from llmconsole.console.client import DaemonClient
from llmconsole.console.commands.load import add_workload_flags, engine_target
from llmconsole.engine.sweep.plan import SweepPlan, SweepProgress
from llmconsole.engine.sweep.report import analyse, picks_text, render_table, result_from_json, to_json, write_results
from llmconsole.engine.sweep.request import SweepRequest, default


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("sweep", help="sweep engine configs x loads: throughput / p99 table, Pareto, knee")
    p.add_argument("--engine", required=True, help="the engine to sweep (it is restarted on each config)")
    p.add_argument(
        "--grid",
        action="append",
        default=[],
        metavar="FIELD=V1,V2",
        help="engine spec field and its values (repeatable), e.g. max_num_seqs=4,8,16",
    )
    p.add_argument(
        "--load", action="append", required=True, metavar="KIND=V1,V2", help="concurrency=4,16 or rate=2,8 (requests/s)"
    )
    add_workload_flags(p)
    p.set_defaults(**{f: default(f) for f in ("num_requests", "input_len", "output_len", "warmup", "ignore_eos")})
    p.add_argument("--repeats", type=int, default=default("repeats"), help="runs per point, reported as the median")
    p.add_argument(
        "--burstiness", type=float, default=default("burstiness"), help="rate loads: gamma shape of arrivals"
    )
    p.add_argument("--max-run", type=float, default=default("max_run_s"), metavar="S", help="time bound of one run")
    p.add_argument(
        "--max-error-rate", type=float, default=default("max_error_rate"), help="stop rule: failed share of requests"
    )
    p.add_argument(
        "--spread-limit", type=float, default=default("spread_limit"), help="flag points whose repeats spread more"
    )
    p.add_argument(
        "--knee-threshold",
        type=float,
        default=default("knee_threshold"),
        help="accept a step while its ratio exceeds this",
    )
    p.add_argument(
        "--knee-units",
        choices=["relative", "absolute"],
        default=default("knee_units"),
        help="relative: (dT/T)/(dL/L); absolute: (req/s) per ms",
    )
    p.add_argument(
        "--through-gateway",
        action="store_true",
        help="send the load through the engine's gateway door, where the batch window caps it "
        "(default: to the engine's own port, each config's own figures)",
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        help="also write results.json, results.csv, report.md, tradeoff.svg here "
        "(the daemon keeps them under its data dir's sweeps/ in any case)",
    )
    p.add_argument("--json", action="store_true", help="print results.json's content instead of the table")
    p.add_argument("--detach", action="store_true", help="start the sweep in the daemon, print its run id and return")
    p.set_defaults(func=cmd_sweep)


def sweep_request(ns: argparse.Namespace) -> SweepRequest:
    return SweepRequest(
        engine=ns.engine,
        grid=ns.grid,
        loads=ns.load,
        slo=ns.slo,
        repeats=ns.repeats,
        num_requests=ns.num_requests,
        input_len=ns.input_len,
        output_len=ns.output_len,
        warmup=ns.warmup,
        ignore_eos=ns.ignore_eos,
        burstiness=ns.burstiness,
        max_run_s=ns.max_run,
        max_error_rate=ns.max_error_rate,
        spread_limit=ns.spread_limit,
        knee_threshold=ns.knee_threshold,
        knee_units=ns.knee_units,
        through_gateway=ns.through_gateway,
    )


def build_plan(ns: argparse.Namespace) -> SweepPlan:
    try:
        return sweep_request(ns).plan()
    except ValueError as e:
        raise CliError(str(e), EXIT_USAGE) from None


def _progress_line(ev: SweepProgress) -> None:
    eta = f", ~{ev.eta_s / 60:.1f} min left" if ev.eta_s is not None else ""
    params = ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in ev.params.items())
    head = f"[point {ev.index}/{ev.total}]" if ev.index else "[sweep]"
    print(
        f"{head} {params}{': ' if params else ''}{ev.message} ({ev.elapsed_s:.0f} s elapsed{eta})",
        file=sys.stderr,
        flush=True,
    )


def _progress_event(ev: dict[str, Any]) -> None:
    _progress_line(
        SweepProgress(
            ev["event"],
            int(ev["index"]),
            int(ev["total"]),
            dict(ev.get("params") or {}),
            float(ev["elapsed_s"]),
            ev.get("eta_s"),
            ev.get("message", ""),
        )
    )


def cmd_sweep(ns: argparse.Namespace) -> int:
    build_plan(ns)  # a bad request or plan is the CLI's usage error, before anything is sent
    request = sweep_request(ns)
    with daemon_client() as client:
        engine_target(client, ns.engine)  # refuse before any restart if it is not ready
        record = run_follow.start(client, "sweep", request.model_dump(mode="json"))
        if ns.detach:
            return run_follow.detached(record, ns.json)
        return follow_run(client, record, out=Path(ns.out) if ns.out else None, as_json=ns.json, owner=True)


def follow_run(client: DaemonClient, record: dict[str, Any], *, out: Path | None, as_json: bool, owner: bool) -> int:
    """Follow a sweep run to its end and print it as `sweep` always has: progress lines on
    stderr, then the table and picks (or results.json's content)."""
    try:
        plan = SweepRequest.model_validate(record["request"]).plan()
    except ValueError as e:
        raise CliError(f"run {record['id']}: its request no longer reads as a sweep: {e}") from None
    end = run_follow.follow(client, record, _progress_event, owner=owner)
    outcome = end.get("outcome")
    if not outcome:
        raise CliError(f"run {end['id']}: the sweep failed: {end.get('error')}")
    result = result_from_json(outcome, plan)
    files = write_results(result, out) if out is not None else {k: Path(v) for k, v in outcome["files"].items()}
    if as_json:
        print(json.dumps(to_json(result), indent=2, default=str))
    else:
        print(render_table(result))
        print()
        print("\n".join(picks_text(result, analyse(result))))
        print(f"\nwritten: {', '.join(str(f) for f in files.values())}")
    if not result.restored:
        raise CliError(f"the engine's original config was NOT restored: {result.restore_error}")
    return run_follow.EXIT_INTERRUPTED if result.status == "cancelled" else 0
