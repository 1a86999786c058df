"""The automatic memory-mode policy: memory pressure in, at most one mode switch out.

Memory in use above 80% of total -> aggressive, above 60% -> balanced, else performance. A
switch restarts the engine, so the policy must never flap: it climbs to a tighter mode as soon
as a threshold is crossed, but relaxes only once memory is `hysteresis` below the threshold it
crossed, and never switches twice within `min_switch_interval_s`. It is pure (state and sample
in, new state and decision out) so that it is tested by replaying a recorded memory trace.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from llmconsole.engine.host import HostSample
from llmconsole.engine.modes.memory import Mode

_LEVELS = (Mode.PERFORMANCE, Mode.BALANCED, Mode.AGGRESSIVE)


@dataclass(frozen=True)
class PolicySettings:
    balanced_above: float = 0.60
    aggressive_above: float = 0.80
    hysteresis: float = 0.05  # relax only this far (a fraction of total) below a threshold
    min_switch_interval_s: float = 120.0  # a switch costs a restart: at most one per interval

    def __post_init__(self) -> None:
        if not 0 < self.balanced_above < self.aggressive_above < 1:
            raise ValueError("thresholds must satisfy 0 < balanced_above < aggressive_above < 1")
        if not 0 <= self.hysteresis < self.balanced_above:
            raise ValueError("hysteresis must be at least 0 and below balanced_above")
        if self.min_switch_interval_s < 0:
            raise ValueError("min_switch_interval_s must not be negative")


@dataclass(frozen=True)
class PolicyState:
    mode: Mode
    last_switch_s: float | None = None


@dataclass(frozen=True)
class Decision:
    at_s: float
    used_fraction: float
    from_mode: Mode
    to_mode: Mode


def _level(fraction: float, balanced: float, aggressive: float) -> int:
    return 2 if fraction > aggressive else 1 if fraction > balanced else 0


def wanted_mode(used_fraction: float, current: Mode, settings: PolicySettings = PolicySettings()) -> Mode:
    """The mode memory pressure asks for, given the mode now (which is what hysteresis needs)."""
    s = settings
    cur = _LEVELS.index(current)
    up = _level(used_fraction, s.balanced_above, s.aggressive_above)
    down = _level(used_fraction, s.balanced_above - s.hysteresis, s.aggressive_above - s.hysteresis)
    if up > cur:
        return _LEVELS[up]
    if down < cur:
        return _LEVELS[down]
    return current


def step(
    state: PolicyState, used_fraction: float, now_s: float, settings: PolicySettings = PolicySettings()
) -> tuple[PolicyState, Decision | None]:
    """One sample: the next state and the switch to make now, if any."""
    want = wanted_mode(used_fraction, state.mode, settings)
    if want == state.mode:
        return state, None
    if state.last_switch_s is not None and now_s - state.last_switch_s < settings.min_switch_interval_s:
        return state, None  # pressure changed, but too soon after the last restart
    return PolicyState(want, now_s), Decision(now_s, used_fraction, state.mode, want)


def replay(
    samples: Iterable[tuple[float, float]], start: Mode = Mode.PERFORMANCE, settings: PolicySettings = PolicySettings()
) -> list[Decision]:
    """Every switch the policy makes over (time_s, used_fraction) samples."""
    state, out = PolicyState(start), []
    for at_s, fraction in samples:
        state, decision = step(state, fraction, at_s, settings)
        if decision is not None:
            out.append(decision)
    return out


def used_fraction(host: HostSample) -> float | None:
    """Memory in use on the device engines fill: the fullest GPU, else host memory (a CPU host).
    None when nothing is known."""
    gpus = [
        g.memory_used_bytes / g.memory_total_bytes
        for g in host.gpus
        if g.memory_used_bytes is not None and g.memory_total_bytes
    ]
    if gpus:
        return max(gpus)
    used, total = host.memory_used_bytes, host.memory_total_bytes
    if used is None or not total:
        return None
    return used / total
