"""How the tuner picks its next config: start where the planner points, climb the ordered knobs.

A budget of a third of a grid is too small for a model-free search to beat chance by much (on
a 3x3 grid TPE reached 95% of the best in 16 of 40 seeds, random search in ~33%). The tuner
knows two things a generic sampler does not:

- where to start: the planner's batch size for the workload, capped by what the KV cache holds
  for the workload's lengths (ranges.py), the rest of the config as it runs now;
- the shape along the main knob: goodput against max_num_seqs rises until the SLO or the KV
  capacity breaks it, and then falls: it has one peak.

So the search is a pattern search over a lattice of each knob's values: along one knob at a
time, from the best config so far, it brackets the peak (probing the middle of the larger
unexplored gap beside the best point, as a golden-section search does) and moves on to the
next knob once both neighbours of the best are measured; a better config found on one knob
re-opens the others (its neighbours only: the peak rarely moves far). One measurement on a
shared host can rank two close configs either way, so the configs measured within noise of the
best (LEADER_TIE) get their categorical knobs tried too before the re-checks around the best;
settled there, it checks the runner-up's neighbours; then it has nothing left to ask and TPE
spends the rest of the budget with the whole history to learn from.

Pure functions of the history, so the tuner and the benchmark's replay run the same code.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llmconsole.engine.tune.space import Knob

SEARCHES = ("pattern", "tpe")
MAIN_KNOB = "max_num_seqs"
_RANGE_POINTS = 10  # a range knob is walked on about this many log-spaced values
# Configs within this share of the best count as tied with it: about one standard deviation of
# the difference between two single runs at 8% noise each, the least a shared host shows.
LEADER_TIE = 0.12
RUNNERS_UP = 1  # configs after the best whose neighbours are checked before TPE


@dataclass(frozen=True)
class Probe:
    """A measured config: its goodput, or None when it was infeasible (did not start, broke the SLO)."""

    params: dict[str, Any]
    value: float | None


def is_ordered(knob: Knob) -> bool:
    return not knob.choices or all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in knob.choices)


def lattice(knob: Knob) -> tuple[Any, ...]:
    """The values the pattern search walks: a list as given (numbers sorted), a range as about
    ten log-spaced whole numbers from its low to its high end."""
    if knob.choices:
        return tuple(sorted(knob.choices)) if is_ordered(knob) else tuple(knob.choices)
    lo, hi = knob.bounds
    if hi - lo + 1 <= _RANGE_POINTS:
        return tuple(range(lo, hi + 1))
    ratio = (hi / lo) ** (1 / (_RANGE_POINTS - 1))
    return tuple(sorted({lo, hi, *(int(round(lo * ratio**i)) for i in range(1, _RANGE_POINTS - 1))}))


def snap(knob: Knob, value: Any) -> Any:
    """The lattice value nearest `value` (by ratio for numbers); the first value when it is unknown."""
    values = lattice(knob)
    if value in values:
        return value
    if value is None or not is_ordered(knob) or not isinstance(value, (int, float)) or value <= 0:
        return values[len(values) // 2] if is_ordered(knob) else values[0]
    return min(values, key=lambda v: (abs(math.log(v / value)), v))


def start_config(knobs: Sequence[Knob], start: dict[str, Any]) -> dict[str, Any]:
    """The first trial: the given start (the planner's and the running config's values) on the lattice."""
    return {k.name: snap(k, start.get(k.name)) for k in knobs}


def _key(params: dict[str, Any]) -> str:
    return json.dumps(params, sort_keys=True, default=str)


def line_next(values: dict[int, float], n: int, local: bool = False) -> int | None:
    """The next index to probe on one ordered axis of `n` values, given the goodput of those
    already probed (-inf: infeasible), assuming one peak; None once both neighbours of the best
    are probed (or off the axis).

    The best probe and the nearest probes on either side bracket the peak; the next probe is the
    middle of the larger unexplored gap beside the best (towards larger values on a tie, where
    a batch size usually still gains). `local` probes only the best's own neighbours: a re-check
    of an axis already bracketed at another config, where the peak has likely not moved far.
    """
    if not values:
        return n // 2
    best = max(values, key=lambda i: (values[i], -i))
    lo = max((i for i in values if i < best), default=-1)
    hi = min((i for i in values if i > best), default=n)
    left, right = best - lo - 1, hi - best - 1
    if left <= 0 and right <= 0:
        return None
    if local:
        return best + 1 if right >= left else best - 1
    return (best + hi) // 2 if right >= left else (lo + best + 1) // 2


def _axis_order(knobs: Sequence[Knob]) -> list[Knob]:
    main = [k for k in knobs if k.name == MAIN_KNOB and is_ordered(k)]
    return main + [k for k in knobs if k not in main]


def next_config(
    history: Sequence[Probe],
    knobs: Sequence[Knob],
    start: dict[str, Any],
    main_only: bool = False,
    tie: float = LEADER_TIE,
) -> dict[str, Any] | None:
    """The pattern search's next config, or None when every knob is settled at the best config
    (or every config was probed): the caller then asks TPE. Configs measured within `tie` of
    the best are tied with it (tie=0: the best alone leads)."""
    if not knobs:
        return None
    first = start_config(knobs, start)
    seen: dict[str, float] = {}
    for p in history:
        v = -math.inf if p.value is None else p.value
        k = _key(p.params)
        seen[k] = max(seen.get(k, -math.inf), v)
    if _key(first) not in seen:
        return first
    feasible = [(p.value, p.params) for p in history if p.value is not None]
    ranked = list({_key(params): params for _, params in sorted(feasible, key=lambda vp: -vp[0])}.values())
    incumbent = dict(ranked[0]) if ranked else first
    axes = _axis_order(knobs)[:1] if main_only else _axis_order(knobs)
    bracketed = {k.name for k in axes if _searched(history, k)}
    # First every knob gets its own search from the best config; then re-checks of the knobs
    # already searched, around the best config, one neighbour at a time.
    for knob in [k for k in axes if k.name not in bracketed]:
        cand = _next_on_axis(knob, incumbent, seen, local=False, feasible=bool(feasible))
        if cand is not None:
            return cand
    # The knobs without a settled peak (a kernel: a category has no shape that carries over from
    # one config to the next) are tried at the configs tied with the best too, before any
    # re-check: one run decides which of two tied configs leads, and the search must not follow
    # a coin toss down one branch (in replays, that was most of the misses of the peak).
    for other in _tied(ranked, seen, tie)[1:]:
        for knob in [k for k in axes if k.name not in bracketed]:
            cand = _next_on_axis(knob, dict(other), seen, local=True, feasible=True)
            if cand is not None:
                return cand
    for knob in [k for k in axes if k.name in bracketed]:
        cand = _next_on_axis(knob, incumbent, seen, local=True, feasible=bool(feasible))
        if cand is not None:
            return cand
    # Settled around the best. One measurement misleads on a shared host, so the runner-up
    # (within reach of the best) gets the same neighbourhood check before TPE takes over.
    for other in ranked[1 : RUNNERS_UP + 1]:
        for knob in axes:
            cand = _next_on_axis(knob, dict(other), seen, local=True, feasible=True)
            if cand is not None:
                return cand
    return None


def _tied(ranked: list[dict[str, Any]], seen: dict[str, float], tie: float) -> list[dict[str, Any]]:
    """The feasible configs measured within `tie` (a share) of the best, best first."""
    if not ranked:
        return []
    top = seen[_key(ranked[0])]
    return [p for p in ranked if seen[_key(p)] >= top * (1 - tie)]


def _searched(history: Sequence[Probe], knob: Knob) -> bool:
    """Whether the knob's own search has settled at some config: its peak there is bracketed."""
    if not is_ordered(knob):
        return False
    values = lattice(knob)
    lines: dict[str, dict[int, float]] = {}
    for p in history:
        if p.params.get(knob.name) in values:
            rest = _key({k: v for k, v in p.params.items() if k != knob.name})
            lines.setdefault(rest, {})[values.index(p.params[knob.name])] = -math.inf if p.value is None else p.value
    return any(len(line) >= 2 and line_next(line, len(values)) is None for line in lines.values())


def _next_on_axis(
    knob: Knob, incumbent: dict[str, Any], seen: dict[str, float], *, local: bool, feasible: bool
) -> dict[str, Any] | None:
    values = lattice(knob)
    if not is_ordered(knob):
        return next(
            ({**incumbent, knob.name: v} for v in values if _key({**incumbent, knob.name: v}) not in seen), None
        )
    line = {
        i: seen[_key({**incumbent, knob.name: v})]
        for i, v in enumerate(values)
        if _key({**incumbent, knob.name: v}) in seen
    }
    if not feasible and knob.name == MAIN_KNOB:
        # Nothing has run yet: a config that did not start is most often too large, so halve
        # towards the small end.
        low = min(line, default=len(values))
        i = low // 2 if low > 0 else None
    else:
        i = line_next(line, len(values), local=local)
    return {**incumbent, knob.name: values[i]} if i is not None and i not in line else None


def encode(params: dict[str, Any], knobs: Sequence[Knob]) -> dict[str, Any]:
    """Params as the sampler stores them (tuner.suggest_params): a number list by its position."""
    out = {}
    for k in knobs:
        v = params[k.name]
        out[k.name] = sorted(k.choices).index(v) if k.choices and is_ordered(k) else v
    return out
