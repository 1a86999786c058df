"""The tuner's search and where its ranges come from: the pattern search on known shapes, the
first trial, the planner-derived ranges (the tiny model's real config.json), the window knobs."""

from __future__ import annotations

import itertools
import math

import optuna
import pytest

from llmconsole.engine.tune.ranges import EngineFacts, derive_space
from llmconsole.engine.tune.search import Probe, encode, lattice, line_next, next_config, snap, start_config
from llmconsole.engine.tune.space import Budget, Knob, parse_knob, split_params
from llmconsole.engine.tune.tuner import ask_next, history, make_sampler, outcomes


def test_lattice_and_snap():
    assert lattice(Knob("max_num_seqs", choices=(16, 2, 8))) == (2, 8, 16)
    assert lattice(Knob("kernel", choices=("stock", "custom"))) == ("stock", "custom")
    assert lattice(Knob("max_num_seqs", low=1, high=6)) == (1, 2, 3, 4, 5, 6)
    big = lattice(Knob("max_num_seqs", low=1, high=256))
    assert big[0] == 1 and big[-1] == 256 and 8 <= len(big) <= 10 and list(big) == sorted(big)
    seqs = Knob("max_num_seqs", choices=(2, 4, 8, 16, 32))
    assert snap(seqs, 9) == 8 and snap(seqs, 12) == 16 and snap(seqs, 1000) == 32
    assert snap(seqs, None) == 8  # unknown: the middle
    assert snap(Knob("kernel", choices=("stock", "custom")), "fast") == "stock"


def test_line_search_brackets_a_single_peak_in_few_probes():
    for n, peak in itertools.product((5, 8, 12), range(12)):
        if peak >= n:
            continue
        f = {i: -abs(i - peak) for i in range(n)}
        probes = {}
        nxt = n // 2
        while nxt is not None:
            probes[nxt] = f[nxt]
            nxt = line_next(probes, n)
            assert nxt is None or nxt not in probes
        assert max(probes, key=probes.get) == peak
        assert len(probes) <= 2 * math.ceil(math.log2(n)) + 1, (n, peak, probes)


def test_line_search_stops_when_both_neighbours_are_known():
    assert line_next({3: 5.0, 2: 4.0, 4: 4.5}, 8) is None
    assert line_next({0: 5.0, 1: 4.0}, 8) is None  # the edge counts as a known neighbour
    assert line_next({3: 5.0}, 8) == 5  # the larger gap (right) first
    assert line_next({5: 5.0, 3: 4.0}, 8) == 6  # between the best and the edge
    assert line_next({3: -math.inf, 5: 1.0}, 8) == 6


def _climb(f, knobs, start, budget):
    hist = []
    for _ in range(budget):
        p = next_config(hist, knobs, start)
        if p is None:
            break
        hist.append(Probe(p, f(p)))
    return hist


def test_pattern_search_finds_the_peak_from_the_planners_start():
    knobs = [
        Knob("max_num_seqs", choices=(2, 4, 8, 12, 16, 32)),
        Knob("max_num_batched_tokens", choices=(128, 512)),
        Knob("kernel", choices=("stock", "custom")),
    ]

    def f(p):
        s = p["max_num_seqs"]
        if s == 32 and p["max_num_batched_tokens"] == 128:
            return None  # does not start
        return (
            10
            * s
            / (1 + (s / 10) ** 3)
            * (1.1 if p["max_num_batched_tokens"] == 512 else 1)
            * (1.03 if p["kernel"] == "custom" else 1)
        )

    hist = _climb(f, knobs, {"max_num_seqs": 9, "max_num_batched_tokens": 128, "kernel": "stock"}, 8)
    assert hist[0].params == {"max_num_seqs": 8, "max_num_batched_tokens": 128, "kernel": "stock"}
    best = max((h for h in hist if h.value is not None), key=lambda h: h.value)
    assert best.params == {"max_num_seqs": 8, "max_num_batched_tokens": 512, "kernel": "custom"}
    assert len({str(h.params) for h in hist}) == len(hist)  # never the same config twice
    # Settled: every neighbour of the best is known, so the rest of the budget goes to TPE.
    assert next_config(_climb(f, knobs, hist[0].params, 24), knobs, hist[0].params) is None


