"""The tuner's pure rules: knobs and budgets, successive halving, constraints, re-measurement,
the winner, the guard's judgement, and the study journal's constraint bookkeeping and resume."""

from __future__ import annotations

import pytest

from llmconsole.engine.gateway.group import RequestRecord
from llmconsole.engine.metrics.latency import Slo
from llmconsole.engine.tune.guard import GuardSettings, WindowFigures, breach, sustained, window_figures
from llmconsole.engine.tune.select import Remeasured, pick_winner, remeasure_candidates
from llmconsole.engine.tune.space import (
    Budget,
    Knob,
    TrialOutcome,
    clamp_to_workload,
    constraint_value,
    default_space,
    halving_rungs,
    keep_going,
    parse_budget,
    parse_knob,
    startup_trials,
    study_name,
)
from llmconsole.engine.tune.tuner import open_study, outcomes, suggest_params


def test_knobs_parse_ranges_and_choices_and_refuse_the_rest():
    assert parse_knob("max_num_seqs=1:32") == Knob("max_num_seqs", low=1, high=32)
    assert parse_knob("kernel=stock,custom").choices == ("stock", "custom")
    assert parse_knob("max-num-batched-tokens=256,512,256").choices == (256, 512)
    assert parse_knob("gpu_memory_utilization=0.5,0.9").choices == (0.5, 0.9)
    for bad, msg in [
        ("model=x", "cannot be tuned"),
        ("max_num_seqs=8:2", "LOW <= HIGH"),
        ("kernel=fast", "stock or custom"),
        ("max_num_seqs=0,4", "whole numbers"),
        ("max_num_seqs=", "FIELD=LOW:HIGH"),
        ("gpu_memory_utilization=1.5", r"\(0, 1\]"),
    ]:
        with pytest.raises(ValueError, match=msg):
            parse_knob(bad)


def test_max_model_len_never_below_what_the_workload_needs():
    knobs = clamp_to_workload(
        (Knob("max_model_len", choices=(128, 256, 512)), Knob("max_model_len", low=64, high=1024)), 200
    )
    assert knobs[0].choices == (256, 512) and (knobs[1].low, knobs[1].high) == (200, 1024)
    with pytest.raises(ValueError, match="needs"):
        clamp_to_workload((Knob("max_model_len", choices=(64,)),), 200)


def test_default_space_follows_the_running_config():
    space = {
        k.name: k
        for k in default_space({"max_num_seqs": 8, "max_num_batched_tokens": 1024, "kv_cache_memory_bytes": 100}, 4)
    }
    assert space["max_num_seqs"].high == 16 and space["max_num_batched_tokens"].choices == (256, 512, 1024, 2048)
    # The KV size moves only when asked for (its range then fits max_model_len: ranges.py).
    assert set(space) == {"max_num_seqs", "max_num_batched_tokens"}


def test_budget_and_study_name():
    assert parse_budget("12") == Budget(trials=12) and parse_budget("30m") == Budget(minutes=30)
    assert [startup_trials(Budget(trials=n)) for n in (1, 3, 6, 12, 40)] == [1, 2, 3, 4, 4]
    assert startup_trials(Budget(minutes=30)) == 4
    for bad in ("0", "x", "-3m", "0m"):
        with pytest.raises(ValueError):
            parse_budget(bad)
    k = (Knob("max_num_seqs", low=1, high=8),)
    a = study_name("e", {"load": "concurrency=4"}, {"p99_e2e_ms": 100}, k)
    assert a == study_name("e", {"load": "concurrency=4"}, {"p99_e2e_ms": 100}, k)
    assert a != study_name("e", {"load": "concurrency=4"}, {"p99_e2e_ms": 200}, k)
    assert a != study_name("e", {"load": "concurrency=8"}, {"p99_e2e_ms": 100}, k) and a.startswith("e-")


def test_successive_halving_rungs_and_the_cut():
    assert halving_rungs(72, eta=3, min_requests=8) == (8, 24, 72)
    assert halving_rungs(16, eta=3, min_requests=8) == (16,)
    assert keep_going(1.0, [], eta=3) and keep_going(0.1, [5.0], eta=3)  # too few peers to judge
    peers = [5.0, 4.0, 3.0, 2.0, 1.0, 0.5]  # top third: >= 4.0
    assert keep_going(4.0, peers, eta=3) and not keep_going(3.9, peers, eta=3)
    # With a margin, only a trial clearly below the cut stops: 30% under 4.0 is 2.8.
    assert keep_going(2.9, peers, eta=3, margin=0.3) and not keep_going(2.7, peers, eta=3, margin=0.3)


def test_constraints():
    assert constraint_value("start_failed", None, 0.5) == 1.0 and constraint_value("failed", 1.0, 0.5) == 1.0
    assert constraint_value("slo_missed", 0.2, 0.5) == pytest.approx(0.3)
    assert constraint_value("slo_missed", 0.7, 0.5) == 0.0 and constraint_value("ok", 1.0, 0.5) == 0.0


