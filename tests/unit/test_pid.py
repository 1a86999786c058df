"""The batch-window PID controller on a synthetic plant: settling, anti-windup, holds, freeze."""

from __future__ import annotations

import random

import pytest

from llmconsole.engine.gateway.pid import LatencySample, PidController, PidSettings, Signal, percentile, tail_chance


class Plant:
    """A closed-loop engine in miniature: `clients` streams, at most `window` of them in the
    engine; a request's TTFT grows with the batch it joins (ms = base + per_seat * in_flight),
    and it finishes after a decode time. Deterministic noise, fixed seed."""

    def __init__(self, base_ms=40.0, per_seat_ms=12.0, decode_s=0.5, seed=7):
        self.base_ms, self.per_seat_ms, self.decode_s = base_ms, per_seat_ms, decode_s
        self.rng = random.Random(seed)
        self.running: list[tuple[float, float]] = []  # (finish_at_s, ttft_s)

    def tick(self, now_s: float, clients: int, window: int, ctl: PidController) -> None:
        done = [r for r in self.running if r[0] <= now_s]
        self.running = [r for r in self.running if r[0] > now_s]
        for finish_at, ttft in done:
            ctl.observe(LatencySample(at_s=finish_at, ttft_s=ttft, e2e_s=ttft + self.decode_s, output_chunks=32))
        while len(self.running) < min(window, clients):
            in_flight = len(self.running) + 1
            ttft_s = (self.base_ms + self.per_seat_ms * in_flight) / 1000.0 * self.rng.uniform(0.95, 1.05)
            self.running.append((now_s + ttft_s + self.decode_s, ttft_s))


def simulate(ctl: PidController, load: list[tuple[float, int]], until_s: float, dt_s: float = 0.05):
    """Run the plant; `load` is [(from_s, clients)]. Returns the trace of every controller step."""
    plant, now, next_step, steps = Plant(), 0.0, 1.0, []
    while now < until_s:
        clients = [c for t, c in load if t <= now][-1]
        plant.tick(now, clients, ctl.window, ctl)
        if now >= next_step:
            steps.append(ctl.step(now, saturated=clients >= ctl.window))
            next_step += ctl.settings.interval_s
        now += dt_s
    return steps


def _reversals(windows: list[int]) -> int:
    """Changes of direction bigger than the one-seat dither of an integer window whose ideal
    lies between two integers: those would be oscillation."""
    moves = [b - a for a, b in zip(windows, windows[1:], strict=False) if b != a]
    return sum(1 for a, b in zip(moves, moves[1:], strict=False) if (a > 0) != (b > 0) and max(abs(a), abs(b)) > 1)


def _ctl(**kw) -> PidController:
    clock = [0.0]
    return PidController(PidSettings(**kw), clock=lambda: clock[0], wall=lambda: 0.0)


def test_step_response_settles_on_the_target_without_oscillation():
    # Target 250 ms: the plant holds it at about 17.5 seats. The controller starts at 8.
    ctl = _ctl(target_ms=250.0, horizon_s=4.0)
    steps = simulate(ctl, [(0.0, 32)], until_s=60.0)
    windows = [s.window for s in steps]
    settled = steps[30:]
    assert {s.window for s in settled} <= {16, 17, 18, 19}, windows
    measured = [s.measured_ms for s in settled]
    assert abs(sum(measured) / len(measured) - 250.0) / 250.0 < 0.10, measured
    # It rises toward the target without overshooting far, then stays: few reversals at most.
    assert max(windows) <= 21, windows
    assert _reversals(windows) == 0, windows
    assert max(s.window for s in settled) - min(s.window for s in settled) <= 2


