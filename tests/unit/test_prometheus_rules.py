"""The shipped alert rules, checked and unit-tested by Prometheus's own promtool."""

from __future__ import annotations

import subprocess

import pytest

from tests.support.paths import ROOT
from tests.support.tools import needs_tool

RULES = ROOT / "deploy" / "prometheus" / "llmconsole-rules.yml"
TESTS = sorted((ROOT / "deploy" / "prometheus" / "tests").glob("*.yml"))

pytestmark = needs_tool("promtool")


def test_rules_file_is_valid():
    r = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "4 rules found" in r.stdout


@pytest.mark.parametrize("test_file", TESTS, ids=[t.name for t in TESTS])
def test_rule_unit_tests_pass(test_file):
    assert TESTS, "no rule tests shipped"
    r = subprocess.run(
        ["promtool", "test", "rules", test_file.name], cwd=test_file.parent, capture_output=True, text=True
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_rules_name_what_the_daemon_evaluates():
    """The daemon's own evaluator and the shipped file must speak of the same alerts."""
    import yaml

    from llmconsole.engine.alerts import rules as alert_rules

    names = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    assert names == set(alert_rules.DEFAULT_RULES)
