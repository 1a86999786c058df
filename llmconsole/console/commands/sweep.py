"""`llmconsole sweep ...`: a mini sweep over engine configs and loads, through the daemon.

`DaemonController` is the sweep runner's engine controller for engines the daemon supervises:
each server point is a daemon restart with spec overrides (so it is a config version in the
history like any other restart), and the original spec is put back at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from llmconsole.console.cli_common import EXIT_USAGE, CliError, daemon_client
from llmconsole.console.client import DaemonClient, DaemonError
from llmconsole.console.commands.load import add_workload_flags, engine_target
from llmconsole.engine.sweep.plan import SweepPlan, SweepProgress
from llmconsole.engine.sweep.probe import ResourceSample, resource_sample
from llmconsole.engine.sweep.report import analyse, picks_text, render_table, to_json, write_results
from llmconsole.engine.sweep.request import SweepRequest, default
from llmconsole.engine.sweep.runner import EngineStartFailed, EngineTarget, SweepResult, SweepRunner

if TYPE_CHECKING:
    from llmconsole.db import Store


class DaemonController:
    def __init__(self, client: DaemonClient, name: str, ready_timeout_s: float = 900.0):
        self.client, self.name, self.ready_timeout_s = client, name, ready_timeout_s

    @staticmethod
    def _target(e: dict[str, Any]) -> EngineTarget:
        return EngineTarget(e["url"], e["served_model_name"], e["model"], e["config_id"], dict(e["spec"]))

    async def current(self) -> EngineTarget:
        return self._target(await asyncio.to_thread(engine_target, self.client, self.name))

    async def gateway_url(self) -> str:
        e = await asyncio.to_thread(self.client.engine, self.name)
        if not e or not e.get("gateway_url"):
            raise RuntimeError(f"engine {self.name} has no gateway door")
        url: str = e["gateway_url"]
        return url

    async def apply(self, overrides: dict[str, Any]) -> EngineTarget:
        return await asyncio.to_thread(self._restart, overrides)

    async def restore(self, original: EngineTarget) -> EngineTarget:
        # The status shows a spec as public_dict(): whether a key is set, never the key. The key
        # stays the engine's own; only the config fields go back.
        fields = {k: v for k, v in original.spec.items() if k != "api_key_set"}
        return await asyncio.to_thread(self._restart, fields)

    def _restart(self, overrides: dict[str, Any]) -> EngineTarget:
        try:
            self.client.restart_engine(self.name, overrides=overrides)
        except DaemonError as e:
            raise EngineStartFailed(str(e)) from None
        deadline = time.monotonic() + self.ready_timeout_s
        while time.monotonic() < deadline:
            eng = self.client.engine(self.name)
            if eng is not None and eng["state"] == "ready" and eng.get("url"):
                return self._target(eng)
            if eng is None or eng["state"] in ("failed", "stopped"):
                raise EngineStartFailed((eng or {}).get("last_error") or "the engine stopped")
            time.sleep(0.5)
        raise EngineStartFailed(f"not ready within {self.ready_timeout_s:.0f} s")

    async def resources(self) -> ResourceSample:
        status = await asyncio.to_thread(self.client.status)
        e = next((x for x in status["engines"] if x["name"] == self.name), None) or {}
        return resource_sample(e, status.get("host") or {})


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
    p.add_argument("--out", required=True, metavar="DIR", help="results.json, results.csv, report.md, tradeoff.svg")
    p.add_argument("--no-history", action="store_true", help="do not record the sweep in the database")
    p.add_argument("--json", action="store_true", help="print results.json's content instead of the table")
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


def cmd_sweep(ns: argparse.Namespace) -> int:
    plan = build_plan(ns)
    out = Path(ns.out)
    with daemon_client() as client:
        engine_target(client, ns.engine)  # refuse before any restart if it is not ready
        store: Store | None = None
        if not ns.no_history:
            from llmconsole.db import Store, StoreError
            from llmconsole.paths import resolve

            try:
                store = Store.open(resolve().database)
            except StoreError as e:
                print(f"llmconsole: not recording the sweep in history: {e}", file=sys.stderr)
        try:
            result = asyncio.run(_run(plan, DaemonController(client, ns.engine), store))
        finally:
            if store is not None:
                store.close()
    files = write_results(result, out)
    if ns.json:
        print(json.dumps(to_json(result), indent=2, default=str))
    else:
        print(render_table(result))
        print()
        print("\n".join(picks_text(result, analyse(result))))
        print(f"\nwritten: {', '.join(str(f) for f in files.values())}")
    if not result.restored:
        raise CliError(f"the engine's original config was NOT restored: {result.restore_error}")
    return 130 if result.status == "cancelled" else 0


async def _run(plan: SweepPlan, ctl: DaemonController, store: Store | None) -> SweepResult:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, stop.set)  # Ctrl-C: finish up, restore, write what was measured
    try:
        return await SweepRunner(plan, ctl, on_progress=_progress_line, stop=stop, store=store).run()
    finally:
        loop.remove_signal_handler(signal.SIGINT)
