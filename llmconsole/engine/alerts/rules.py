"""The alert rules the daemon evaluates itself, for hosts with no Prometheus.

They are the rules of deploy/prometheus/llmconsole-rules.yml, over the same figures: a rule's
condition is checked against the daemon's live statuses, must hold for `for_s` (pending) before
it fires, and resolves as soon as it no longer holds, as Prometheus does. The tracker is pure
(conditions and a clock in, transitions out) so that tests drive it with a fake clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from llmconsole.engine.gateway.group import RequestRecord

KV_CACHE_HIGH = "LlmconsoleKvCacheHigh"
GPU_MEMORY_HIGH = "LlmconsoleGpuMemoryHighManySeqs"
CRASH_LOOPING = "LlmconsoleEngineCrashLooping"
SLO_BURNING = "LlmconsoleLatencySloBurning"

KV_USAGE_ABOVE = 0.90
GPU_MEMORY_ABOVE = 0.85
MAX_NUM_SEQS_ABOVE = 16
SLO_OBJECTIVE = 0.99  # of requests within the latency target
SLO_BURN_ABOVE = 10.0  # error budget spent 10x faster than the objective allows
SLO_WINDOW_S = 300.0
SLO_MIN_REQUESTS = 10  # fewer requests in the window say nothing about the SLO


@dataclass(frozen=True)
class Rule:
    name: str
    severity: str
    for_s: float
    summary: str


DEFAULT_RULES: dict[str, Rule] = {
    r.name: r
    for r in (
        Rule(KV_CACHE_HIGH, "warning", 300.0, f"KV cache usage above {KV_USAGE_ABOVE:.0%}"),
        Rule(
            GPU_MEMORY_HIGH,
            "warning",
            120.0,
            f"GPU memory above {GPU_MEMORY_ABOVE:.0%} while max_num_seqs is above {MAX_NUM_SEQS_ABOVE}",
        ),
        Rule(CRASH_LOOPING, "critical", 0.0, "the engine is crash-looping"),
        Rule(SLO_BURNING, "critical", 120.0, f"the latency SLO's error budget burns over {SLO_BURN_ABOVE:g}x"),
    )
}


@dataclass(frozen=True)
class SloFigures:
    requests: int
    good: int
    objective: float = SLO_OBJECTIVE

    @property
    def attainment(self) -> float | None:
        return self.good / self.requests if self.requests else None

    @property
    def burn_rate(self) -> float | None:
        a = self.attainment
        return None if a is None else (1.0 - a) / (1.0 - self.objective)


def slo_figures(
    records: Iterable[RequestRecord],
    target_ms: float,
    signal: str,
    now_wall_s: float | None = None,
    window_s: float = SLO_WINDOW_S,
) -> SloFigures:
    """Gateway request records of the last `window_s`: how many, and how many met the target.
    A request the engine failed counts against the SLO; what clients did (left, read too slowly,
    sent a bad request) and admission refusals (a full queue) do not count at all."""
    now = time.time() if now_wall_s is None else now_wall_s
    total = good = 0
    for r in records:
        if r.finished_at_s < now - window_s or not r.judged:
            continue
        total += 1
        if r.engine_fault:
            continue
        value = r.ttft_s if signal == "ttft" and r.ttft_s is not None else r.e2e_s
        if value is not None and value * 1000.0 <= target_ms:
            good += 1
    return SloFigures(total, good)


@dataclass(frozen=True)
class EngineFacts:
    """What the rules read of one engine; built from its status, the host and its gateway group."""

    engine: str
    kv_cache_usage: float | None = None
    max_num_seqs: int | None = None
    gpu_memory_used_ratio: float | None = None
    crash_looping: bool = False
    slo: SloFigures | None = None


def conditions(f: EngineFacts) -> dict[str, bool]:
    burn = f.slo.burn_rate if f.slo is not None and f.slo.requests >= SLO_MIN_REQUESTS else None
    return {
        KV_CACHE_HIGH: f.kv_cache_usage is not None and f.kv_cache_usage > KV_USAGE_ABOVE,
        GPU_MEMORY_HIGH: (
            f.gpu_memory_used_ratio is not None
            and f.gpu_memory_used_ratio > GPU_MEMORY_ABOVE
            and f.max_num_seqs is not None
            and f.max_num_seqs > MAX_NUM_SEQS_ABOVE
        ),
        CRASH_LOOPING: f.crash_looping,
        SLO_BURNING: burn is not None and burn > SLO_BURN_ABOVE,
    }


@dataclass(frozen=True)
class AlertState:
    rule: str
    engine: str
    state: str  # pending | firing
    since_s: float  # when the condition began to hold (monotonic)
    fired_at_s: float | None = None


@dataclass(frozen=True)
class Transition:
    rule: str
    engine: str
    to: str  # firing | resolved
    at_s: float


@dataclass
class AlertTracker:
    rules: dict[str, Rule] = field(default_factory=lambda: dict(DEFAULT_RULES))
    clock: Callable[[], float] = time.monotonic
    active: dict[tuple[str, str], AlertState] = field(default_factory=dict)

    def evaluate(self, per_engine: dict[str, dict[str, bool]]) -> list[Transition]:
        """One evaluation: each engine's conditions in, the alerts that fired or resolved out."""
        now = self.clock()
        out = []
        seen = set()
        for engine, conds in per_engine.items():
            for rule_name, holds in conds.items():
                rule = self.rules.get(rule_name)
                if rule is None:
                    continue
                key = (rule_name, engine)
                cur = self.active.get(key)
                if not holds:
                    continue
                seen.add(key)
                if cur is None:
                    cur = self.active[key] = AlertState(rule_name, engine, "pending", now)
                if cur.state == "pending" and now - cur.since_s >= rule.for_s:
                    self.active[key] = replace(cur, state="firing", fired_at_s=now)
                    out.append(Transition(rule_name, engine, "firing", now))
        for key in [k for k in self.active if k not in seen]:
            was = self.active.pop(key)
            if was.state == "firing":
                out.append(Transition(was.rule, was.engine, "resolved", now))
        return out

    def firing(self) -> list[AlertState]:
        return [a for a in self.active.values() if a.state == "firing"]