def test_settled_search_checks_the_runner_ups_neighbours():
    knobs = [Knob("max_num_seqs", choices=(2, 4, 8)), Knob("kernel", choices=("stock", "custom"))]
    hist = [
        Probe({"max_num_seqs": 4, "kernel": "stock"}, 10.0),
        Probe({"max_num_seqs": 8, "kernel": "stock"}, 9.8),
        Probe({"max_num_seqs": 2, "kernel": "stock"}, 5.0),
        Probe({"max_num_seqs": 4, "kernel": "custom"}, 7.0),
    ]
    # Every neighbour of the best is known; the runner-up (8, stock) has custom left unmeasured.
    assert next_config(hist, knobs, {"max_num_seqs": 4, "kernel": "stock"}) == {"max_num_seqs": 8, "kernel": "custom"}
    hist.append(Probe({"max_num_seqs": 8, "kernel": "custom"}, 6.0))
    assert next_config(hist, knobs, {"max_num_seqs": 4, "kernel": "stock"}) is None


def test_configs_tied_with_the_best_get_their_kernel_tried_before_re_checks():
    knobs = [
        Knob("max_num_seqs", choices=(4, 8, 12, 16)),
        Knob("max_num_batched_tokens", choices=(128, 512)),
        Knob("kernel", choices=("stock", "custom")),
    ]

    def p(seqs: int, tokens: int, kernel: str, v: float) -> Probe:
        return Probe({"max_num_seqs": seqs, "max_num_batched_tokens": tokens, "kernel": kernel}, v)

    start = {"max_num_seqs": 8, "max_num_batched_tokens": 512, "kernel": "stock"}
    hist = [
        p(8, 512, "stock", 10.0),
        p(16, 512, "stock", 7.0),
        p(4, 512, "stock", 6.0),
        p(12, 512, "stock", 10.3),
        p(12, 128, "stock", 10.6),
        p(12, 128, "custom", 9.0),
    ]
    # 12/128 leads 12/512 by 3%, one run's noise: the kernel is tried at 12/512 too before the
    # batch size is re-checked around 12/128.
    assert next_config(hist, knobs, start) == {"max_num_seqs": 12, "max_num_batched_tokens": 512, "kernel": "custom"}
    # With no tie allowed, the search follows the 3% lead.
    assert next_config(hist, knobs, start, tie=0.0)["max_num_batched_tokens"] == 128
    # A lead past the tie: the re-checks around the best come first.
    hist[4] = p(12, 128, "stock", 13.0)
    assert next_config(hist, knobs, start)["max_num_batched_tokens"] == 128


def test_pattern_search_walks_down_when_nothing_starts():
    knobs = [Knob("max_num_seqs", choices=(1, 2, 4, 8, 16, 32, 64))]
    hist = [Probe({"max_num_seqs": 16}, None)]
    assert next_config(hist, knobs, {"max_num_seqs": 16}) == {"max_num_seqs": 4}


def test_ask_next_queues_the_search_into_the_study_and_tpe_takes_over():
    knobs = (Knob("max_num_seqs", choices=(2, 4, 8)), Knob("kernel", choices=("stock", "custom")))
    assert encode({"max_num_seqs": 8, "kernel": "custom"}, knobs) == {"max_num_seqs": 2, "kernel": "custom"}
    study = optuna.create_study(direction="maximize", sampler=make_sampler(0, Budget(trials=10)))
    seen = []
    for _ in range(8):
        t, params = ask_next(study, knobs, {"max_num_seqs": 4, "kernel": "stock"})
        seen.append(params)
        t.set_user_attr("outcome", "complete")
        t.set_user_attr("goodput_req_s", float(params["max_num_seqs"] == 4) + (params["kernel"] == "custom"))
        study.tell(t, 1.0)
    assert seen[0] == {"max_num_seqs": 4, "kernel": "stock"}
    assert len({str(p) for p in seen[:4]}) == 4  # the pattern search's own probes are distinct
    assert [p.value for p in history(study)][:2] == [1.0, 0.0]
    assert outcomes(study)[0].params == seen[0]
    # TPE throughout still starts from the given point.
    study2 = optuna.create_study(direction="maximize", sampler=make_sampler(0, Budget(trials=4)))
    _, first = ask_next(study2, knobs, {"max_num_seqs": 8, "kernel": "custom"}, search="tpe")
    assert first == {"max_num_seqs": 8, "kernel": "custom"}


