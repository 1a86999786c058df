"""What the auto-tuner searches and the pure rules it searches by.

Kept apart from the runner (tuner.py) so the rules are plain functions with fast tests: the knobs
and their ranges, the budget, the study's name, successive halving on the number of requests,
what a trial's outcome holds and when it breaks the constraints. Which candidates are
re-measured and which one wins: select.py.

A knob is an engine spec field. Its values are a list (categorical: kernel, or a short list of
sizes) or an integer range searched on a log scale (batch sizes and token budgets matter by
ratio, not by difference). Without knobs given, the space comes from the engine's own config
and the workload's needs (`default_space`).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

# Spec fields the tuner may move. Anything else (the model, ports, secrets) stays as it is.
SPEC_KNOBS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "kv_cache_memory_bytes",
    "gpu_memory_utilization",
    "kernel",
)
# The gateway's window bounds: set at the gateway (no restart), and the trial's load then goes
# through the gateway, where the window acts. Knob name -> the window setting it moves.
WINDOW_KNOBS = {"gateway_min_window": "min_window", "gateway_max_window": "max_window"}
TUNABLE = SPEC_KNOBS + tuple(WINDOW_KNOBS)


def split_params(params: dict[str, Any]) -> tuple[dict[str, Any], dict[str, int]]:
    """(spec fields, window settings) of a trial's config."""
    return (
        {k: v for k, v in params.items() if k not in WINDOW_KNOBS},
        {WINDOW_KNOBS[k]: v for k, v in params.items() if k in WINDOW_KNOBS},
    )


@dataclass(frozen=True)
class Knob:
    name: str
    choices: tuple[Any, ...] = ()  # categorical, or
    low: int | None = None  # an integer range, searched on a log scale
    high: int | None = None

    def describe(self) -> str:
        return (
            f"{self.name}={','.join(map(str, self.choices))}" if self.choices else f"{self.name}={self.low}:{self.high}"
        )

    @property
    def open(self) -> bool:
        """Named without values: its range is still to be derived (ranges.py)."""
        return not self.choices and self.low is None

    @property
    def bounds(self) -> tuple[int, int]:
        """(low, high) of a range knob; ValueError for one with choices or still open."""
        if self.low is None or self.high is None:
            raise ValueError(f"knob {self.name} is not an integer range")
        return self.low, self.high

    def size(self) -> int:
        if self.choices:
            return len(self.choices)
        low, high = self.bounds
        return high - low + 1


def parse_knob(text: str) -> Knob:
    """`max_num_seqs=1:32` (a range) or `kernel=stock,custom` / `max_num_seqs=2,8,32` (choices).
    A bare `max_num_seqs` is a knob whose range comes from the planner (ranges.py): it is
    returned without values.

    Raises ValueError naming the item, the field or the bound that is wrong.
    """
    name, sep, values = text.partition("=")
    name = name.strip().replace("-", "_")
    if name not in TUNABLE:
        raise ValueError(f"knob {name!r} cannot be tuned (tunable: {', '.join(TUNABLE)})")
    if not sep:
        return Knob(name)
    if not values.strip():
        raise ValueError(f"knob {text!r} is not FIELD, FIELD=LOW:HIGH or FIELD=V1,V2,...")
    m = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", values)
    if m:
        lo, hi = int(m.group(1)), int(m.group(2))
        if not 1 <= lo <= hi:
            raise ValueError(f"knob {text!r}: need 1 <= LOW <= HIGH")
        return Knob(name, low=lo, high=hi)
    out: list[Any] = []
    for v in (x.strip() for x in values.split(",")):
        if not v:
            continue
        try:
            out.append(json.loads(v))
        except ValueError:
            out.append(v)
    if name == "kernel" and any(v not in ("stock", "custom") for v in out):
        raise ValueError(f"knob {text!r}: kernel is stock or custom")
    if name == "gpu_memory_utilization" and any(not (isinstance(v, (int, float)) and 0 < v <= 1) for v in out):
        raise ValueError(f"knob {text!r}: gpu_memory_utilization values are in (0, 1]")
    if name not in ("kernel", "gpu_memory_utilization") and any(not (isinstance(v, int) and v >= 1) for v in out):
        raise ValueError(f"knob {text!r}: {name} values are whole numbers >= 1")
    if not out:
        raise ValueError(f"knob {text!r} has no values")
    return Knob(name, choices=tuple(dict.fromkeys(out)))


def workload_len_tokens(max_input: int, max_output: int) -> int:
    """The shortest max_model_len that serves every request of the workload."""
    return max_input + max_output


