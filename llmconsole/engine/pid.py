"""The batch-window PID controller: moves an engine group's admission window to hold a latency
target, because vLLM fixes `max_num_seqs` at start and the gateway's window is the one batch
knob that can move while the engine serves.

The controlled signal is measured over a sliding window of recent requests at the gateway
(p99 TTFT by default, p99 end-to-end, or median TPOT), from the moment a request is sent to the
engine: time a request spends in the gateway's own queue is the price of a smaller window, not
something a smaller window can reduce, so feeding it back would push the loop the wrong way.

The error is relative, (target - measured) / target, so one set of gains works for a 50 ms and a
5 s target. Output = bias + P + I + D, clamped to [min_window, max_window] and rounded for the
admission gate. Anti-windup: the integral does not grow while the output sits on a clamp and the
error pushes further into it. Derivative on measurement: a target change does not kick the
window. With too few samples, or no request finished since the last step, the controller holds.
Freezing (or setting the window by hand, which freezes) stops the loop; on release the integral
is re-based so the window continues from where it stands (bumpless transfer).
"""

from __future__ import annotations

import collections
import math
import time
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Callable


class Signal(StrEnum):
    TTFT = "ttft"   # p99 time to first token
    E2E = "e2e"     # p99 end-to-end latency
    TPOT = "tpot"   # p99 time per output token


@dataclass(frozen=True)
class PidSettings:
    target_ms: float = 1000.0
    signal: Signal = Signal.TTFT
    min_window: int = 4
    max_window: int = 32
    start_window: int = 8
    kp: float = 3.0            # window units per unit of relative error
    ki: float = 2.0            # window units per second per unit of relative error
    kd: float = 0.5            # window units per (relative change of the measurement per second)
    percentile: float = 99.0
    # The sliding window: the newest `max_samples` requests, none older than `horizon_s`. A busy
    # engine fills it in a second (a prompt loop); a slow one stretches it toward the horizon.
    horizon_s: float = 15.0
    max_samples: int = 32
    min_samples: int = 4       # fewer than this in the window: hold
    interval_s: float = 1.0    # how often the daemon steps the controller

    def __post_init__(self) -> None:
        object.__setattr__(self, "signal", Signal(self.signal))
        problems = []
        if not (self.target_ms > 0 and math.isfinite(self.target_ms)):
            problems.append(f"target_ms must be a positive number, not {self.target_ms}")
        if self.min_window < 1:
            problems.append(f"min_window must be at least 1, not {self.min_window}")
        if self.max_window < self.min_window:
            problems.append(f"max_window ({self.max_window}) must be at least min_window ({self.min_window})")
        if not self.min_window <= self.start_window <= self.max_window:
            problems.append(f"start_window ({self.start_window}) must lie in [{self.min_window}, {self.max_window}]")
        if min(self.kp, self.ki, self.kd) < 0:
            problems.append("gains must not be negative")
        if not 0 < self.percentile <= 100:
            problems.append(f"percentile must be in (0, 100], not {self.percentile}")
        if self.horizon_s <= 0 or self.interval_s <= 0 or self.max_samples < 1 or self.min_samples < 1:
            problems.append("horizon_s, interval_s, max_samples and min_samples must be positive")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass(frozen=True)
class LatencySample:
    """One request as the gateway measured it; times from dispatch to the engine.

    The gateway reports TTFT the moment the first token passes (`e2e_s` None) and the rest when
    the request finishes (`count_ttft` False): waiting for the end would delay the TTFT signal
    by a whole generation, which on long answers is longer than the loop can afford."""

    at_s: float                  # monotonic time of the measurement
    ttft_s: float | None         # None when not streamed (the first token is not visible)
    e2e_s: float | None = None   # None: the request is still generating
    output_chunks: int = 0       # streamed events carrying output (about one token each)
    count_ttft: bool = True      # False when this request's TTFT was reported on its own

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.e2e_s is None or self.output_chunks < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_chunks - 1)


@dataclass(frozen=True)
class TraceSample:
    """One controller step, as the console's trace panel and the store see it."""

    at_s: float                  # wall clock (time.time) of the step
    target_ms: float
    measured_ms: float | None
    error: float | None          # relative: (target - measured) / target
    p: float
    i: float
    d: float
    output: float                # unclamped controller output
    window: int                  # what the admission gate uses now
    samples: int
    action: str                  # step, clamped, hold-idle, hold-samples, hold-unsaturated, frozen, manual

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def percentile(values: list[float], pct: float) -> float:
    """Nearest-rank percentile: with few samples p99 is the worst one, never an interpolation."""
    ordered = sorted(values)
    rank = max(1, math.ceil(pct / 100.0 * len(ordered)))
    return ordered[rank - 1]


