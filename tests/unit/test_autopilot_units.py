"""The autopilot's pure parts: the plan an SLO makes (bad input refused, nothing sent), the
latency the window holds, and the report of what each control did and why, from recorded
states and actions."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest

from llmconsole.console.cli import EXIT_USAGE, main
from llmconsole.engine.alerts import rules as ar
from llmconsole.engine.autopilot.plan import AutopilotPlan, window_settings
from llmconsole.engine.autopilot.report import control_report, window_events
from llmconsole.engine.metrics.latency import Slo


def test_the_window_holds_the_slos_ttft_else_its_end_to_end_else_its_tpot():
    assert window_settings(AutopilotPlan(Slo.parse(["p99_e2e_ms=2000,ttft_ms=500"]))) == {
        "signal": "ttft",
        "target_ms": 500.0,
    }
    assert window_settings(AutopilotPlan(Slo.parse(["p50_e2e_ms=900,p99_e2e_ms=2000"]), window_bounds=(2, 12))) == {
        "signal": "e2e",
        "target_ms": 2000.0,
        "min_window": 2,
        "max_window": 12,
    }
    assert window_settings(AutopilotPlan(Slo.parse(["p90_tpot_ms=80"])))["signal"] == "tpot"


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({}, "give the SLO as an object"),
        ({"slo": {}}, "needs an SLO"),
        ({"slo": {"p99_itl_ms": 50}}, "itl alone is not one"),
        ({"slo": {"p99_e2e_ms": 2000}, "tune_interval_s": 5}, "at least 10 s"),
        ({"slo": {"p99_e2e_ms": 2000}, "window_bounds": [8, 4]}, "not 1 <= min <= max"),
        ({"slo": {"p99_e2e_ms": 2000}, "mode": "yes"}, "mode must be true or false"),
        ({"slo": {"p99_e2e_ms": 2000}, "pilot": 1}, "unknown autopilot settings: pilot"),
        ({"slo": {"p99_e2e_ms": -1}}, "positive number"),
    ],
)
def test_bad_plans_are_refused_with_the_reason(body, says):
    with pytest.raises(ValueError, match=says):
        AutopilotPlan.from_json(body)


def test_a_plan_round_trips_through_its_json():
    plan = AutopilotPlan(Slo.parse(["p99_e2e_ms=2000"]), standby_for_s=60.0, tune_interval_s=None, window_bounds=(2, 8))
    assert AutopilotPlan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    assert plan.tune_schedule()["apply"] is True


def test_the_cli_refuses_a_bad_plan_before_asking_the_daemon(capsys):
    assert main(["autopilot", "on", "e1", "--slo", "p99_e2e_ms=2000", "--window", "8"]) == EXIT_USAGE
    assert "--window '8' is not MIN-MAX" in capsys.readouterr().err
    assert main(["autopilot", "on", "e1", "--slo", "p99_itl_ms=20"]) == EXIT_USAGE
    assert "itl alone" in capsys.readouterr().err


def test_window_events_are_its_moves_with_the_latency_that_moved_it():
    trace = [
        {"at_s": 5.0, "window": 8, "action": "step", "measured_ms": 300.0, "target_ms": 500.0},
        {"at_s": 11.0, "window": 8, "action": "hold", "measured_ms": None, "target_ms": 500.0},
        {"at_s": 12.0, "window": 6, "action": "step", "measured_ms": 900.0, "target_ms": 500.0},
        {"at_s": 13.0, "window": 6, "action": "step", "measured_ms": 520.0, "target_ms": 500.0},
        {"at_s": 14.0, "window": 7, "action": "step", "measured_ms": 350.0, "target_ms": 500.0},
        # a raise held under a seat measured slow, and a cut stopped on the seat a probe left: moves too
        {"at_s": 15.0, "window": 8, "action": "capped", "measured_ms": 360.0, "target_ms": 500.0},
        {"at_s": 16.0, "window": 9, "action": "step", "measured_ms": 340.0, "target_ms": 500.0},
        {"at_s": 17.0, "window": 8, "action": "floored", "measured_ms": 1500.0, "target_ms": 500.0},
        {"at_s": 18.0, "window": 8, "action": "hold-band", "measured_ms": 490.0, "target_ms": 500.0},
    ]
    got = window_events(trace, since_s=10.0, signal="ttft")
    assert [(e["at_s"], e["what"], e["why"]) for e in got] == [
        (12.0, "window 8 -> 6", "p99 ttft 900 ms against the 500 ms target"),
        (14.0, "window 6 -> 7", "p99 ttft 350 ms against the 500 ms target"),
        (15.0, "window 7 -> 8", "p99 ttft 360 ms against the 500 ms target"),
        (16.0, "window 8 -> 9", "p99 ttft 340 ms against the 500 ms target"),
        (17.0, "window 9 -> 8", "p99 ttft 1500 ms against the 500 ms target"),
    ]


@dataclass(frozen=True)
class _Action:
    id: int
    at: float
    engine: str | None
    kind: str
    outcome: str
    automatic: bool
    detail: dict[str, Any] = field(default_factory=dict)


def test_the_report_puts_every_controls_moves_on_one_time_axis_with_their_reasons():
    pilot = {
        "group": "demo",
        "engines": ["demo"],
        "slo": {"p99_ttft_ms": 500.0},
        "since_s": 100.0,
        "plan": AutopilotPlan(Slo.parse(["p99_ttft_ms=500"])).to_json(),
    }
    window = {
        "frozen": False,
        "signal": "ttft",
        "target_ms": 500.0,
        "min_window": 4,
        "max_window": 32,
        "window": 6,
        "trace": [
            {"at_s": 101.0, "window": 8, "action": "step", "measured_ms": 200.0, "target_ms": 500.0},
            {"at_s": 130.0, "window": 6, "action": "step", "measured_ms": 800.0, "target_ms": 500.0},
        ],
    }
    actions = [
        _Action(1, 90.0, "demo", "mode", "done", True, {"mode": "balanced", "reason": "before the autopilot"}),
        _Action(2, 120.0, "demo", "mode", "done", True, {"mode": "balanced", "reason": "host memory 65% of total"}),
        _Action(3, 140.0, "demo", "response:standby", "done", True, {"trigger": ar.SLO_BURNING}),
        _Action(4, 150.0, "other", "response:standby", "done", True, {"trigger": ar.SLO_BURNING}),
        _Action(5, 170.0, "demo", "rollback", "done", True, {"reason": "p99_ttft_ms 900 > 500 for 60 s"}),
        _Action(6, 175.0, "demo", "window", "done", False, {}),  # an operator's: not the autopilot's doing
    ]
    tune = {
        "schedule": {"demo": {"interval_s": 14400.0}},
        "watches": {"demo": {"state": "rolled back", "reason": "p99_ttft_ms 900 > 500 for 60 s"}},
        "runs": [
            {"engine": "demo", "at_s": 160.0, "status": "done", "trials": 4, "proposal": {"max_num_seqs": 12}},
            {"engine": "demo", "at_s": 180.0, "status": "postponed", "error": "the group is busy"},
        ],
    }
    report = control_report(
        pilot,
        window=window,
        modes={"demo": {"mode": "balanced", "auto": True}},
        alerts=[{"rule": ar.SLO_BURNING, "engine": "demo", "state": "firing", "for_s": 40.0}],
        responses={"responses": {ar.SLO_BURNING: ["standby"]}, "for_s": {}},
        tune=tune,
        actions=actions,
        now_s=200.0,
    )
    timeline = [(e["at_s"], e["control"], e["what"]) for e in report["timeline"]]
    assert timeline == [
        (120.0, "mode", "mode -> balanced (done)"),
        (130.0, "window", "window 8 -> 6"),
        (140.0, "standby", "standby (done)"),
        (160.0, "tune", "scheduled tune: 4 trials, proposal {'max_num_seqs': 12}"),
        (170.0, "tune", "rolled back (done)"),
        (180.0, "tune", "scheduled tune postponed"),
    ]
    whys = {e["at_s"]: e["why"] for e in report["timeline"]}
    assert whys[120.0] == "host memory 65% of total"
    assert whys[140.0] == f"alert {ar.SLO_BURNING}"
    assert whys[180.0] == "the group is busy"
    c = report["controls"]
    assert all(c[n]["on"] for n in ("window", "mode", "standby", "tune"))
    assert [c[n]["did"] for n in ("window", "mode", "standby", "tune")] == [1, 1, 1, 3]
    assert "firing" in c["standby"]["now"] and "rolled back" in c["tune"]["now"]
    assert report["for_s"] == 100.0
