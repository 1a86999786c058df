"""The response settings the autopilot runs with, and those it leaves behind.

The `window` response sets the window by hand, which freezes the PID controller: with the
autopilot's window on the same SLO, the first SLO burn froze the window control for as long as
the autopilot stayed on. While it is on no rule halves the window; `off` puts those responses
back, and takes away only the standby it added."""

from __future__ import annotations

from llmconsole.daemon.services.autopilot_service import autopilot_responses, restored_responses
from llmconsole.engine.alerts import rules as ar
from llmconsole.engine.alerts.response_settings import validate_settings
from llmconsole.engine.autopilot.plan import AutopilotPlan
from llmconsole.engine.metrics.latency import Slo

PLAN = AutopilotPlan(Slo.parse(["p99_e2e_ms=2000"]), standby_for_s=60.0)


def test_while_on_no_rule_halves_the_window_the_pid_holds_and_the_standby_answers_a_burn():
    before = validate_settings({"responses": {ar.SLO_BURNING: ["window"], ar.KV_CACHE_HIGH: ["window", "mode"]}})
    on = autopilot_responses(before, PLAN)
    assert on["responses"] == {ar.SLO_BURNING: ["standby"], ar.KV_CACHE_HIGH: ["mode"]}
    assert on["for_s"] == {ar.SLO_BURNING: 60.0}
    assert validate_settings(on) == on
    assert before["responses"][ar.SLO_BURNING] == ["window"]  # the settings given are not changed
    assert autopilot_responses(before, AutopilotPlan(PLAN.slo, standby=False))["responses"] == {
        ar.KV_CACHE_HIGH: ["mode"]
    }


def test_off_puts_the_window_responses_back_and_removes_only_the_standby_it_added():
    before = validate_settings({"responses": {ar.SLO_BURNING: ["window"], ar.KV_CACHE_HIGH: ["window", "mode"]}})
    on = autopilot_responses(before, PLAN)
    assert restored_responses(on, before) == before
    since = {**on, "responses": {**on["responses"], ar.GPU_MEMORY_HIGH: ["mode"]}}  # an operator's change
    after = restored_responses(since, before)
    assert after["responses"] == {**before["responses"], ar.GPU_MEMORY_HIGH: ["mode"]}
    had = validate_settings({"responses": {ar.SLO_BURNING: ["standby"]}, "for_s": {ar.SLO_BURNING: 30}})
    assert restored_responses(autopilot_responses(had, PLAN), had) == had
