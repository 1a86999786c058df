"""`llmconsole tune ...`: find the config with the best goodput under an SLO, in few restarts.

Trials run through the daemon exactly as sweep points do (`DaemonController`); the study is a
journal under the data dir, so running the same command again resumes it. `--apply` moves the
engine to the winner through the daemon's guarded apply, which then watches the SLO and rolls
back on its own if production degrades.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys

from llmconsole.console.cli_common import EXIT_USAGE, CliError, daemon_client
from llmconsole.console.client import DaemonError
from llmconsole.console.commands.load import add_workload_flags, engine_target
from llmconsole.console.commands.sweep import DaemonController
from llmconsole.engine.latency_stats import Slo
from llmconsole.engine.sweep_plan import SweepPlan, parse_loads
from llmconsole.engine.tuner import Tuner, TuneProgress, TuneResult, TuneSettings
from llmconsole.engine.tuner_space import (clamp_to_workload, default_space, parse_budget, parse_knob,
                                           workload_len_tokens)
from llmconsole.engine.workload import LengthDist


def register(sub) -> None:
    p = sub.add_parser("tune", help="auto-tune an engine's config for goodput under an SLO (Optuna TPE)")
    p.add_argument("--engine", required=True, help="the engine to tune (it is restarted on each trial)")
    p.add_argument("--workload", required=True, metavar="KIND=V",
                   help="the load of every trial: concurrency=N or rate=R (requests/s)")
    add_workload_flags(p)
    p.set_defaults(num_requests=48)
    p.add_argument("--budget", required=True, metavar="N|Mm", help="trials (12) or minutes (30m) of searching")
    p.add_argument("--knob", action="append", default=[], metavar="FIELD=LOW:HIGH|V1,V2",
                   help="a knob and its range or values (repeatable); default: batch size and token budget "
                        "around the running config")
    p.add_argument("--seed", type=int, default=0, help="the sampler's seed")
    p.add_argument("--top-k", type=int, default=3, help="candidates re-measured before one is recommended")
    p.add_argument("--repeats", type=int, default=3, help="re-measurements of each candidate")
    p.add_argument("--eta", type=int, default=3, help="successive halving: keep the top 1/eta at each rung")
    p.add_argument("--max-run", type=float, default=300.0, metavar="S", help="time bound of one load run")
    p.add_argument("--apply", action="store_true", help="apply the winner through the guarded apply")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_tune)


def build_settings(ns: argparse.Namespace, spec: dict) -> TuneSettings:
    try:
        loads = parse_loads([ns.workload])
        if len(loads) != 1:
            raise ValueError("--workload is one load level, e.g. concurrency=8")
        slo = Slo.parse(ns.slo)
        if not slo:
            raise ValueError("give an SLO (--slo p99_e2e_ms=2000,...): goodput is measured against it")
        lin, lout = LengthDist.parse(ns.input_len), LengthDist.parse(ns.output_len)
        plan = SweepPlan(engine=ns.engine, grid={}, loads=loads, slo=slo, repeats=1, num_requests=ns.num_requests,
                         input_len=lin, output_len=lout, warmup_requests=ns.warmup, ignore_eos=ns.ignore_eos,
                         max_run_s=ns.max_run)
        knobs = tuple(parse_knob(k) for k in ns.knob) or default_space(spec, int(loads[0].value))
        if len({k.name for k in knobs}) != len(knobs):
            raise ValueError("each knob once")
        need = workload_len_tokens(_max_len(lin), _max_len(lout))
        knobs = clamp_to_workload(knobs, need)
        return TuneSettings(plan, knobs, parse_budget(ns.budget), seed=ns.seed, eta=ns.eta, top_k=ns.top_k,
                            repeats=ns.repeats)
    except ValueError as e:
        raise CliError(str(e), EXIT_USAGE) from None


def _max_len(d: LengthDist) -> int:
    return d.high if d.kind == "uniform" else (d.max_value or d.value * (4 if d.kind == "lognormal" else 1))


def _progress(ev: TuneProgress) -> None:
    best = f"best so far {ev.best_req_s:.2f} req/s" if ev.best_req_s is not None else "no feasible trial yet"
    head = f"[trial {ev.trial}]" if ev.trial is not None else "[tune]"
    params = ", ".join(f"{k}={v}" for k, v in ev.params.items())
    print(f"{head} {params}{': ' if params else ''}{ev.message} ({best}, {ev.elapsed_s:.0f} s)",
          file=sys.stderr, flush=True)


def render(result: TuneResult) -> str:
    lines = [f"study {result.study}: {len(result.trials)} trials ({result.new_trials} this run), {result.status}", "",
             f"{'#':>3}  {'state':<11} {'goodput (req/s)':>15} {'requests':>8}  params"]
    for t in result.trials:
        g = f"{t.goodput_req_s:.2f}" if t.goodput_req_s is not None else "-"
        lines.append(f"{t.number:>3}  {t.state:<11} {g:>15} {t.requests:>8}  "
                     + ", ".join(f"{k}={v}" for k, v in t.params.items()) + (f"  ({t.reason})" if t.reason else ""))
    if result.remeasured:
        lines += ["", "re-measured:"]
        for m in result.remeasured:
            spread = f" ±{m.spread / 2:.0%}" if m.spread is not None else ""
            lines.append(f"  trial {m.number}: median {m.median_req_s:.2f} req/s{spread} over "
                         f"{len(m.goodputs_req_s)} runs  " + ", ".join(f"{k}={v}" for k, v in m.params.items()))
    w = result.winner
    lines += ["", f"recommended: {', '.join(f'{k}={v}' for k, v in w.params.items())} "
                  f"({w.median_req_s:.2f} req/s goodput)" if w else "no config met the constraints"]
    return "\n".join(lines)


def cmd_tune(ns: argparse.Namespace) -> int:
    from llmconsole.paths import resolve

    with daemon_client() as client:
        e = engine_target(client, ns.engine)
        settings = build_settings(ns, e["spec"])
        storage = resolve().data_dir / "tuning" / "studies.journal"
        result = asyncio.run(_run(settings, DaemonController(client, ns.engine), storage))
        applied = None
        if ns.apply and result.winner is not None and result.restored and result.status == "done":
            try:
                applied = client._call("POST", f"/engines/{ns.engine}/tune/apply",
                                       json={"overrides": result.winner.params, "slo": settings.plan.slo.as_dict(),
                                             "study": result.study})
            except DaemonError as err:
                raise CliError(f"the winner was not applied: {err}") from None
    if ns.json:
        print(json.dumps({**result.to_json(), "applied": applied}, indent=2, default=str))
    else:
        print(render(result))
        if applied:
            print(f"\napplied: config {applied['to_config_id']} (was {applied['from_config_id']}); "
                  f"the daemon watches the SLO for {applied['watch_s']:.0f} s and rolls back if it degrades")
    if not result.restored:
        raise CliError(f"the engine's original config was NOT restored: {result.restore_error}")
    return 130 if result.status == "cancelled" else 0


async def _run(settings: TuneSettings, ctl: DaemonController, storage):
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, stop.set)  # Ctrl-C: finish the trial, restore, keep the study
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    try:
        return await Tuner(settings, ctl, storage, on_progress=_progress, stop=stop).run()
    finally:
        loop.remove_signal_handler(signal.SIGINT)
        loop.remove_signal_handler(signal.SIGTERM)
