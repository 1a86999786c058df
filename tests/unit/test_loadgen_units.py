"""The load generator's pure parts, and its timing against a local stub server with known delays.

The stub (bench/bench_loadgen_stub.py) stands in only where the generator itself is measured:
its TTFT and gaps are set, so what the generator reports can be checked against the truth.
The sweep runner's restore-on-failure is checked here with a controller that records calls.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys

import pytest

from llmconsole.engine.load.generator import run_load
from llmconsole.engine.load.workload import LengthDist, Workload, exact_prompt, load_tokenizer, plan_requests
from llmconsole.engine.metrics.latency import Slo
from llmconsole.engine.sweep.plan import SweepPlan, parse_grid, parse_loads
from llmconsole.engine.sweep.probe import ResourceSample
from llmconsole.engine.sweep.report import table_rows, write_results
from llmconsole.engine.sweep.runner import EngineStartFailed, EngineTarget, SweepRunner
from tests.support.paths import ROOT

STUB = ROOT / "bench" / "bench_loadgen_stub.py"


@pytest.fixture(scope="module")
def stub():
    p = subprocess.Popen(
        [sys.executable, str(STUB), "--port", "0", "--first-delay-ms", "50", "--gap-ms", "5"],
        stdout=subprocess.PIPE,
        text=True,
    )
    port = int(p.stdout.readline().split()[-1])
    yield f"http://127.0.0.1:{port}"
    p.kill()
    p.wait()


def test_prompts_have_exact_token_counts(tiny_model):
    tok = load_tokenizer(str(tiny_model))
    rng = random.Random(3)
    for n in (1, 7, 64, 333):
        assert len(tok.encode(exact_prompt(tok, n, rng))) == n
    wl = Workload.closed(
        2, 40, LengthDist.parse("uniform:8-80"), LengthDist.parse("lognormal:20:0.5"), warmup_requests=3
    )
    plan = plan_requests(wl, tok)
    assert len(plan) == 43 and sum(r.warmup for r in plan) == 3
    assert all(len(tok.encode(r.prompt)) == r.prompt_tokens and 8 <= r.prompt_tokens <= 80 for r in plan)
    assert len({r.max_tokens for r in plan}) > 3
    assert plan_requests(wl, tok) == plan  # the seed makes it repeatable


def test_length_and_workload_validation():
    assert LengthDist.parse("64").describe() == "64"
    for bad in ("0", "uniform:9-3", "lognormal:x", "weird:3"):
        with pytest.raises(ValueError):
            LengthDist.parse(bad)
    with pytest.raises(ValueError):
        Workload.closed(0, 10, 8, 8)
    with pytest.raises(ValueError):
        Workload.open(0, 10, 8, 8)


def test_gamma_arrivals_have_the_asked_rate_and_burstiness():
    rng = random.Random(0)
    smooth = Workload.open(10, 10, 8, 8, burstiness=4.0).arrival_offsets_s(5000, rng)
    bursty = Workload.open(10, 10, 8, 8, burstiness=0.25).arrival_offsets_s(5000, rng)
    for offs in (smooth, bursty):
        assert offs[-1] / (len(offs) - 1) == pytest.approx(0.1, rel=0.1)
    gaps = lambda o: [b - a for a, b in zip(o, o[1:], strict=False)]  # noqa: E731
    import statistics

    assert statistics.pstdev(gaps(bursty)) > 3 * statistics.pstdev(gaps(smooth))


def test_timing_matches_the_stubs_known_delays(stub, tiny_model):
    wl = Workload.closed(4, 40, 16, 10, warmup_requests=4)
    r = asyncio.run(run_load(stub, "tiny", wl, tokenizer_source=str(tiny_model), slo=Slo.parse(["ttft_ms=1000"])))
    s = r.summary
    assert (s.completed, s.failed, r.stopped_early) == (40, 0, None)
    assert sum(x.warmup for x in r.records) == 4  # warm-up records are kept, flagged, and left out
    assert s.requests == 40
    # 50 ms to the first chunk, then 5 ms gaps: what the generator measures is never less and
    # only a few ms more (more slack than it needs here: these cores are shared).
    assert 50 <= s.ttft.median_ms < 50 + 30
    assert 5 <= s.tpot.median_ms < 5 + 5
    assert s.itl.count == 40 * 9  # one gap per chunk after the first
    assert s.output_tokens == 400 and s.goodput_req_s == pytest.approx(s.request_throughput_req_s)


def test_time_bound_and_stop_keep_partial_results(stub, tiny_model):
    wl = Workload.open(20, 1000, 16, 10, max_duration_s=1.0)
    r = asyncio.run(run_load(stub, "tiny", wl, tokenizer_source=str(tiny_model)))
    assert r.stopped_early == "time limit"
    assert 0 < r.summary.completed < 40  # about 20 arrive in the second; 1,000 were planned
    assert r.summary.duration_s == pytest.approx(1.0, abs=0.3)

    wl = Workload.closed(2, 1000, 16, 10)
    plan = plan_requests(wl, load_tokenizer(str(tiny_model)))

    async def interrupted():
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(0.7, stop.set)
        return await run_load(stub, "tiny", wl, plan=plan, stop=stop)

    r = asyncio.run(interrupted())
    s = r.summary
    assert r.stopped_early == "interrupted" and s.completed > 0 and s.cancelled == 2
    assert s.requests == s.completed + s.cancelled  # the rest were never sent


def test_errors_are_counted_by_kind(tiny_model):
    wl = Workload.closed(2, 4, 8, 4)
    r = asyncio.run(run_load("http://127.0.0.1:9", "tiny", wl, tokenizer_source=str(tiny_model)))
    assert r.summary.errors_by_kind == {"connect": 4} and r.summary.completed == 0


class RecordingController:
    """Serves every config from the stub; fails to start on max_num_seqs=99."""

    def __init__(self, url: str, model: str):
        self.calls: list[tuple[str, dict]] = []
        self.spec = {"max_num_seqs": 8}
        self.url, self.model = url, model

    def _target(self):
        return EngineTarget(self.url, "tiny", self.model, f"cfg{self.spec['max_num_seqs']}", dict(self.spec))

    async def current(self):
        return self._target()

    async def apply(self, overrides):
        self.calls.append(("apply", dict(overrides)))
        self.spec = {**self.spec, **overrides}
        if overrides.get("max_num_seqs") == 99:
            raise EngineStartFailed("ValueError: does not fit")
        return self._target()

    async def restore(self, original):
        self.calls.append(("restore", dict(original.spec)))
        self.spec = dict(original.spec)
        return self._target()

    async def resources(self):
        return ResourceSample(1_500_000_000, "host RSS", None, None, "CPU engine: no NVML")


def test_sweep_restores_after_a_failed_config_and_marks_points(stub, tiny_model, tmp_path):
    plan = SweepPlan(
        "e",
        parse_grid(["max_num_seqs=4,99"], {"max_num_seqs"}),
        parse_loads(["concurrency=1,2"]),
        slo=Slo.parse(["p99_e2e_ms=5000"]),
        repeats=2,
        num_requests=6,
        input_len=LengthDist.fixed(8),
        output_len=LengthDist.fixed(4),
        warmup_requests=1,
    )
    ctl = RecordingController(stub, str(tiny_model))
    events = []
    result = asyncio.run(SweepRunner(plan, ctl, on_progress=events.append).run())
    assert [c[0] for c in ctl.calls] == ["apply", "apply", "restore"]
    assert ctl.spec == {"max_num_seqs": 8} and result.restored
    assert [p.status for p in result.points] == ["ok", "ok", "failed", "failed"]
    assert "does not fit" in result.points[2].reason
    assert result.points[0].repeats == 2 and result.points[0].memory_bytes == 1_500_000_000
    rows, notes = table_rows(result)
    assert all(cell and ("N/A [" not in cell or int(cell.split("[")[1][0]) <= len(notes)) for r in rows for cell in r)
    assert any("no NVML" in n for n in notes)
    assert events[-1].event == "restored" and any(e.event == "point_finished" for e in events)
    files = write_results(result, tmp_path)
    assert "<svg" in files["plot"].read_text() and "| params |" in files["markdown"].read_text()


def test_sweep_stopped_midway_still_restores(stub, tiny_model):
    plan = SweepPlan(
        "e",
        {"max_num_seqs": (4, 6)},
        parse_loads(["concurrency=1"]),
        repeats=1,
        num_requests=400,
        input_len=LengthDist.fixed(8),
        output_len=LengthDist.fixed(4),
        warmup_requests=0,
    )
    ctl = RecordingController(stub, str(tiny_model))

    async def go():
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(1.0, stop.set)
        return await SweepRunner(plan, ctl, stop=stop).run()

    result = asyncio.run(go())
    assert result.status == "cancelled" and result.restored
    assert ctl.calls[-1][0] == "restore" and ctl.spec == {"max_num_seqs": 8}
    assert [p.status for p in result.points] == ["skipped", "skipped"]


def test_a_broken_slo_skips_the_heavier_loads(stub, tiny_model):
    plan = SweepPlan(
        "e",
        {},
        parse_loads(["concurrency=1,2,4"]),
        slo=Slo.parse(["p99_e2e_ms=10"]),
        repeats=1,
        num_requests=4,
        input_len=LengthDist.fixed(8),
        output_len=LengthDist.fixed(4),
        warmup_requests=0,
    )
    ctl = RecordingController(stub, str(tiny_model))
    result = asyncio.run(SweepRunner(plan, ctl).run())
    assert ctl.calls == []  # no grid: the engine is measured as it runs, never restarted
    assert [p.status for p in result.points] == ["slo_missed", "skipped", "skipped"]
    assert "p99_e2e_ms" in result.points[0].reason
    assert result.points[1].reason.startswith("skipped: the SLO broke at concurrency=1")


def test_saturation_rule_needs_flat_throughput_and_rising_latency():
    from llmconsole.engine.sweep.plan import LoadLevel, PointResult
    from llmconsole.engine.sweep.runner import saturation

    def pt(thr, p99, c):
        return PointResult(1, {}, LoadLevel("concurrency", c), "ok", throughput_req_s=thr, latency_ms={"p99_e2e": p99})

    plan = SweepPlan("e", {}, parse_loads(["concurrency=1"]))
    assert saturation(plan, pt(10, 100, 4), pt(10.3, 180, 8)).startswith("saturated at concurrency=8")
    assert saturation(plan, pt(10, 100, 4), pt(12, 180, 8)) is None  # throughput still rising
    assert saturation(plan, pt(10, 100, 4), pt(10.1, 110, 8)) is None  # latency not climbing
