"""A small sweep the console's tests share: the form that plans it and four measured points
(two batch sizes x two loads), as the runner reports them."""

from __future__ import annotations

from llmconsole.console.tui.views.sweep import SWEEP_DEFAULTS
from llmconsole.engine.sweep.plan import LoadLevel, PointResult

FORM = dict(SWEEP_DEFAULTS, grid="max_num_seqs=4,8", load="concurrency=1,2", slo="p99_e2e_ms=5000")


def point(index: int, seqs: int, conc: int, thr: float, p99_ms: float) -> PointResult:
    return PointResult(
        index,
        {"max_num_seqs": seqs},
        LoadLevel("concurrency", conc),
        "ok",
        config_id=f"cfg{seqs}",
        repeats=2,
        throughput_req_s=thr,
        throughput_tok_s=thr * 32,
        goodput_req_s=thr,
        slo_attainment=1.0,
        error_rate=0.0,
        latency_ms={"p99_e2e": p99_ms, "p50_ttft": 20.0},
        memory_bytes=900_000_000,
        memory_source="host RSS",
        util_na_reason="CPU engine: NVML reports utilization only for GPUs",
    )


P1, P2 = point(1, 4, 1, 2.0, 500.0), point(2, 4, 2, 3.0, 650.0)
P3, P4 = point(3, 8, 1, 2.1, 480.0), point(4, 8, 2, 3.5, 700.0)
