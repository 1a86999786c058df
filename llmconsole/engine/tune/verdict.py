"""Why a study has nothing to recommend, in words an operator can act on.

A tune whose every trial was infeasible used to end on "no config met the constraints", with
the reasons only in the study's journal. The CLI and the console both end on these lines: what
kept the trials out (each distinct reason, with the trials it hit) and what to change.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from llmconsole.engine.tune.space import TrialOutcome

_JUDGED = ("complete", "pruned", "infeasible")
# How a run's SLO miss reads (sweep/runner.py): `p99_e2e_ms 24491 > 10000`.
_SLO_MISS = re.compile(r"\b(\w+_ms) ([\d.]+) > ([\d.]+)")


def all_infeasible(trials: Sequence[TrialOutcome]) -> bool:
    """Every judged trial was infeasible (and at least one was judged)."""
    judged = [t for t in trials if t.state in _JUDGED]
    return bool(judged) and all(t.state == "infeasible" for t in judged)


def infeasible_lines(trials: Sequence[TrialOutcome]) -> list[str]:
    """Each distinct reason an infeasible trial gave, with its trials, then what to change; []
    when some trial was feasible."""
    if not all_infeasible(trials):
        return []
    by_reason: dict[str, list[int]] = {}
    for t in trials:
        if t.state == "infeasible":
            by_reason.setdefault(t.reason or "no reason recorded", []).append(t.number)
    lines = [f"every trial was infeasible ({sum(len(v) for v in by_reason.values())}):"]
    for reason, numbers in by_reason.items():
        which = ", ".join(map(str, numbers))
        lines.append(f"  trial{'s' if len(numbers) > 1 else ''} {which}: {reason}")
    lines.append("what to change: " + _advice(list(by_reason)))
    return lines


def _advice(reasons: list[str]) -> str:
    text = " ".join(reasons).lower()
    tips = []
    if "did not start" in text or "does not fit" in text or "max seq len" in text:
        tips.append(
            "give knobs values the engine can start with (`tune --dry-run` shows each range and "
            "trial 0; `llmconsole plan` what a KV size holds)"
        )
    if "window refused" in text:
        tips.append("give window bounds the gateway accepts (min_window <= max_window)")
    misses = [(m.group(1), float(m.group(2)), m.group(3)) for m in map(_SLO_MISS.search, reasons) if m]
    if misses:
        name, limit = misses[0][0], misses[0][2]
        seen = [v for n, v, _ in misses if n == name]
        tips.append(
            f"the trials measured {name} {min(seen):,.0f}-{max(seen):,.0f} against the SLO's {limit}: loosen the "
            "SLO or lighten the workload (lower concurrency, shorter requests); on a shared host, other load "
            "raises every latency"
        )
    elif "slo" in text or "within" in text:
        tips.append("loosen the SLO or lighten the workload (lower concurrency or shorter requests)")
    if "fail" in text and "did not start" not in text:
        tips.append("look at the engine's log for the failed requests")
    if not tips:
        tips.append("check the reasons above, then loosen the SLO or narrow the knobs to configs that start")
    return "; ".join(tips)
