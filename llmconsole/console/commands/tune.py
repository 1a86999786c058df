"""`llmconsole tune ...`: find the config with the best goodput under an SLO, in few restarts.

The daemon runs the trials (console/run_follow.py follows the run), exactly as for a tune started in
the console; the study is a journal under the daemon's data dir, so running the same command
again resumes it. `--apply` moves the engine to the winner through the daemon's guarded apply,
which then watches the SLO and rolls back on its own if production degrades.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from llmconsole.console import run_follow
from llmconsole.console.cli_common import EXIT_USAGE, CliError, daemon_client
from llmconsole.console.client import DaemonClient, DaemonError
from llmconsole.console.client import engine_facts as client_engine_facts
from llmconsole.console.commands.load import add_workload_flags, engine_target
from llmconsole.engine.tune.guard import applied_text
from llmconsole.engine.tune.ranges import EngineFacts, TuneSpace
from llmconsole.engine.tune.request import TuneRequest, default
from llmconsole.engine.tune.search import SEARCHES
from llmconsole.engine.tune.settings import TuneSettings
from llmconsole.engine.tune.tuner import TuneProgress, TuneResult
from llmconsole.engine.tune.verdict import infeasible_lines


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("tune", help="auto-tune an engine's config for goodput under an SLO (Optuna TPE)")
    p.add_argument("--engine", required=True, help="the engine to tune (it is restarted on each trial)")
    p.add_argument(
        "--workload",
        required=True,
        metavar="KIND=V",
        help="the load of every trial: concurrency=N or rate=R (requests/s)",
    )
    add_workload_flags(p)
    p.set_defaults(**{f: default(f) for f in ("num_requests", "input_len", "output_len", "warmup", "ignore_eos")})
    p.add_argument("--budget", required=True, metavar="N|Mm", help="trials (12) or minutes (30m) of searching")
    p.add_argument(
        "--knob",
        action="append",
        default=[],
        metavar="FIELD[=LOW:HIGH|V1,V2]",
        help="a knob and its range or values (repeatable); a bare FIELD takes its range from the "
        "planner, else the engine's limits; default: max_num_seqs and max_num_batched_tokens "
        "(gateway_min_window / gateway_max_window move the gateway's window bounds)",
    )
    p.add_argument(
        "--search",
        choices=SEARCHES,
        default=default("search"),
        help="pattern: from the planner's start along one knob at a time, then TPE; tpe: TPE "
        "throughout (from the same start)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the knobs, their ranges and where they come from, and exactly what trial 0 runs; run nothing",
    )
    p.add_argument("--seed", type=int, default=default("seed"), help="the sampler's seed")
    p.add_argument(
        "--top-k",
        type=int,
        default=default("top_k"),
        help="candidates re-measured (raced in rounds) before one is recommended",
    )
    p.add_argument(
        "--repeats",
        type=int,
        default=default("repeats"),
        help="re-measurements per candidate: top-k x repeats runs at most, fewer once the race is decided",
    )
    p.add_argument(
        "--eta", type=int, default=default("eta"), help="successive halving: keep the top 1/eta at each rung"
    )
    p.add_argument(
        "--max-run", type=float, default=default("max_run_s"), metavar="S", help="time bound of one load run"
    )
    p.add_argument("--apply", action="store_true", help="apply the winner through the guarded apply")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument(
        "--detach",
        action="store_true",
        help="start the tune in the daemon, print its run id and return (--apply is then not done)",
    )
    p.set_defaults(func=cmd_tune)


def tune_request(ns: argparse.Namespace) -> TuneRequest:
    try:
        return TuneRequest(
            engine=ns.engine,
            workload=ns.workload,
            slo=ns.slo,
            budget=ns.budget,
            knobs=ns.knob,
            input_len=ns.input_len,
            output_len=ns.output_len,
            num_requests=ns.num_requests,
            warmup=ns.warmup,
            ignore_eos=ns.ignore_eos,
            search=ns.search,
            seed=ns.seed,
            top_k=ns.top_k,
            repeats=ns.repeats,
            eta=ns.eta,
            max_run_s=ns.max_run,
        )
    except ValueError as e:
        raise CliError(str(e), EXIT_USAGE) from None


def build(ns: argparse.Namespace, facts: EngineFacts) -> tuple[TuneSettings, TuneSpace]:
    """The settings of the tune and the space as derived (each knob's source, the first trial)."""
    try:
        return tune_request(ns).settings(facts)
    except ValueError as e:
        raise CliError(str(e), EXIT_USAGE) from None


def _progress(ev: TuneProgress) -> None:
    best = f"best so far {ev.best_req_s:.2f} req/s" if ev.best_req_s is not None else "no feasible trial yet"
    head = f"[trial {ev.trial}]" if ev.trial is not None else "[tune]"
    params = ", ".join(f"{k}={v}" for k, v in ev.params.items())
    print(
        f"{head} {params}{': ' if params else ''}{ev.message} ({best}, {ev.elapsed_s:.0f} s)",
        file=sys.stderr,
        flush=True,
    )


def render(result: TuneResult) -> str:
    lines = [
        f"study {result.study}: {len(result.trials)} trials ({result.new_trials} this run), {result.status}",
        "",
        f"{'#':>3}  {'state':<11} {'goodput (req/s)':>15} {'requests':>8}  params",
    ]
    for t in result.trials:
        g = f"{t.goodput_req_s:.2f}" if t.goodput_req_s is not None else "-"
        lines.append(
            f"{t.number:>3}  {t.state:<11} {g:>15} {t.requests:>8}  "
            + ", ".join(f"{k}={v}" for k, v in t.params.items())
            + (f"  ({t.reason})" if t.reason else "")
        )
    if result.remeasured:
        lines += ["", "re-measured:"]
        for m in result.remeasured:
            spread = f" ±{m.spread / 2:.0%}" if m.spread is not None else ""
            lines.append(
                f"  trial {m.number}: mean {m.mean_req_s:.2f} req/s{spread} over "
                f"{len(m.goodputs_req_s)} runs  " + ", ".join(f"{k}={v}" for k, v in m.params.items())
            )
    w = result.winner
    lines += [
        "",
        f"recommended: {', '.join(f'{k}={v}' for k, v in w.params.items())} ({w.mean_req_s:.2f} req/s goodput)"
        if w
        else "no config met the constraints",
    ]
    if w is None:
        lines += infeasible_lines(result.trials)
    return "\n".join(lines)


def _progress_event(ev: dict[str, Any]) -> None:
    if ev.get("event") == "prior":  # the space as derived, before trial 0
        for line in ev.get("space") or ():
            print(f"[tune] {line}", file=sys.stderr, flush=True)
        return
    _progress(TuneProgress.from_json(ev))


def cmd_tune(ns: argparse.Namespace) -> int:
    if ns.detach and ns.apply:
        raise CliError("--apply waits for the winner; it cannot be given with --detach", EXIT_USAGE)
    with daemon_client() as client:
        facts = engine_facts(client, ns.engine, ns.knob)
        settings, space = build(ns, facts)
        if ns.dry_run:
            print(f"tune {ns.engine}: {settings.budget.describe()}, search {settings.search}, study {settings.name}")
            print("\n".join("  " + line for line in space.describe()))
            return 0
        record = run_follow.start(client, "tune", tune_request(ns).model_dump(mode="json"))
        if ns.detach:
            return run_follow.detached(record, ns.json)
        return follow_run(client, record, apply=ns.apply, as_json=ns.json, owner=True)


def follow_run(client: DaemonClient, record: dict[str, Any], *, apply: bool, as_json: bool, owner: bool) -> int:
    """Follow a tune run to its end and print it as `tune` always has; `apply`: the winner
    through the guarded apply once the run is done and the engine is back."""
    end = run_follow.follow(client, record, _progress_event, owner=owner)
    outcome = end.get("outcome")
    if not outcome:
        raise CliError(f"run {end['id']}: the tune failed: {end.get('error')}")
    result = TuneResult.from_json(outcome)
    applied = None
    if apply and result.winner is not None and result.restored and result.status == "done":
        try:
            applied = apply_winner(client, end["engine"], result, outcome["slo"])
        except DaemonError as err:
            raise CliError(f"the winner was not applied: {err}") from None
    if as_json:
        why = infeasible_lines(result.trials) if result.winner is None else []
        print(json.dumps({**outcome, "applied": applied, "no_winner_why": why}, indent=2, default=str))
    else:
        print(render(result))
        if applied:
            print(f"\n{applied_text(applied)}")
    if not result.restored:
        raise CliError(f"the engine's original config was NOT restored: {result.restore_error}")
    return run_follow.EXIT_INTERRUPTED if result.status == "cancelled" else 0


def apply_winner(client: DaemonClient, engine: str, result: TuneResult, slo: dict[str, Any]) -> dict[str, Any]:
    """The winner through the daemon's guarded apply, which then watches the SLO and rolls back
    on its own if production degrades."""
    if result.winner is None:
        raise ValueError(f"study {result.study} has no winner to apply")
    return client.apply_tuned(engine, result.winner.params, slo, result.study)


def engine_facts(client: DaemonClient, name: str, knobs: list[str]) -> EngineFacts:
    """What the knobs' ranges come from, as the daemon reports the engine (it must be ready);
    the gateway's window bounds only when a window knob is asked for."""
    engine_target(client, name)  # the CLI's own words for an unknown or unready engine
    wants_window = TuneRequest(engine=name, workload="concurrency=1", budget="1", knobs=knobs).wants_window()
    try:
        return client_engine_facts(client, name, with_window=wants_window)
    except DaemonError as err:
        raise CliError(str(err)) from None