def test_load_step_from_2_to_32_streams_does_not_wind_up():
    ctl = _ctl(target_ms=250.0, horizon_s=4.0)
    steps = simulate(ctl, [(0.0, 2), (30.0, 32)], until_s=90.0)
    before = steps[:29]
    # With two streams the latency is far below target, but two streams never fill the window:
    # raising it would test nothing, so it holds at 8 and the integral does not wind up.
    assert {s.window for s in before} == {8}
    assert before[-1].action == "hold-unsaturated" and before[-1].i == 0.0
    assert abs(before[-1].i - before[-5].i) < 1e-9
    after = steps[29:]
    # After the step the window rises within 30 s (the bound) to about 17.5 seats and
    # settles there; each raise waits for requests sent under the last one, so it climbs in steps.
    first_in_band = next(k for k, s in enumerate(after) if s.window >= 16)
    assert first_in_band <= 30, [s.window for s in after]
    settled = after[first_in_band + 15 :]
    assert {s.window for s in settled} <= {16, 17, 18, 19}, [s.window for s in after]
    assert _reversals([s.window for s in after]) <= 1  # at most one early correction, no swinging


def test_holds_with_too_few_samples_and_when_idle():
    ctl = _ctl(target_ms=100.0, min_samples=5)
    for k in range(3):
        ctl.observe(LatencySample(at_s=0.1 * k, ttft_s=1.0, e2e_s=2.0))
    s = ctl.step(1.0)
    assert (s.action, s.window) == ("hold-samples", 8)
    for k in range(3):
        ctl.observe(LatencySample(at_s=1.0 + 0.1 * k, ttft_s=1.0, e2e_s=2.0))
    s = ctl.step(2.0)
    assert s.action in ("step", "clamped") and s.window < 8  # 10x over target: the window comes down
    w = s.window
    s = ctl.step(3.0)  # nothing finished since: hold, the window stays
    assert (s.action, s.window) == ("hold-idle", w)


def test_derivative_acts_on_the_measurement_not_on_a_target_change():
    ctl = _ctl(target_ms=200.0, min_samples=1, kp=0.0, ki=0.0, kd=1.0)
    ctl.observe(LatencySample(at_s=0.5, ttft_s=0.2, e2e_s=1.0))
    ctl.step(1.0)
    ctl.configure(target_ms=100.0)
    ctl.observe(LatencySample(at_s=1.5, ttft_s=0.2, e2e_s=1.0))
    s = ctl.step(2.0)
    assert s.d == 0.0  # same measurement, new target: no derivative kick


def test_freeze_and_manual_window_then_bumpless_release():
    ctl = _ctl(target_ms=100.0, min_samples=1)
    ctl.set_window(20)
    assert ctl.frozen and ctl.window == 20
    assert ctl.trace[-1].action == "manual"
    ctl.observe(LatencySample(at_s=0.5, ttft_s=0.1, e2e_s=1.0))
    assert ctl.step(1.0).action == "frozen" and ctl.window == 20
    ctl.freeze(False)
    ctl.observe(LatencySample(at_s=1.5, ttft_s=0.1, e2e_s=1.0))  # exactly on target
    s = ctl.step(2.0)
    assert s.action == "hold-band" and s.window == 20  # continues from where the operator left it
    with pytest.raises(ValueError):
        ctl.set_window(40)
    assert ctl.window == 20


def test_signals_and_bad_settings():
    ctl = _ctl(target_ms=100.0, min_samples=1, signal="tpot")
    assert ctl.settings.signal is Signal.TPOT
    ctl.observe(LatencySample(at_s=0.5, ttft_s=0.1, e2e_s=1.1, output_chunks=11))
    assert ctl.measured_ms(1.0) == (pytest.approx(100.0), 1)
    # Eleven tokens that reached the gateway in three merged events: the usage count decides.
    assert LatencySample(at_s=0.5, ttft_s=0.1, e2e_s=1.1, output_chunks=3, output_tokens=11).tpot_s == pytest.approx(
        0.1
    )
    ctl.configure(signal=Signal.E2E)
    assert ctl.measured_ms(1.0) == (pytest.approx(1100.0), 1)
    for bad in ({"min_window": 10, "max_window": 5}, {"target_ms": 0}, {"start_window": 50}, {"signal": "x"}):
        with pytest.raises(ValueError):
            PidSettings(**bad)
    # Bounds given the wrong way round are said as such, not as a start window outside [40, 8].
    with pytest.raises(ValueError) as refused:
        PidSettings(min_window=40, max_window=8, start_window=16)
    assert str(refused.value) == "max_window (8) must be at least min_window (40)"
    with pytest.raises(ValueError):
        ctl.configure(max_window=2)
    assert ctl.settings.max_window == 32 and ctl.settings.signal is Signal.E2E


