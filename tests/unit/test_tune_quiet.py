"""The autopilot's scheduled tune waits for quiet traffic: a tune restarts its engine on trial
configs, and on a timer alone it started wherever the timer fell, the evening peak included."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from llmconsole.daemon.services.tune_service import TuneService
from llmconsole.engine.autopilot.plan import AutopilotPlan
from llmconsole.engine.metrics.latency import Slo
from llmconsole.engine.tune.quiet import QuietSettings, busy_reason

S = QuietSettings(window_s=60.0, lookback_s=3600.0)


def _every(start_s: float, end_s: float, gap_s: float) -> list[float]:
    n = int((end_s - start_s) / gap_s)
    return [start_s + i * gap_s for i in range(n)]


def test_the_peak_is_busy_the_night_after_it_is_quiet_and_a_queue_is_always_busy():
    now = 10_000.0
    night = _every(now - 3600, now - 1800, 30.0)  # 2 a minute
    peak = _every(now - 1800, now, 2.0)  # 30 a minute, up to now
    assert "above 50% of the busiest 60 s" in (busy_reason(night + peak, now, 0, S) or "")
    after = _every(now - 3600, now - 600, 2.0) + _every(now - 600, now, 30.0)  # the peak ended
    assert busy_reason(after, now, 0, S) is None
    assert busy_reason([], now, 0, S) is None
    assert busy_reason(after, now, 3, S) == "3 requests queued at the gateway"
    with pytest.raises(ValueError):
        QuietSettings(busy_fraction=0)


class _Group:
    def __init__(self) -> None:
        self.records: list[SimpleNamespace] = []
        self.admission = SimpleNamespace(queued=0)


def _service(tmp_path, group: _Group) -> TuneService:
    ctx = SimpleNamespace(
        fleet=SimpleNamespace(paths=SimpleNamespace(data_dir=tmp_path), get=lambda name: None),
        store=None,
        gateway=SimpleNamespace(group_of=lambda name: group),
        data_dir=tmp_path,
    )
    return TuneService(ctx)  # type: ignore[arg-type]


def test_the_autopilots_tune_is_postponed_at_the_peak_and_starts_once_it_is_quiet(tmp_path):
    group = _Group()
    svc = _service(tmp_path, group)
    plan = AutopilotPlan(Slo.parse(["p99_e2e_ms=2000"]), tune_interval_s=60.0, tune_quiet_window_s=30.0)
    svc.schedule["demo"] = svc.check_schedule({"engine": "demo", **plan.tune_schedule()})
    assert svc.schedule["demo"]["quiet_only"] is True
    wall = time.time()
    # The peak: a request every half second for the last ten minutes.
    group.records = [SimpleNamespace(finished_at_s=t + 0.2, e2e_s=0.2) for t in _every(wall - 600, wall, 0.5)]
    svc._last_run_s["demo"] = 0.0
    assert svc.due(61.0) == [] and svc.due(62.0) == []
    assert [(r["status"], r["engine"]) for r in svc.runs] == [("postponed", "demo")]  # said once
    assert "requests arrived in the last 30 s" in svc.runs[0]["error"]
    group.records = [SimpleNamespace(finished_at_s=t + 0.2, e2e_s=0.2) for t in _every(wall - 600, wall - 120, 0.5)]
    assert svc.due(70.0) == ["demo"]  # quiet now: the tune starts
    assert svc.due(71.0) == []  # and the next one waits an interval


def test_a_tune_never_quiet_for_a_whole_interval_is_skipped_with_the_reason(tmp_path):
    group = _Group()
    group.admission.queued = 5
    svc = _service(tmp_path, group)
    plan = AutopilotPlan(Slo.parse(["p99_e2e_ms=2000"]), tune_interval_s=60.0)
    svc.schedule["demo"] = svc.check_schedule({"engine": "demo", **plan.tune_schedule()})
    svc._last_run_s["demo"] = 0.0
    assert svc.due(60.0) == [] and svc.due(120.0) == []
    assert [r["status"] for r in svc.runs] == ["postponed", "skipped"]
    assert svc.runs[-1]["error"] == "never quiet for a whole interval: 5 requests queued at the gateway"
    group.admission.queued = 0
    assert svc.due(150.0) == []  # the next interval is counted from the skip
    assert svc.due(180.0) == ["demo"]


def test_a_plain_schedule_keeps_its_timer(tmp_path):
    group = _Group()
    group.admission.queued = 5
    svc = _service(tmp_path, group)
    svc.schedule["demo"] = svc.check_schedule({"engine": "demo", "interval_s": 60, "slo": {"p99_e2e_ms": 2000}})
    svc._last_run_s["demo"] = 0.0
    assert svc.due(60.0) == ["demo"]
    with pytest.raises(ValueError, match="quiet_only must be true or false"):
        svc.check_schedule({"engine": "demo", "slo": {"p99_e2e_ms": 1}, "quiet_only": "yes"})
