"""How long a sweep or a tune will take, said before it starts, from what the engine shows now.

A run's time is its restarts (each about as long as the engine's last start took: its status
has the launch and ready times) and its load runs (each request about as long as the engine's
recent median TTFT plus a token's time per output token, the concurrency at a time). It is an
estimate and says what it rests on; where the engine has served nothing lately it says so
rather than guess.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from llmconsole.console.tui.views.run import fmt_duration
from llmconsole.console.tui.views.status import EngineView
from llmconsole.engine.load.workload import LengthDist
from llmconsole.engine.sweep.plan import LoadLevel, SweepPlan
from llmconsole.engine.tune.settings import TuneSettings

FALLBACK_START_S = 60.0  # a restart where the engine's own start time is not known


def typical_len(d: LengthDist) -> float:
    if d.kind == "uniform" and d.high is not None:
        return (d.value + d.high) / 2
    return float(d.value)


def request_s(engine: EngineView | None, output_tokens: float) -> float | None:
    """One request's time from the engine's recent medians, or None if it served nothing lately."""
    if engine is None:
        return None
    ttft, tpot = engine.metric("p50_ttft_s"), engine.metric("p50_tpot_s") or engine.metric("p50_itl_s")
    if ttft is None or tpot is None:
        return None
    return ttft + output_tokens * tpot


def run_s(load: LoadLevel, requests: int, per_request_s: float) -> float:
    if load.kind == "rate":
        return requests / max(load.value, 1e-9)
    return math.ceil(requests / max(1.0, load.value)) * per_request_s


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def sweep_size_text(plan: SweepPlan) -> str:
    """`2 configs x 2 loads = 4 load runs of 16 requests`: what the sweep runs, as a product
    a reader can check (x 3 repeats where each point is run more than once)."""
    configs, loads = len(plan.server_points()), len(plan.loads)
    factors = [_count(configs, "config"), _count(loads, "load")]
    if plan.repeats > 1:
        factors.append(_count(plan.repeats, "repeat"))
    runs = configs * loads * plan.repeats
    return f"{' x '.join(factors)} = {_count(runs, 'load run')} of {plan.num_requests} requests"


def _restart_s(engine: EngineView | None) -> tuple[float, str]:
    last = engine.last_start_s if engine is not None else None
    if last is None:
        return FALLBACK_START_S, f"~{fmt_duration(FALLBACK_START_S)} a restart (its last start is not known)"
    return last, f"~{fmt_duration(last)} a restart, as its last start took"


def sweep_text(plan: SweepPlan, spec: Mapping[str, Any], engine: EngineView | None) -> str:
    """`It takes about 4 min 10 s: 3 restarts (~35 s each, as its last start took) and 12 runs
    (~8 s each at its recent latency).`"""
    servers = plan.server_points()
    restarts = sum(1 for p in servers if any(spec.get(k) != v for k, v in p.items()))
    restarts += 1 if restarts else 0  # and back to the original config
    per = request_s(engine, typical_len(plan.output_len))
    runs = len(servers) * len(plan.loads) * plan.repeats
    restart_s, restart_why = _restart_s(engine)
    if per is None:
        load_text = f"{runs} load run(s) whose length it cannot tell: the engine served nothing lately"
        total = None
    else:
        each = [run_s(lv, plan.num_requests + plan.warmup_requests, per) for lv in plan.loads]
        load_s = len(servers) * plan.repeats * sum(each)
        load_text = f"{runs} load run(s), ~{fmt_duration(load_s / max(1, runs))} each at its recent latency"
        total = load_s + restarts * restart_s
    parts = ([f"{restarts} restart(s) ({restart_why})"] if restarts else []) + [load_text]
    if total is not None:
        head = f"It takes about {fmt_duration(total)}"
    elif restarts:
        head = f"It takes at least {fmt_duration(restarts * restart_s)}"
    else:
        head = "Its length is not known"
    return f"{head}: {' and '.join(parts)}."


def tune_text(settings: TuneSettings, engine: EngineView | None) -> str:
    """The budget in time: a budget in minutes is its own estimate; one in trials is each trial's
    restart and run, and the re-measurement of the best ones."""
    if settings.budget.minutes is not None:
        return f"It takes about {fmt_duration(settings.budget.minutes * 60)} (its budget), and then re-measures."
    trials = settings.budget.trials or 0
    restart_s, restart_why = _restart_s(engine)
    per = request_s(engine, typical_len(settings.plan.output_len))
    remeasure = settings.top_k * settings.repeats
    if per is None:
        return (
            f"It takes at least {fmt_duration((trials + remeasure) * restart_s)}: up to {trials} trials and "
            f"{remeasure} re-measurement runs, each a restart ({restart_why}) and a load run whose length it "
            "cannot tell (the engine served nothing lately)."
        )
    run = run_s(settings.load, settings.plan.num_requests + settings.plan.warmup_requests, per)
    total = (trials + remeasure) * (restart_s + run)
    return (
        f"It takes about {fmt_duration(total)}: up to {trials} trials and {remeasure} re-measurement runs, "
        f"each a restart ({restart_why}) and a load run of ~{fmt_duration(run)} at its recent latency."
    )