def test_remeasure_the_best_distinct_feasible_configs():
    o = [
        TrialOutcome(0, {"s": 1}, "complete", 2.0, 24),
        TrialOutcome(1, {"s": 2}, "complete", 3.0, 24),
        TrialOutcome(2, {"s": 2}, "complete", 2.9, 24),
        TrialOutcome(3, {"s": 4}, "pruned", 9.0, 8),
        TrialOutcome(4, {"s": 8}, "infeasible", 9.5, 24),
        TrialOutcome(5, {"s": 16}, "complete", 1.0, 24),
    ]
    assert [c.number for c in remeasure_candidates(o, 2)] == [1, 0]
    noisy = Remeasured(1, {"s": 2}, (2.0, 3.1, 4.0))
    assert noisy.median_req_s == 3.1 and noisy.mean_req_s == pytest.approx(3.0333, abs=1e-3)
    assert noisy.spread == pytest.approx(2.0 / 3.1)
    assert pick_winner([Remeasured(0, {}, (1.0, 1.0)), Remeasured(1, {}, (2.0, 2.0))]).number == 1
    assert pick_winner([Remeasured(0, {}, ())]) is None


def _rec(at: float, outcome: str = "ok", e2e: float = 0.1, ttft: float = 0.01) -> RequestRecord:
    return RequestRecord("g", "e", "/v1/completions", 200, outcome, True, at, 0.0, ttft, e2e, ttft, e2e, 8)


def test_guard_window_figures_breach_and_sustained():
    slo = Slo.parse(["p99_e2e_ms=500"])
    recs = [_rec(10.0 + i) for i in range(6)] + [_rec(12.5, e2e=0.9), _rec(13.5, "engine_error"), _rec(99.0)]
    fig = window_figures(recs, slo, 10.0, 20.0)
    assert (fig.requests, fig.errors, fig.good) == (8, 1, 6)
    g = GuardSettings(min_attainment=0.9, max_error_rate=0.2, min_requests=5)
    assert "SLO met by 86%" in breach(fig, g)
    assert "error rate 50%" in breach(WindowFigures(6, 3, 3), g)
    assert breach(WindowFigures(4, 4, 0), g) is None  # too few requests to say anything
    checks = [(0.0, None), (2.0, "bad"), (4.0, "bad"), (6.0, "bad")]
    assert sustained(checks, 6.0, 4.0) == "bad"
    assert sustained(checks, 6.0, 6.5) is None  # the good check at 0 s lies inside the window
    assert sustained([(5.0, "bad"), (6.0, "bad")], 6.0, 4.0) is None  # watched for less than a window


def test_guard_tpot_counts_tokens_as_the_controller_does():
    from dataclasses import replace

    slo = Slo.parse(["p99_tpot_ms=100"])
    # 1 s after the first token: 11 events with no usage frame are 11 tokens, 100 ms each (good);
    # a usage count of 6 over 3 merged events is 200 ms each (bad).
    events = replace(_rec(10.0, e2e=1.1, ttft=0.1), output_chunks=11)
    merged = replace(_rec(11.0, e2e=1.1, ttft=0.1), output_chunks=3, output_tokens=6)
    assert window_figures([events, merged], slo, 10.0, 20.0) == WindowFigures(2, 0, 1)


def test_journal_keeps_constraints_and_resumes(tmp_path):
    path = tmp_path / "studies.journal"
    study = open_study(path, "s", seed=1)
    t = study.ask()
    t.suggest_int("max_num_seqs", 1, 8)
    t.set_user_attr("outcome", "infeasible")
    t.set_constraint("constraint", 1.0)
    study.tell(t, 0.0)
    t2 = study.ask()
    t2.suggest_int("max_num_seqs", 1, 8)  # left running, as a killed tune leaves it
    again = open_study(path, "s", seed=1)
    assert [o.state for o in outcomes(again)] == ["infeasible", "running"]
    assert again.trials[0].constraints == {"constraint": 1.0}
    again.tell(1, state=__import__("optuna").trial.TrialState.FAIL)
    assert [o.state for o in outcomes(open_study(path, "s", seed=1))] == ["infeasible", "interrupted"]
    t3 = again.ask()
    assert t3.number == 2


def test_number_lists_are_searched_in_order_and_kept_as_values(tmp_path):
    study = open_study(tmp_path / "j", "o", seed=3)
    knobs = (
        Knob("max_num_seqs", choices=(16, 1, 4)),
        Knob("kernel", choices=("stock", "custom")),
        Knob("max_num_batched_tokens", low=64, high=4096),
    )
    t = study.ask()
    params = suggest_params(t, knobs)
    assert params["max_num_seqs"] in (1, 4, 16) and params["kernel"] in ("stock", "custom")
    assert 64 <= params["max_num_batched_tokens"] <= 4096
    assert t.params["max_num_seqs"] == sorted((16, 1, 4)).index(params["max_num_seqs"])  # its position
    study.tell(t, 1.0)
    assert outcomes(study)[0].params == params
