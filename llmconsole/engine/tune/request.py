"""An auto-tune as asked for: the typed request that the CLI builds from its flags, the console
from its form, and the daemon receives over the control API. `settings()` checks it against the
engine's facts and derives the search space, so every client refuses the same bad input with the
same words and derives the same ranges.

The field defaults are the CLI's defaults: they live here, once.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from llmconsole.engine.load.workload import LengthDist
from llmconsole.engine.metrics.latency import Slo
from llmconsole.engine.sweep.plan import SweepPlan, parse_loads
from llmconsole.engine.tune.ranges import EngineFacts, TuneSpace, derive_space
from llmconsole.engine.tune.settings import TuneSettings
from llmconsole.engine.tune.space import Knob, clamp_to_workload, parse_budget, parse_knob, workload_len_tokens


class TuneRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: str
    workload: str  # one load level: concurrency=N or rate=R
    slo: list[str] = Field(default_factory=list)  # goodput counts requests within it
    budget: str  # trials (12) or minutes (30m)
    knobs: list[str] = Field(default_factory=list)  # FIELD[=LOW:HIGH|V1,V2]; none: batch size and token budget
    input_len: str = "64"
    output_len: str = "64"
    num_requests: int = 48
    warmup: int = 2
    ignore_eos: bool = True
    search: Literal["pattern", "tpe"] = "pattern"
    seed: int = 0
    top_k: int = 4
    repeats: int = 3
    eta: int = 3
    max_run_s: float = 300.0

    def wants_window(self) -> bool:
        """Whether a knob moves the gateway's window bounds (the daemon is then asked for them)."""
        return any(k.partition("=")[0].strip().replace("-", "_").startswith("gateway_") for k in self.knobs)

    def check(self) -> None:
        """What can be checked without the engine's facts (the syntax of every field); ValueError."""
        if len(parse_loads([self.workload])) != 1:
            raise ValueError("the workload is one load level, e.g. concurrency=8")
        if not Slo.parse(self.slo):
            raise ValueError("give an SLO (e.g. p99_e2e_ms=2000): goodput is measured against it")
        LengthDist.parse(self.input_len)
        LengthDist.parse(self.output_len)
        parse_budget(self.budget)
        for k in self.knobs:
            parse_knob(k)

    def settings(self, facts: EngineFacts) -> tuple[TuneSettings, TuneSpace]:
        """The tuner's settings and the space as derived (each knob's source, the first trial);
        ValueError says what is wrong (nothing has run)."""
        loads = parse_loads([self.workload])
        if len(loads) != 1:
            raise ValueError("the workload is one load level, e.g. concurrency=8")
        slo = Slo.parse(self.slo)
        if not slo:
            raise ValueError("give an SLO (e.g. p99_e2e_ms=2000): goodput is measured against it")
        lin, lout = LengthDist.parse(self.input_len), LengthDist.parse(self.output_len)
        plan = SweepPlan(
            engine=self.engine,
            grid={},
            loads=loads,
            slo=slo,
            repeats=1,
            num_requests=self.num_requests,
            input_len=lin,
            output_len=lout,
            warmup_requests=self.warmup,
            ignore_eos=self.ignore_eos,
            max_run_s=self.max_run_s,
        )
        knobs = tuple(parse_knob(k) for k in self.knobs) or default_knobs(facts.spec)
        if len({k.name for k in knobs}) != len(knobs):
            raise ValueError("each knob once")
        need = workload_len_tokens(longest(lin), longest(lout))
        closed = loads[0].kind == "concurrency"
        space = derive_space(
            knobs,
            facts,
            input_len=longest(lin),
            output_len=longest(lout),
            concurrency=int(loads[0].value) if closed else None,
        )
        space = dataclasses.replace(space, knobs=clamp_to_workload(space.knobs, need))
        settings = TuneSettings(
            plan,
            space.knobs,
            parse_budget(self.budget),
            seed=self.seed,
            eta=self.eta,
            top_k=self.top_k,
            repeats=self.repeats,
            start=space.start,
            search=self.search,
        )
        return settings, space


DEFAULT_KNOBS = ("max_num_seqs", "max_num_batched_tokens")


def default_knobs(spec: dict[str, object]) -> tuple[Knob, ...]:
    """Batch size and token budget, the two knobs that move goodput most on any device, and
    exactly the ones `tune --help` and the console's form name; their ranges come from
    derive_space. The KV size and max_model_len move only when asked for: a default search
    that shrinks the KV cache below one request of max_model_len cannot start a single trial."""
    return tuple(Knob(n) for n in DEFAULT_KNOBS)


def longest(d: LengthDist) -> int:
    """The longest length a distribution is expected to draw (a lognormal's tail: 4x its median)."""
    if d.kind == "uniform" and d.high is not None:  # a uniform length always has one (LengthDist.check)
        return d.high
    return d.max_value or d.value * (4 if d.kind == "lognormal" else 1)


def default(field: str) -> object:
    """A field's default, for the CLI's flags."""
    info = TuneRequest.model_fields[field]
    return info.get_default(call_default_factory=True)
