"""When a scheduled tune may start: only while its engine's traffic is quiet.

A tune restarts the engine it tunes on trial configs, so it takes that engine's seats away for
minutes. Started on a timer alone, it lands wherever the timer falls: at the evening peak as
readily as at night. So a due tune waits while requests queue at the gateway or while the
arrivals of the recent window are above `busy_fraction` of the busiest such window in the
lookback; one that has waited a whole interval is skipped with the reason, not forced in.
Pure (arrival times in, a reason or None out) so that it is tested without an engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class QuietSettings:
    window_s: float = 600.0  # the recent traffic judged, and the width of the windows compared
    busy_fraction: float = 0.5  # busy: recent arrivals above this share of the lookback's busiest window
    lookback_s: float = 86_400.0
    min_requests: int = 4  # a busiest window with fewer requests says nothing: quiet

    def __post_init__(self) -> None:
        if not self.window_s > 0 or not 0 < self.busy_fraction <= 1 or not self.lookback_s >= self.window_s:
            raise ValueError("quiet settings need window_s > 0, 0 < busy_fraction <= 1, lookback_s >= window_s")


def busy_reason(
    arrivals_s: Sequence[float], now_s: float, queued: int, s: QuietSettings = QuietSettings()
) -> str | None:
    """Why a tune should not start now (None: the traffic is quiet). `arrivals_s`: when the
    group's recent requests arrived, wall clock, any order."""
    if queued > 0:
        return f"{queued} requests queued at the gateway"
    times = sorted(t for t in arrivals_s if now_s - s.lookback_s <= t <= now_s)
    if not times:
        return None
    recent = sum(1 for t in times if t > now_s - s.window_s)
    busiest, lo = 0, 0
    for hi, t in enumerate(times):  # the busiest window_s-wide stretch, by a sliding window
        while times[lo] <= t - s.window_s:
            lo += 1
        busiest = max(busiest, hi - lo + 1)
    if busiest < s.min_requests or recent <= s.busy_fraction * busiest:
        return None
    return (
        f"{recent} requests arrived in the last {s.window_s:.0f} s, above {s.busy_fraction:.0%} of the "
        f"busiest {s.window_s:.0f} s of the last {s.lookback_s:.0f} s ({busiest})"
    )
