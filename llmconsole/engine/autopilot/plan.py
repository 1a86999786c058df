"""What the autopilot turns on, for one SLO: pure, checked before anything changes.

The SLO is the load generator's (`p99_e2e_ms=2000`, `ttft_ms=500`, ...). The PID window holds
one latency: the SLO's TTFT target when it has one (the window decides when a request starts,
and a queue shows first in TTFT), else its end-to-end or TPOT target. The scheduled tune and
the standby answer the whole SLO.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from llmconsole.engine.metrics.latency import Slo

_SIGNAL_ORDER = ("ttft", "e2e", "tpot")
DEFAULT_TUNE_INTERVAL_S = 4 * 3600.0


@dataclass(frozen=True)
class AutopilotPlan:
    slo: Slo
    mode: bool = True  # the auto memory-mode policy
    standby: bool = True  # the standby response to the SLO-burning alert
    standby_for_s: float | None = None  # how long the SLO must burn first (None: the rule's own)
    tune_interval_s: float | None = DEFAULT_TUNE_INTERVAL_S  # None: no scheduled tune
    tune_budget_trials: int = 4
    tune_input_len: str = "64"
    tune_quiet_window_s: float = 600.0  # the tune waits until this long's arrivals are quiet
    window_bounds: tuple[int, int] | None = None  # (min, max); None: the group's own

    def __post_init__(self) -> None:
        if not self.slo:
            raise ValueError("the autopilot needs an SLO, e.g. --slo p99_e2e_ms=2000")
        if not any(t.metric in _SIGNAL_ORDER for t in self.slo.targets):
            raise ValueError("the SLO needs a ttft, e2e or tpot target for the window to hold (itl alone is not one)")
        if self.tune_interval_s is not None and not self.tune_interval_s >= 10:
            raise ValueError("the tune interval must be at least 10 s")
        if self.standby_for_s is not None and not self.standby_for_s >= 0:
            raise ValueError("standby_for_s must be at least 0 s")
        if not self.tune_quiet_window_s > 0:
            raise ValueError("the tune's quiet window must be above 0 s")
        if self.tune_budget_trials < 1:
            raise ValueError("the tune budget must be at least 1 trial")
        if self.window_bounds is not None and not 1 <= self.window_bounds[0] <= self.window_bounds[1]:
            raise ValueError(f"window bounds {self.window_bounds} are not 1 <= min <= max")

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["slo"] = self.slo.as_dict()
        d["window_bounds"] = list(self.window_bounds) if self.window_bounds else None
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> AutopilotPlan:
        """From the API's body; ValueError (or TypeError: an unknown field) names what is wrong."""
        d = dict(d)
        slo = d.pop("slo", None)
        if not isinstance(slo, dict):
            raise ValueError('give the SLO as an object: {"slo": {"p99_e2e_ms": 2000}}')
        bounds = d.pop("window_bounds", None)
        unknown = set(d) - {f for f in cls.__dataclass_fields__ if f not in ("slo", "window_bounds")}
        if unknown:
            raise ValueError(f"unknown autopilot settings: {', '.join(sorted(unknown))}")
        for key in ("mode", "standby"):
            if key in d and not isinstance(d[key], bool):
                raise ValueError(f"{key} must be true or false")
        return cls(
            Slo.parse([f"{k}={v}" for k, v in slo.items()]),
            window_bounds=(int(bounds[0]), int(bounds[1])) if bounds else None,
            **d,
        )

    def tune_schedule(self) -> dict[str, Any]:
        """The scheduled tune's body (daemon/api/tune.py), applying winners under the guard."""
        return {
            "interval_s": self.tune_interval_s or DEFAULT_TUNE_INTERVAL_S,
            "slo": self.slo.as_dict(),
            "apply": True,
            "budget_trials": self.tune_budget_trials,
            "input_len": self.tune_input_len,
            "quiet_only": True,  # a tune restarts the engine: never at a peak (engine/tune/quiet.py)
            "quiet_window_s": self.tune_quiet_window_s,
        }


def window_settings(plan: AutopilotPlan) -> dict[str, Any]:
    """The PID window's signal and target for the plan's SLO (the tightest of its kind)."""
    for metric in _SIGNAL_ORDER:
        limits = [t.limit_ms for t in plan.slo.targets if t.metric == metric and t.percentile >= 90]
        limits = limits or [t.limit_ms for t in plan.slo.targets if t.metric == metric]
        if limits:
            out: dict[str, Any] = {"signal": metric, "target_ms": min(limits)}
            if plan.window_bounds:
                out.update(min_window=plan.window_bounds[0], max_window=plan.window_bounds[1])
            return out
    raise ValueError("the SLO has no ttft, e2e or tpot target")
