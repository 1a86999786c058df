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
from llmconsole.engine.metrics.latency import Slo
from llmconsole.engine.sweep.plan import SweepPlan, parse_loads
from llmconsole.engine.tune.tuner import Tuner, TuneProgress, TuneResult, TuneSettings
from llmconsole.engine.tune.ranges import EngineFacts, TuneSpace, derive_space
from llmconsole.engine.tune.search import SEARCHES
from llmconsole.engine.tune.space import Knob, clamp_to_workload, parse_budget, parse_knob, workload_len_tokens
from llmconsole.engine.load.workload import LengthDist


def register(sub) -> None:
    p = sub.add_parser("tune", help="auto-tune an engine's config for goodput under an SLO (Optuna TPE)")
    p.add_argument("--engine", required=True, help="the engine to tune (it is restarted on each trial)")
    p.add_argument("--workload", required=True, metavar="KIND=V",
                   help="the load of every trial: concurrency=N or rate=R (requests/s)")
    add_workload_flags(p)
    p.set_defaults(num_requests=48)
    p.add_argument("--budget", required=True, metavar="N|Mm", help="trials (12) or minutes (30m) of searching")
    p.add_argument("--knob", action="append", default=[], metavar="FIELD[=LOW:HIGH|V1,V2]",
                   help="a knob and its range or values (repeatable); a bare FIELD takes its range from the "
                        "planner, else the engine's limits; default: max_num_seqs and max_num_batched_tokens "
                        "(gateway_min_window / gateway_max_window move the gateway's window bounds)")
    p.add_argument("--search", choices=SEARCHES, default="pattern",
                   help="pattern: from the planner's start along one knob at a time, then TPE; tpe: TPE "
                        "throughout (from the same start)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the knobs, their ranges and where they come from, and the first trial; run nothing")
    p.add_argument("--seed", type=int, default=0, help="the sampler's seed")
    p.add_argument("--top-k", type=int, default=4,
                   help="candidates re-measured (raced in rounds) before one is recommended")
    p.add_argument("--repeats", type=int, default=3,
                   help="re-measurements per candidate: top-k x repeats runs at most, fewer once the race is decided")
    p.add_argument("--eta", type=int, default=3, help="successive halving: keep the top 1/eta at each rung")
    p.add_argument("--max-run", type=float, default=300.0, metavar="S", help="time bound of one load run")
    p.add_argument("--apply", action="store_true", help="apply the winner through the guarded apply")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=cmd_tune)


def build_settings(ns: argparse.Namespace, spec: dict, facts: EngineFacts | None = None) -> TuneSettings:
    return build(ns, facts or EngineFacts(model=str(spec.get("model", "")), spec=spec))[0]


def build(ns: argparse.Namespace, facts: EngineFacts) -> tuple[TuneSettings, TuneSpace]:
    """The settings of the tune and the space as derived (each knob's source, the first trial)."""
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
        knobs = tuple(parse_knob(k) for k in ns.knob) or _default_knobs(facts.spec)
        if len({k.name for k in knobs}) != len(knobs):
            raise ValueError("each knob once")
        need = workload_len_tokens(_max_len(lin), _max_len(lout))
        closed = loads[0].kind == "concurrency"
        space = derive_space(knobs, facts, input_len=_max_len(lin), output_len=_max_len(lout),
                             concurrency=int(loads[0].value) if closed else None)
        knobs = clamp_to_workload(space.knobs, need)
        settings = TuneSettings(plan, knobs, parse_budget(ns.budget), seed=ns.seed, eta=ns.eta, top_k=ns.top_k,
                                repeats=ns.repeats, start=space.start, search=getattr(ns, "search", "pattern"))
        return settings, space
    except ValueError as e:
        raise CliError(str(e), EXIT_USAGE) from None


def _default_knobs(spec: dict) -> tuple[Knob, ...]:
    """Batch size and token budget (the two knobs that move goodput most on any device), and the
    KV size when the engine runs with an explicit one; their ranges come from derive_space."""
    names = ["max_num_seqs", "max_num_batched_tokens"] + (["kv_cache_memory_bytes"]
                                                          if spec.get("kv_cache_memory_bytes") else [])
    return tuple(Knob(n) for n in names)


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
            lines.append(f"  trial {m.number}: mean {m.mean_req_s:.2f} req/s{spread} over "
                         f"{len(m.goodputs_req_s)} runs  " + ", ".join(f"{k}={v}" for k, v in m.params.items()))
    w = result.winner
    lines += ["", f"recommended: {', '.join(f'{k}={v}' for k, v in w.params.items())} "
                  f"({w.mean_req_s:.2f} req/s goodput)" if w else "no config met the constraints"]
    return "\n".join(lines)