def test_percentile_is_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 99) == 99.0
    assert percentile(values, 50) == 50.0
    assert percentile([3.0, 1.0], 99) == 3.0


def test_ttft_counts_once_when_reported_at_the_first_token():
    ctl = _ctl(target_ms=100.0, min_samples=1)
    ctl.observe(LatencySample(at_s=0.5, ttft_s=0.3))  # the first token passed
    assert ctl.measured_ms(0.6) == (pytest.approx(300.0), 1)  # counted before the end
    ctl.observe(LatencySample(at_s=0.9, ttft_s=0.3, e2e_s=0.9, output_chunks=7, count_ttft=False))
    assert ctl.measured_ms(1.0) == (pytest.approx(300.0), 1)  # not twice
    ctl.configure(signal="tpot")
    assert ctl.measured_ms(1.0) == (pytest.approx(100.0), 1)  # (0.9 - 0.3) / 6


def test_tail_chance_is_a_binomial_tail():
    assert tail_chance(8, 0, 0.01) == 1.0
    assert tail_chance(8, 1, 0.01) == pytest.approx(1 - 0.99**8)
    assert tail_chance(100, 2, 0.01) == pytest.approx(1 - 0.99**100 - 100 * 0.01 * 0.99**99)
    assert tail_chance(100, 5, 0.01) < 0.01 < tail_chance(100, 3, 0.01)
    assert tail_chance(10, 1, 0.0) == 0.0  # p100: any sample over is over


def _feed(ctl: PidController, dispatched_s: float, ttfts_s: list[float]) -> None:
    """Requests sent at `dispatched_s` (a millisecond apart), each reporting its first token."""
    for k, v in enumerate(ttfts_s):
        ctl.observe(LatencySample(at_s=dispatched_s + k * 1e-3 + v, ttft_s=v))


def test_a_cut_needs_more_slow_requests_than_chance_gives_a_window_on_target():
    # 100 requests at half the target and two stalls at twice it: the nearest-rank p99 (the
    # second slowest) is over the target, but a window whose p99 is on the target gives two
    # requests beyond it one time in four. The window stays; five such requests cut it.
    ctl = _ctl(target_ms=100.0, start_window=20)
    _feed(ctl, 0.5, [0.05] * 98 + [0.2, 0.2])
    s = ctl.step(1.0)
    assert s.measured_ms == pytest.approx(200.0) and (s.action, s.window) == ("hold-unsure", 20)
    _feed(ctl, 1.5, [0.2] * 3)
    s = ctl.step(2.0)
    assert s.action in ("step", "clamped") and s.window < 20


def test_a_single_stall_one_seat_up_does_not_cap_later_raises():
    # The window went 20 -> 21 and one of 30 requests sent under 21 stalled; then it went back
    # to 20. That one stall is no evidence against 21, so raising there again is not capped;
    # five slow requests of 35 are, and cap it.
    clock = [0.0]
    ctl = PidController(PidSettings(target_ms=100.0, start_window=20), clock=lambda: clock[0], wall=lambda: 0.0)
    ctl._move_to(21, 1.0)
    _feed(ctl, 1.1, [0.05] * 29 + [0.3])
    ctl._move_to(20, 2.0)
    clock[0] = 3.0
    assert ctl.ceiling() is None
    ctl._move_to(21, 4.0)
    _feed(ctl, 4.1, [0.3] * 4 + [0.05])
    ctl._move_to(20, 5.0)
    clock[0] = 6.0
    assert ctl.ceiling() == 21
