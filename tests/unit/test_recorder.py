"""The recorder turns status snapshots into runs with verdicts; rollback picks from those verdicts."""

from __future__ import annotations

import json

import pytest

from llmconsole.console.commands.history import format_versions
from llmconsole.db import Store
from llmconsole.db.recorder import Recorder
from llmconsole.db.versions import RollbackError, choose_target, spec_from_version, versions
from llmconsole.engine.metrics.window import WindowedMetrics
from llmconsole.engine.spec import EngineSpec
from llmconsole.engine.status import EngineState, EngineStatus


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    return tmp_path / "m"


def status(spec: EngineSpec, state: EngineState, pid: int | None, **kw) -> EngineStatus:
    return EngineStatus(
        name="e1",
        state=state,
        config_id=spec.config_id,
        model=spec.model,
        served_model_name="m",
        device="cpu",
        pid=pid,
        spec=spec.public_dict(),
        **kw,
    )


def test_runs_verdicts_and_rollback_choice(tmp_path, model_dir):
    clock = Clock()
    store = Store.open(tmp_path / "db.sqlite")
    rec = Recorder(store, stable_after_s=60, clock=clock)
    a = EngineSpec(model=str(model_dir), max_num_seqs=8, api_key="sk-secret-1")
    b = EngineSpec(model=str(model_dir), max_num_seqs=4, api_key="sk-secret-1")
    c = EngineSpec(model=str(model_dir), max_num_seqs=2, api_key="sk-secret-1")

    # a: starts, serves, is stopped by the operator -> known_good
    rec.observe(status(a, EngineState.STARTING, 11, started_at_s=clock.t))
    clock.t += 30
    rec.observe(status(a, EngineState.READY, 11, kv_cache_tokens=6144, max_concurrency=12.0))
    clock.t += 100
    rec.observe(status(a, EngineState.STOPPED, None, last_exit_code=0))
    # b: serves, then crashes 10 s after ready -> known_bad
    rec.observe(status(b, EngineState.STARTING, 12))
    rec.observe(status(b, EngineState.READY, 12))
    clock.t += 10
    rec.observe(status(b, EngineState.CRASHED, None, last_exit_code=-9, last_error="killed"))
    # c: never comes up -> known_bad
    rec.observe(status(c, EngineState.STARTING, 13))
    rec.observe(status(c, EngineState.FAILED, None, last_error="ValueError: does not fit"))

    runs = store.runs("e1")
    assert [(r.config_id, r.outcome) for r in runs] == [
        (a.config_id, "known_good"),
        (b.config_id, "known_bad"),
        (c.config_id, "known_bad"),
    ]
    assert runs[0].kv_cache_tokens == 6144 and runs[0].ready_at == 1030.0
    assert runs[2].exit_reason == "ValueError: does not fit"

    target = choose_target(store, "e1", c.config_id)
    assert target.config_id == a.config_id
    spec = spec_from_version(target, c)
    assert spec.config_id == a.config_id
    assert spec.api_key.get_secret_value() == "sk-secret-1"  # the key comes from the current spec
    with pytest.raises(RollbackError, match="never ran config"):
        choose_target(store, "e1", c.config_id, to_config_id="ffffffffffff")
    with pytest.raises(RollbackError, match="no known-good"):
        choose_target(store, "e1", a.config_id)

    hist = versions(store, "e1")
    assert [h.config_id for h in hist] == [c.config_id, b.config_id, a.config_id]
    assert hist[0].derived_from == b.config_id and hist[0].diff_from_parent == (("max_num_seqs", 4, 2),)
    assert "sk-secret-1" not in json.dumps([h.to_json() for h in hist])


def test_what_changed_is_against_the_parent_config_however_versions_were_used_later(tmp_path, model_dir):
    """A mode switch, then a rollback to the original: the original is still the first version
    (nothing changed), and the switched one still says what the switch changed."""
    clock = Clock()
    store = Store.open(tmp_path / "db.sqlite")
    rec = Recorder(store, clock=clock)
    original = EngineSpec(model=str(model_dir), gpu_memory_utilization=0.85)
    switched = EngineSpec(model=str(model_dir), kv_cache_memory_bytes=256 << 20)
    for spec, pid in ((original, 31), (switched, 32), (original, 33)):  # the last: the rollback
        clock.t += 10
        rec.observe(status(spec, EngineState.STARTING, pid))
        clock.t += 10
        rec.observe(status(spec, EngineState.READY, pid))
        clock.t += 10
        rec.observe(status(spec, EngineState.STOPPED, None, last_exit_code=0))

    hist = {h.config_id: h for h in versions(store, "e1")}
    assert hist[original.config_id].derived_from is None
    assert hist[original.config_id].diff_from_parent == ()
    assert hist[switched.config_id].derived_from == original.config_id
    assert hist[switched.config_id].diff_from_parent == (
        ("gpu_memory_utilization", 0.85, None),
        ("kv_cache_memory_bytes", None, 256 << 20),
    )
    # The CLI prints the same: `llmconsole history` reads these entries.
    text = format_versions("e1", [h.to_json() for h in versions(store, "e1")])
    original_block = text.split(original.config_id, 1)[1].split(switched.config_id, 1)[0]
    assert "gpu_memory_utilization" not in original_block
    assert f"from {original.config_id}:" in text and "gpu_memory_utilization: 0.85 -> null" in text


def test_same_config_stored_once_and_adopted_run_reused(tmp_path, model_dir):
    clock = Clock()
    store = Store.open(tmp_path / "db.sqlite")
    a = EngineSpec(model=str(model_dir), max_num_seqs=8)
    rec = Recorder(store, clock=clock)
    for pid in (21, 22):  # the same config twice: two runs, one config version
        rec.observe(status(a, EngineState.STARTING, pid))
        rec.observe(status(a, EngineState.READY, pid))
        rec.observe(status(a, EngineState.STOPPED, None))
    rec.observe(status(a, EngineState.STARTING, 23))
    rec.observe(status(a, EngineState.READY, 23))
    assert len(store.runs("e1")) == 3
    assert len(store.config_versions("e1")) == 1

    # A new daemon (a new recorder) adopts pid 23: the open run is reused, not duplicated.
    rec2 = Recorder(store, clock=clock)
    rec2.observe(status(a, EngineState.READY, 23))
    assert len(store.runs("e1")) == 3
    assert rec2.run_id("e1") == store.runs("e1")[-1].id


def test_orphaned_runs_are_closed_and_samples_written(tmp_path, model_dir):
    store = Store.open(tmp_path / "db.sqlite")
    a = EngineSpec(model=str(model_dir))
    rec = Recorder(store)
    rec.observe(status(a, EngineState.STARTING, 31))
    assert Recorder(store).close_orphans([]) == 1
    assert store.runs("e1")[0].exit_reason == "ended while no daemon was watching"

    live = status(
        a,
        EngineState.READY,
        32,
        metrics=WindowedMetrics(taken_at_s=1.0, running=3, kv_cache_usage=0.25, p99_ttft_s=0.2),
    )
    starting = status(a, EngineState.STARTING, 33)
    assert rec.sample([live, starting], at_s=5000.0) == 1
    (s,) = store.metric_samples("e1")
    assert (s.running, s.kv_cache_usage, s.p99_ttft_s) == (3, 0.25, 0.2)