def cmd_tune(ns: argparse.Namespace) -> int:
    from llmconsole.paths import resolve

    with daemon_client() as client:
        facts = engine_facts(client, ns.engine, ns.knob)
        settings, space = build(ns, facts)
        if ns.dry_run:
            print(f"tune {ns.engine}: {settings.budget.describe()}, search {settings.search}, study {settings.name}")
            print("\n".join("  " + line for line in space.describe()))
            return 0
        for line in space.describe():
            print(f"[tune] {line}", file=sys.stderr, flush=True)
        storage = resolve().data_dir / "tuning" / "studies.journal"
        result = asyncio.run(_run(settings, TuneController(client, ns.engine), storage))
        applied = None
        if ns.apply and result.winner is not None and result.restored and result.status == "done":
            try:
                applied = apply_winner(client, ns.engine, result, settings)
            except DaemonError as err:
                raise CliError(f"the winner was not applied: {err}") from None
    if ns.json:
        print(json.dumps({**result.to_json(), "applied": applied}, indent=2, default=str))
    else:
        print(render(result))
        if applied:
            print(f"\n{applied_text(applied)}")
    if not result.restored:
        raise CliError(f"the engine's original config was NOT restored: {result.restore_error}")
    return 130 if result.status == "cancelled" else 0


def apply_winner(client, engine: str, result: TuneResult, settings: TuneSettings) -> dict:
    """The winner through the daemon's guarded apply, which then watches the SLO and rolls back
    on its own if production degrades. The CLI's --apply and the console's apply both come here."""
    return client._call("POST", f"/engines/{engine}/tune/apply",
                        json={"overrides": result.winner.params, "slo": settings.plan.slo.as_dict(),
                              "study": result.study})


def applied_text(applied: dict) -> str:
    if applied["to_config_id"] == applied["from_config_id"]:
        return f"applied: the engine already runs the winner (config {applied['to_config_id']}); nothing restarted"
    return (f"applied: config {applied['to_config_id']} (was {applied['from_config_id']}); "
            f"the daemon watches the SLO for {applied['watch_s']:.0f} s and rolls back if it degrades")


def engine_facts(client, name: str, knobs: list[str]) -> EngineFacts:
    """What the knobs' ranges come from, as the daemon reports the engine (it must be ready);
    the gateway's window bounds only when a window knob is asked for."""
    e = engine_target(client, name)
    wants_window = any(k.partition("=")[0].replace("-", "_").startswith("gateway_") for k in knobs)
    window = _window_bounds(client, name) if wants_window else None
    return EngineFacts(model=str(e["model"]), device=str(e.get("device") or "cpu"), spec=dict(e["spec"]),
                       window=window)


def _window_bounds(client, name: str) -> dict[str, int]:
    try:
        w = client.window(name, trace_points=0)
    except DaemonError as err:
        raise CliError(f"the gateway's window cannot be tuned: {err}") from None
    return {"min_window": int(w["min_window"]), "max_window": int(w["max_window"])}


class TuneController(DaemonController):
    """The sweep's controller, and the gateway's window bounds: set there, no restart."""

    async def gateway_url(self) -> str:
        e = await asyncio.to_thread(self.client.engine, self.name)
        if not e or not e.get("gateway_url"):
            raise RuntimeError(f"engine {self.name} has no gateway door; the window cannot act")
        return e["gateway_url"]

    async def window(self) -> dict[str, int]:
        return await asyncio.to_thread(_window_bounds, self.client, self.name)

    async def set_window(self, bounds: dict[str, int]) -> None:
        """Raises ValueError when the gateway refuses the bounds (nothing changed there)."""
        try:
            await asyncio.to_thread(self.client.change_window, self.name, **bounds)
        except DaemonError as err:
            raise ValueError(str(err)) from None


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