def test_start_config_snaps_every_knob():
    knobs = [Knob("max_num_seqs", low=1, high=64), Knob("kernel", choices=("stock", "custom"))]
    s = start_config(knobs, {"max_num_seqs": 9})
    assert s["kernel"] == "stock" and s["max_num_seqs"] in lattice(knobs[0]) and 6 <= s["max_num_seqs"] <= 13


def test_window_knobs_parse_and_split_from_spec_fields():
    assert parse_knob("gateway_max_window=2,8").choices == (2, 8)
    assert parse_knob("max_num_seqs") == Knob("max_num_seqs") and Knob("max_num_seqs").open
    spec, window = split_params({"max_num_seqs": 4, "gateway_min_window": 1, "gateway_max_window": 8})
    assert spec == {"max_num_seqs": 4} and window == {"min_window": 1, "max_window": 8}


def test_ranges_from_the_planner_for_the_tiny_model(tiny_model):
    # 20 blocks of 128 tokens x 512 bytes: requests of 160 tokens take 2 blocks, one block is the
    # pool's null block, so 9 fit at once.
    facts = EngineFacts(
        model=str(tiny_model),
        spec={
            "max_model_len": 256,
            "kv_cache_memory_bytes": 20 * 65536,
            "max_num_seqs": 32,
            "max_num_batched_tokens": 512,
        },
        window={"min_window": 2, "max_window": 16},
    )
    knobs = [
        parse_knob(k)
        for k in (
            "max_num_seqs",
            "max_model_len",
            "kv_cache_memory_bytes",
            "kernel",
            "gateway_max_window",
            "max_num_batched_tokens=128,512",
        )
    ]
    space = derive_space(knobs, facts, input_len=100, output_len=60, concurrency=24)
    by = {k.name: k for k in space.knobs}
    assert space.kv.requests_at_once == 9
    assert (by["max_num_seqs"].low, by["max_num_seqs"].high) == (1, 18)
    assert (
        "planner" in space.sources["max_num_seqs"] and "holds 9 requests of 160 tokens" in space.sources["max_num_seqs"]
    )
    assert (by["max_model_len"].low, by["max_model_len"].high) == (160, 2048)  # the model's own limit
    assert space.sources["max_num_batched_tokens=128,512".split("=")[0]] == "given"
    assert by["kv_cache_memory_bytes"].choices[0] < 20 * 65536 < by["kv_cache_memory_bytes"].choices[-1]
    # Every KV size serves one request of the longest max_model_len searched (2,048: 16 blocks
    # and the null block), so none is refused at start.
    assert by["kv_cache_memory_bytes"].choices[0] == 17 * 65536
    assert "engine limits" in space.sources["gateway_max_window"] and by["gateway_max_window"].high == 32
    assert space.start["max_num_seqs"] == 9 and "KV cache holds 9" in space.start_why["max_num_seqs"]
    assert space.start["gateway_max_window"] == 16 and space.start["kernel"] == "stock"
    assert any(line.startswith("first trial: max_num_seqs=9") for line in space.describe())
    # The load's concurrency caps the start when it is lower than what the KV holds.
    assert derive_space(knobs, facts, input_len=100, output_len=60, concurrency=4).start["max_num_seqs"] == 4


def test_ranges_fall_back_to_the_engine_limits_without_a_model_shape(tmp_path):
    facts = EngineFacts(model=str(tmp_path / "no-such-model"), spec={"max_num_seqs": 8})
    space = derive_space(
        [Knob("max_num_seqs"), Knob("max_num_batched_tokens")], facts, input_len=32, output_len=16, concurrency=4
    )
    assert space.kv is None and all(s.startswith("engine limits") for s in space.sources.values())
    assert space.knobs[0].high == 16 and space.start["max_num_seqs"] == 4
    with pytest.raises(ValueError, match="kv_cache_memory_bytes has no range"):
        derive_space([Knob("kv_cache_memory_bytes")], facts, input_len=32, output_len=16, concurrency=4)
