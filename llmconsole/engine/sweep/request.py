"""A mini sweep as asked for: the typed request that the CLI builds from its flags, the console
from its form, and the daemon receives over the control API. `plan()` checks it and turns it
into the runner's `SweepPlan`, so every client refuses the same bad input with the same words.

The field defaults are the CLI's defaults: they live here, once.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from llmconsole.engine.load.workload import LengthDist
from llmconsole.engine.metrics.latency import Slo
from llmconsole.engine.spec import EngineSpec
from llmconsole.engine.sweep.plan import SweepPlan, parse_grid, parse_loads


class SweepRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: str
    grid: list[str] = Field(default_factory=list)  # FIELD=V1,V2 (each server point restarts the engine)
    loads: list[str]  # concurrency=1,4 or rate=2,8 (requests/s)
    slo: list[str] = Field(default_factory=list)  # p99_e2e_ms=2000,ttft_ms=500
    repeats: int = 3
    num_requests: int = 32
    input_len: str = "64"  # N, uniform:LOW-HIGH or lognormal:MEDIAN[:SIGMA]
    output_len: str = "64"
    warmup: int = 2
    ignore_eos: bool = True
    burstiness: float = 1.0
    max_run_s: float = 300.0
    max_error_rate: float = 0.05
    spread_limit: float = 0.15
    knee_threshold: float = 2.5
    knee_units: Literal["relative", "absolute"] = "relative"
    through_gateway: bool = False  # load through the gateway's window, not directly

    def plan(self) -> SweepPlan:
        """The runner's plan; ValueError says what is wrong (nothing has run)."""
        if not self.loads:
            raise ValueError("give at least one load level, e.g. concurrency=1,2")
        if self.num_requests < 1:
            raise ValueError(f"requests per run must be at least 1, got {self.num_requests}")
        return SweepPlan(
            engine=self.engine,
            grid=parse_grid(self.grid, set(EngineSpec.model_fields) - {"model", "api_key"}),
            loads=parse_loads(self.loads),
            slo=Slo.parse(self.slo),
            repeats=self.repeats,
            num_requests=self.num_requests,
            input_len=LengthDist.parse(self.input_len),
            output_len=LengthDist.parse(self.output_len),
            burstiness=self.burstiness,
            warmup_requests=self.warmup,
            ignore_eos=self.ignore_eos,
            max_run_s=self.max_run_s,
            max_error_rate=self.max_error_rate,
            spread_limit=self.spread_limit,
            knee_threshold=self.knee_threshold,
            knee_units=self.knee_units,
            through_gateway=self.through_gateway,
        )


def default(field: str) -> object:
    """A field's default, for the CLI's flags."""
    info = SweepRequest.model_fields[field]
    return info.get_default(call_default_factory=True)
