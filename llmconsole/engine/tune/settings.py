"""What one tune is asked to do: the plan it measures with, the knobs it may turn, its budget
and the search's settings. Kept apart from tuner.py, which runs engines and load, so that the
CLI and the console can build and check a tune's settings without importing any of that."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from llmconsole.engine.sweep.plan import LoadLevel, SweepPlan
from llmconsole.engine.tune.space import Budget, Knob, study_name


@dataclass(frozen=True)
class TuneSettings:
    plan: SweepPlan  # engine, SLO, lengths, full request count, one load level
    knobs: tuple[Knob, ...]
    budget: Budget
    seed: int = 0
    eta: int = 3  # successive halving: keep the top 1/eta at each rung
    min_rung_requests: int = 8
    # A short rung must fall this share below the cut to stop a trial: measured on a real engine,
    # the grid's best config made 71% of its full goodput over its first 10 requests.
    prune_margin: float = 0.3
    bad_attainment: float = 0.5  # below this share of requests in SLO, a config is infeasible
    top_k: int = 4  # candidates re-measured (raced: select.py)
    repeats: int = 3  # re-measurements of each, on average: top_k x repeats runs at most
    # The first trial's config (the planner's batch size, the running config's other values;
    # ranges.py), and how the trials after it are chosen: "pattern" (search.py,
    # TPE once it has settled) or "tpe" throughout.
    start: dict[str, Any] = field(default_factory=dict)
    search: str = "pattern"

    @property
    def first_trial(self) -> dict[str, Any]:
        """What a fresh study's trial 0 runs: the same function the search asks with (search.py)."""
        from llmconsole.engine.tune.search import start_config

        return start_config(self.knobs, self.start)

    @property
    def load(self) -> LoadLevel:
        return self.plan.loads[0]

    @property
    def name(self) -> str:
        wl = {
            "load": self.load.label,
            "input_len": self.plan.input_len.describe(),
            "output_len": self.plan.output_len.describe(),
            "requests": self.plan.num_requests,
        }
        return study_name(self.plan.engine, wl, self.plan.slo.as_dict(), self.knobs)