class PidController:
    def __init__(self, settings: PidSettings | None = None, *,
                 clock: Callable[[], float] = time.monotonic, wall: Callable[[], float] = time.time,
                 trace_len: int = 600):
        self.settings = settings or PidSettings()
        self._clock = clock
        self._wall = wall
        self._samples: collections.deque[LatencySample] = collections.deque(maxlen=self.settings.max_samples)
        self.trace: collections.deque[TraceSample] = collections.deque(maxlen=trace_len)
        self.window = self.settings.start_window
        self.frozen = False
        self._output = float(self.window)
        self._integral = 0.0
        self._prev_measured: float | None = None
        self._prev_step_s: float | None = None
        self._seen = 0            # samples observed in total: "nothing new" means idle
        self._seen_at_step = 0

    # --- inputs ---------------------------------------------------------------------------

    def observe(self, sample: LatencySample) -> None:
        self._samples.append(sample)
        self._seen += 1

    def configure(self, **changes) -> PidSettings:
        """Change settings live (target, signal, bounds, gains); invalid changes change nothing."""
        new = replace(self.settings, **changes)
        if new.max_samples != self.settings.max_samples:
            self._samples = collections.deque(self._samples, maxlen=new.max_samples)
        if new.signal != self.settings.signal:
            self._prev_measured = None  # another signal: its old value means nothing here
        self.settings = new
        self.window = min(max(self.window, new.min_window), new.max_window)
        self._rebase()
        return new

    def freeze(self, frozen: bool = True) -> None:
        if self.frozen and not frozen:
            self._rebase()
            self._prev_measured = None
        self.frozen = frozen

    def set_window(self, window: int) -> None:
        """Set the window by hand; the controller stays frozen there until released."""
        s = self.settings
        if not s.min_window <= window <= s.max_window:
            raise ValueError(f"window {window} is outside [{s.min_window}, {s.max_window}]")
        self.window = int(window)
        self.frozen = True
        self._rebase()
        self.trace.append(self._sample(None, None, 0.0, 0.0, "manual", len(self._samples)))

    # --- the loop -------------------------------------------------------------------------

    def measured_ms(self, now_s: float | None = None) -> tuple[float | None, int]:
        """The signal over the sliding window, and how many samples it rests on."""
        s = self.settings
        now = self._clock() if now_s is None else now_s
        while self._samples and now - self._samples[0].at_s > s.horizon_s:
            self._samples.popleft()
        if s.signal == Signal.TTFT:
            values = [x.ttft_s for x in self._samples if x.ttft_s is not None and x.count_ttft]
        elif s.signal == Signal.E2E:
            values = [x.e2e_s for x in self._samples if x.e2e_s is not None]
        else:
            values = [x.tpot_s for x in self._samples if x.tpot_s is not None]
        if not values:
            return None, 0
        return percentile(values, s.percentile) * 1000.0, len(values)

    def step(self, now_s: float | None = None, saturated: bool = True) -> TraceSample:
        """One step. `saturated`: the gate was full at some point since the last step. When it
        was not, a larger window would test nothing (the load does not reach it), so the window
        is not raised and the integral does not grow; it may still come down."""
        s = self.settings
        now = self._clock() if now_s is None else now_s
        dt = s.interval_s if self._prev_step_s is None else max(1e-3, now - self._prev_step_s)
        self._prev_step_s = now
        measured, n = self.measured_ms(now)
        idle = self._seen == self._seen_at_step
        self._seen_at_step = self._seen
        if self.frozen:
            return self._record(self._sample(measured, None, 0.0, 0.0, "frozen", n))
        if measured is None or n < s.min_samples:
            return self._record(self._sample(measured, None, 0.0, 0.0, "hold-samples", n))
        if idle:
            # Nothing finished since the last step: the window's latency is not being tested.
            self._prev_measured = None
            return self._record(self._sample(measured, None, 0.0, 0.0, "hold-idle", n))

        error = (s.target_ms - measured) / s.target_ms
        if error > 0 and not saturated:
            self._prev_measured = measured
            return self._record(self._sample(measured, error, 0.0, 0.0, "hold-unsaturated", n))
        p = s.kp * error
        d = 0.0
        if self._prev_measured is not None:
            d = -s.kd * (measured - self._prev_measured) / s.target_ms / dt
        self._prev_measured = measured
        bias = float(s.start_window)
        candidate_i = self._integral + s.ki * error * dt
        output = bias + p + candidate_i + d
        lo, hi = float(s.min_window), float(s.max_window)
        # Conditional integration: on a clamp, integrate only what pulls the output back inside.
        if (output > hi and error > 0) or (output < lo and error < 0):
            output = bias + p + self._integral + d
            action = "clamped"
        else:
            self._integral = candidate_i
            action = "step"
        self._output = output
        self.window = int(round(min(max(output, lo), hi)))
        if output < lo or output > hi:
            action = "clamped"
        return self._record(self._sample(measured, error, p, d, action, n))

    # --- helpers --------------------------------------------------------------------------

    def _rebase(self) -> None:
        """Bumpless transfer: make bias + I equal the window that stands now."""
        self._integral = float(self.window) - float(self.settings.start_window)
        self._output = float(self.window)

    def _sample(self, measured, error, p, d, action, n) -> TraceSample:
        return TraceSample(
            at_s=self._wall(), target_ms=self.settings.target_ms, measured_ms=measured, error=error,
            p=p, i=self._integral, d=d, output=self._output, window=self.window, samples=n, action=action,
        )

    def _record(self, sample: TraceSample) -> TraceSample:
        self.trace.append(sample)
        return sample

    def state_json(self, trace_points: int = 60) -> dict:
        """Settings, state and the newest trace points, for `status --json` and the console."""
        s = self.settings
        return {
            "window": self.window, "frozen": self.frozen, "signal": str(s.signal),
            "target_ms": s.target_ms, "min_window": s.min_window, "max_window": s.max_window,
            "start_window": s.start_window, "kp": s.kp, "ki": s.ki, "kd": s.kd,
            "trace": [t.to_json() for t in list(self.trace)[-trace_points:]],
        }
