"""The console's default tune on the demo engine as `make run` leaves it: every config its
derived ranges may run can start, the knobs it moves are the two the form and `--help` name,
and what a dry run calls trial 0 is what the study runs first.

The demo engine: the `small` model (its config.json is all the planner reads), max_num_seqs 16,
max_model_len 2,048, a 256 MiB KV cache; the console form's prefilled values.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from llmconsole.engine.plan.kv_math import kv_capacity, layout_for
from llmconsole.engine.plan.model_shape import read_shape
from llmconsole.engine.tune.ranges import EngineFacts
from llmconsole.engine.tune.request import TuneRequest
from llmconsole.engine.tune.search import lattice
from llmconsole.engine.tune.space import TrialOutcome
from llmconsole.engine.tune.study import ask_next, open_study
from llmconsole.engine.tune.verdict import infeasible_lines
from llmconsole.random_model import SIZES

DEMO_SPEC = {"max_num_seqs": 16, "max_model_len": 2048, "kv_cache_memory_bytes": 268_435_456, "enforce_eager": True}
# The console form's prefilled values (console/tui/views/tune.py TUNE_FIELDS).
FORM = dict(workload="concurrency=2", slo=["p99_e2e_ms=10000"], budget="6", input_len="64", output_len="32")


@pytest.fixture
def small_model(tmp_path: Path) -> Path:
    s = SIZES["small"]
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "dtype": "bfloat16",
        "head_dim": s.head_dim,
        "hidden_size": s.hidden_size,
        "intermediate_size": s.intermediate_size,
        "max_position_embeddings": s.max_position_embeddings,
        "num_attention_heads": s.num_attention_heads,
        "num_hidden_layers": s.num_hidden_layers,
        "num_key_value_heads": s.num_key_value_heads,
        "vocab_size": s.vocab_size,
        "tie_word_embeddings": False,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def _settings(model: Path, knobs: list[str] | None = None):
    facts = EngineFacts(model=str(model), spec={**DEMO_SPEC, "model": str(model)})
    return TuneRequest(engine="demo", knobs=knobs or [], **FORM).settings(facts)


def _starts(model: Path, spec: dict) -> str | None:
    """Why vLLM would refuse this config at start (its KV and scheduler checks), or None."""
    layout = layout_for(read_shape(model), device="cpu")
    cap = kv_capacity(layout, spec["kv_cache_memory_bytes"], spec["max_model_len"])
    if not cap.fits:
        return f"KV {spec['kv_cache_memory_bytes']:,} cannot hold one request of {spec['max_model_len']}"
    mbt = spec.get("max_num_batched_tokens") or 2048
    if mbt < spec["max_num_seqs"]:
        return f"token budget {mbt} below max_num_seqs {spec['max_num_seqs']}"
    return None


def _every_config(settings) -> list[dict]:
    axes = [[(k.name, v) for v in (lattice(k) if k.choices else {*lattice(k), *k.bounds})] for k in settings.knobs]
    return [dict(c) for c in itertools.product(*axes)]


def test_the_default_tune_moves_the_knobs_it_names_and_every_config_starts(small_model):
    settings, space = _settings(small_model)
    assert tuple(k.name for k in settings.knobs) == ("max_num_seqs", "max_num_batched_tokens")
    refused = [(c, why) for c in _every_config(settings) if (why := _starts(small_model, {**DEMO_SPEC, **c}))]
    assert refused == []
    # The batch-size note says what the range is, cap included.
    assert "capped at vLLM's 256" in space.sources["max_num_seqs"] and settings.knobs[0].bounds == (1, 256)


def test_a_kv_knob_named_bare_fits_max_model_len_and_the_host(small_model):
    for knobs in (["kv_cache_memory_bytes"], ["max_model_len", "kv_cache_memory_bytes"]):
        settings, space = _settings(small_model, knobs)
        refused = [(c, why) for c in _every_config(settings) if (why := _starts(small_model, {**DEMO_SPEC, **c}))]
        assert refused == [], knobs
        kv = next(k for k in settings.knobs if k.name == "kv_cache_memory_bytes")
        assert DEMO_SPEC["kv_cache_memory_bytes"] in kv.choices and "at most" in space.sources[kv.name]


def test_dry_runs_trial_0_is_the_first_trial_the_study_runs(small_model, tmp_path):
    for knobs in ([], ["max_model_len", "kv_cache_memory_bytes"]):
        settings, space = _settings(small_model, knobs)
        study = open_study(tmp_path / f"j{len(knobs)}.journal", settings.name, settings.seed, settings.budget)
        _, params = ask_next(study, settings.knobs, settings.start, settings.search)
        assert params == settings.first_trial == space.first
        # What `tune --dry-run` prints (space.describe) names each value trial 0 runs.
        line = space.describe()[-1]
        assert line.startswith("first trial: ")
        for k, v in params.items():
            assert f"{k}={v} " in line
    settings, _ = _settings(small_model)
    # The running engine sets no token budget: trial 0 runs vLLM's default, as said.
    assert settings.first_trial == {"max_num_seqs": 2, "max_num_batched_tokens": 2048}


def test_a_study_with_every_trial_infeasible_says_why_and_what_to_change():
    why = "did not start: KV cache too small for max_model_len 2048"
    trials = [TrialOutcome(n, {"kv_cache_memory_bytes": 2 << 20}, "infeasible", None, 0, why) for n in range(3)]
    lines = infeasible_lines(trials)
    assert lines[0] == "every trial was infeasible (3):"
    assert lines[1] == f"  trials 0, 1, 2: {why}" and lines[-1].startswith("what to change: give knobs values")
    ok = TrialOutcome(3, {}, "complete", 1.0, 8)
    assert infeasible_lines([*trials, ok]) == []


def test_an_slo_missed_by_every_trial_says_by_how_much():
    from llmconsole.engine.tune.verdict import infeasible_lines

    trials = [
        TrialOutcome(n, {"max_num_seqs": 2}, "infeasible", 0.02, 8, f"p99_e2e_ms {ms} > 10000")
        for n, ms in enumerate((24491, 16029, 36080))
    ]
    advice = infeasible_lines(trials)[-1]
    assert advice.startswith("what to change: the trials measured p99_e2e_ms 16,029-36,080 against the SLO's 10000")
