"""The watch after an applied change: is production worse than the SLO allows, for long enough?

Pure judgement over the gateway's request records, so it has fast tests; the daemon's tune
service runs it on a timer after every applied config and rolls back when it says so. One bad
check is noise on a shared host; a breach must hold for a whole window before it counts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from llmconsole.engine.gateway.group import RequestRecord
from llmconsole.engine.metrics.latency import Slo


@dataclass(frozen=True)
class GuardSettings:
    watch_s: float = 600.0  # how long after an apply the engine is watched
    window_s: float = 30.0  # a breach must last this long
    check_s: float = 2.0
    min_attainment: float = 0.8  # share of requests within the SLO
    max_error_rate: float = 0.05
    min_requests: int = 5  # fewer requests in a window say nothing


@dataclass(frozen=True)
class WindowFigures:
    requests: int
    errors: int
    good: int

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    @property
    def attainment(self) -> float:
        ok = self.requests - self.errors
        return self.good / ok if ok else 0.0


def window_figures(records: Iterable[RequestRecord], slo: Slo, since_s: float, until_s: float) -> WindowFigures:
    """Requests the gateway finished in [since_s, until_s] (wall clock): how many, how many the
    engine failed, how many met the SLO. Only what the engine did counts: a client that left or
    read too slowly, a bad request and a full queue say nothing about the config (and a flood at
    the door must not be able to roll a config back)."""
    n = errors = good = 0
    for r in records:
        if not since_s <= r.finished_at_s <= until_s or not r.judged:
            continue
        n += 1
        if r.engine_fault:
            errors += 1
            continue
        tpot = None
        out_len = r.output_len
        if r.ttft_s is not None and out_len is not None and out_len > 1:
            tpot = (r.e2e_s - r.ttft_s) / (out_len - 1)
        if slo.request_is_good(r.ttft_s, tpot, r.e2e_s, None):
            good += 1
    return WindowFigures(n, errors, good)


def breach(fig: WindowFigures, g: GuardSettings) -> str | None:
    """Why a window's figures are a degradation, or None (also when there is too little traffic)."""
    if fig.requests < g.min_requests:
        return None
    if fig.error_rate > g.max_error_rate:
        return f"error rate {fig.error_rate:.0%} over {g.max_error_rate:.0%} ({fig.errors} of {fig.requests})"
    if fig.attainment < g.min_attainment:
        return (
            f"SLO met by {fig.attainment:.0%} of requests, under {g.min_attainment:.0%} ({fig.good} of "
            f"{fig.requests - fig.errors})"
        )
    return None


def sustained(checks: Sequence[tuple[float, str | None]], now_s: float, window_s: float) -> str | None:
    """The breach reason when every check of the last `window_s` breached and the checks span
    the window; else None. `checks` are (time, reason-or-None), oldest first."""
    recent = [(t, why) for t, why in checks if t >= now_s - window_s]
    if not recent or any(why is None for _, why in recent):
        return None
    older = [t for t, _ in checks if t < now_s - window_s]
    if not older and recent[0][0] > now_s - window_s * 0.9:
        return None  # watched for less than a window
    return recent[-1][1]


def applied_text(applied: dict[str, Any]) -> str:
    """What an applied tuned config did, from the daemon's answer to the apply."""
    if applied["to_config_id"] == applied["from_config_id"]:
        return f"applied: the engine already runs the winner (config {applied['to_config_id']}); nothing restarted"
    return (
        f"applied: config {applied['to_config_id']} (was {applied['from_config_id']}); "
        f"the daemon watches the SLO for {applied['watch_s']:.0f} s and rolls back if it degrades"
    )