def clamp_to_workload(knobs: Sequence[Knob], needed_len: int) -> tuple[Knob, ...]:
    """max_model_len below what the workload needs would fail requests, not tune anything:
    such values are dropped (a range is raised to start at the need). Raises ValueError when
    nothing of the knob is left."""
    out = []
    for k in knobs:
        if k.name == "max_model_len":
            if k.choices:
                kept = tuple(v for v in k.choices if v >= needed_len)
                if not kept:
                    raise ValueError(f"every max_model_len given is below the {needed_len} tokens the workload needs")
                k = Knob(k.name, choices=kept)
            else:
                low, high = k.bounds
                if high < needed_len:
                    raise ValueError(f"max_model_len range tops out below the {needed_len} tokens the workload needs")
                k = Knob(k.name, low=max(low, needed_len), high=high)
        out.append(k)
    return tuple(out)


def default_space(spec: dict[str, Any], concurrency_hint: int) -> tuple[Knob, ...]:
    """Batch size and per-step token budget around the running config: the two knobs that move
    goodput most on any device (the planner's ranges: ranges.py)."""
    seqs = int(spec.get("max_num_seqs") or 256)
    top = max(4, min(256, 2 * max(seqs, concurrency_hint)))
    knobs = [Knob("max_num_seqs", low=1, high=top)]
    mbt = spec.get("max_num_batched_tokens")
    base = int(mbt) if mbt else 2048
    knobs.append(
        Knob("max_num_batched_tokens", choices=tuple(sorted({max(64, base // 4), max(64, base // 2), base, base * 2})))
    )
    return tuple(knobs)


@dataclass(frozen=True)
class Budget:
    trials: int | None = None
    minutes: float | None = None

    def describe(self) -> str:
        return f"{self.trials} trials" if self.trials is not None else f"{self.minutes:g} minutes"


def parse_budget(text: str) -> Budget:
    """`12` (trials) or `30m` / `30min` (minutes of tuning)."""
    t = text.strip().lower()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(m|min|minutes)", t)
    if m:
        minutes = float(m.group(1))
        if minutes <= 0:
            raise ValueError("a budget in minutes must be above 0")
        return Budget(minutes=minutes)
    if t.isdigit() and int(t) >= 1:
        return Budget(trials=int(t))
    raise ValueError(f"budget {text!r} is not a number of trials (12) or of minutes (30m)")


def startup_trials(budget: Budget) -> int:
    """Random trials before TPE models the space: Optuna's usual four, but at most half a
    budget in trials (at least one), so a small budget is partly guided search. (Replays on a
    measured 3x3 grid with 3 trials: one random start models too little, two does best.)"""
    if budget.trials is None:
        return 4
    return max(1, min(4, (budget.trials + 1) // 2))


def study_name(engine: str, workload: dict[str, Any], slo: dict[str, float], knobs: Sequence[Knob]) -> str:
    """Same engine, workload, SLO and space -> the same study, so a rerun resumes it."""
    key = json.dumps({"workload": workload, "slo": slo, "space": [k.describe() for k in knobs]}, sort_keys=True)
    return f"{engine}-{hashlib.sha1(key.encode()).hexdigest()[:12]}"


# --- successive halving ---------------------------------------------------------------------------


def halving_rungs(full_requests: int, eta: int = 3, min_requests: int = 8) -> tuple[int, ...]:
    """Request counts of the rungs, shortest first, ending at the full count: each rung is
    `eta` times shorter than the next. A trial is measured at a rung, and only goes on to the
    next if it ranks in the top 1/eta of the trials measured there."""
    rungs = [full_requests]
    while rungs[0] // eta >= min_requests:
        rungs.insert(0, rungs[0] // eta)
    return tuple(rungs)


def keep_going(value: float, peers: Sequence[float], eta: int = 3, min_peers: int = 2, margin: float = 0.0) -> bool:
    """Whether a trial's goodput at a rung earns the next rung: it must reach the value that
    marks the top 1/eta of the earlier trials at that rung, less `margin` (a share of it). A
    short rung is a few requests, and on a shared host their goodput varies by a quarter or
    more, so only a trial clearly below the cut is stopped. With fewer than `min_peers`
    measured there, nothing is known to compare against, so it goes on."""
    if len(peers) < min_peers:
        return True
    ranked = sorted(peers, reverse=True)
    cut = ranked[max(0, math.ceil(len(ranked) / eta) - 1)]
    return value >= cut * (1.0 - margin)


# --- constraints ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrialOutcome:
    """One trial as the study keeps it: its params, its objective and whether it was feasible."""

    number: int
    params: dict[str, Any]
    state: str  # complete | pruned | infeasible | interrupted
    goodput_req_s: float | None
    requests: int  # at the last rung it reached
    reason: str | None = None


def constraint_value(status: str, slo_attainment: float | None, bad_attainment: float) -> float:
    """Optuna's constraint (<= 0 feasible): a config that did not start or failed requests is
    out (1.0); one that broke the SLO for most requests is out by how far it missed."""
    if status in ("start_failed", "failed"):
        return 1.0
    if slo_attainment is None:
        return 0.0
    return bad_attainment - slo_attainment if slo_attainment < bad_attainment else 0.0
