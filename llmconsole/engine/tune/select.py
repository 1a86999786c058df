"""Which measured configs are re-measured, in what order, and which one is recommended.

Replays of the tuner on a measured 24-point grid (bench/bench_tuner.py) showed where its misses
came from: with 8% noise on each run, the search measured a config within 95% of the grid's
best in 36 of 40 seeds, but recommended one in 28. The search found the peak; the choice among
the measured configs lost it. Three things went wrong there, and the rules here answer them:

- the re-measurements were judged alone, throwing away the trial's own full-length run of the
  same config: every run of a config counts now (`Remeasured.goodputs_req_s` holds the trial's
  run first, then the re-measurements), which is a third more evidence for nothing;
- each candidate was re-measured in one block, so a host that got busier half-way hit one
  candidate and not the next: the runs go in rounds (A, B, C, then C, B, A: the config running
  now goes first, so a round costs one restart less), and drift on the host hits all alike;
- every candidate got the same runs, even one clearly out of the running: after each round a
  candidate below the leader by more than the noise the runs themselves show stops, and its
  runs go to the close ones (a race). The re-measurement cost stays what it was (top_k x
  repeats runs at most); only its spending moves to where it decides something.

Re-measurements are extra load runs of configs already tried, not new configs: a trial is a
config measured (a restart, in the budget); a re-measurement run is not counted in the budget,
and the benchmark's table shows both.

Pure functions, so the tuner and the benchmark's replay run the same rules.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from llmconsole.engine.tune.space import TrialOutcome

# A run-to-run spread below this is not believed: a few runs can agree by chance, and one run on
# a shared host varies by this much or more (replays assume 8-12%; live hosts show more).
MIN_REL_SD = 0.08
# How many standard errors below the leader a candidate must fall to leave the race.
RACE_Z = 1.0


@dataclass(frozen=True)
class Remeasured:
    """A candidate's full-length runs: the trial's own first, then its re-measurements."""

    number: int
    params: dict[str, Any]
    goodputs_req_s: tuple[float, ...]
    failed: str | None = None  # it no longer started on re-measuring: out of the race

    @property
    def median_req_s(self) -> float:
        return statistics.median(self.goodputs_req_s) if self.goodputs_req_s else 0.0

    @property
    def spread(self) -> float | None:
        g = self.goodputs_req_s
        if len(g) < 2 or not self.median_req_s:
            return None
        return (max(g) - min(g)) / self.median_req_s

    @property
    def mean_req_s(self) -> float:
        """What the candidates are ranked by: every run of the config weighs alike."""
        return statistics.fmean(self.goodputs_req_s) if self.goodputs_req_s else 0.0


def remeasure_candidates(outcomes: Sequence[TrialOutcome], k: int) -> list[TrialOutcome]:
    """The best `k` distinct configs that finished the full rung feasibly, best first."""
    seen: set[str] = set()
    out: list[TrialOutcome] = []
    done = [(o.goodput_req_s, o) for o in outcomes if o.state == "complete" and o.goodput_req_s is not None]
    for _, o in sorted(done, key=lambda go: -go[0]):
        key = json.dumps(o.params, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            out.append(o)
        if len(out) == k:
            break
    return out


def start_race(outcomes: Sequence[TrialOutcome], k: int) -> list[Remeasured]:
    """The candidates, best first, each holding its trial's own full-length run."""
    return [
        Remeasured(o.number, o.params, (o.goodput_req_s,))
        for o in remeasure_candidates(outcomes, k)
        if o.goodput_req_s is not None
    ]  # every candidate has one


def _rel_sd(cands: Sequence[Remeasured]) -> float:
    """The run-to-run noise the candidates' own runs show (pooled over them, relative to each
    one's mean), never below MIN_REL_SD."""
    ss, dof = 0.0, 0
    for c in cands:
        g = c.goodputs_req_s
        if len(g) < 2:
            continue
        m = statistics.fmean(g)
        if m <= 0:
            continue
        ss += sum(((x - m) / m) ** 2 for x in g)
        dof += len(g) - 1
    return max(MIN_REL_SD, math.sqrt(ss / dof)) if dof else MIN_REL_SD


def contenders(cands: Sequence[Remeasured], z: float = RACE_Z, first_judged: int = 2) -> list[int]:
    """Indexes of the candidates still in the race: every one that started, less those that
    fell out at the end of a round, below the leader by more than `z` standard errors of the
    difference. Each round is judged on the runs it had then (every candidate's first L runs,
    from L = `first_judged`: the trial's own run and one re-measurement), so the verdicts are
    a function of the runs alone and one that is out stays out."""
    alive = [i for i, c in enumerate(cands) if c.failed is None and c.goodputs_req_s]
    level = first_judged
    while len(alive) > 1 and all(len(cands[i].goodputs_req_s) >= level for i in alive):
        runs = {i: cands[i].goodputs_req_s[:level] for i in alive}
        sd = _rel_sd([Remeasured(0, {}, g) for g in runs.values()])
        mean = {i: statistics.fmean(g) for i, g in runs.items()}
        lead = max(alive, key=lambda i: mean[i])
        alive = [i for i in alive if mean[i] >= mean[lead] * (1 - z * sd * math.sqrt(2 / level))]
        level += 1
    return alive


def next_remeasure(cands: Sequence[Remeasured], repeats: int, last: int | None = None) -> int | None:
    """The candidate to run next, or None when the race is decided (one left, with at least
    `repeats` re-measurements). The caller stops anyway when top_k x repeats runs are spent.

    Rounds: the contenders with the fewest runs go next; of them, the one running now (`last`,
    no restart), else the nearest to it in rank, which walks the rounds A, B, C, C, B, A, ...
    """
    alive = contenders(cands)
    if not alive:
        return None
    if len(alive) == 1:
        return alive[0] if len(cands[alive[0]].goodputs_req_s) - 1 < repeats else None
    fewest = min(len(cands[i].goodputs_req_s) for i in alive)
    due = [i for i in alive if len(cands[i].goodputs_req_s) == fewest]
    if last is None:
        return due[0]
    return min(due, key=lambda i: (abs(i - last), i))


def pick_winner(measured: Sequence[Remeasured]) -> Remeasured | None:
    """The contender with the highest mean over all its runs (the trial's and the
    re-measurements). The mean, not the median: with four or five runs a median throws half of
    them away (in replays at 12% noise it picked worse)."""
    alive = contenders(measured)
    if not alive:
        return None
    return max((measured[i] for i in alive), key=lambda m: m.mean_req_s)
