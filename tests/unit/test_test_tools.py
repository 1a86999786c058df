"""A test that drives a real program fails in CI where the program is missing, and skips elsewhere."""

from __future__ import annotations

import pytest

from tests.support.tools import PACKAGES, find_tool, require_tool


def test_a_missing_tool_fails_in_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must run this test"):
        require_tool("llmconsole-no-such-tool")


def test_a_missing_tool_skips_outside_ci_saying_what_to_install(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="openssh-server"):
        PACKAGES["llmconsole-no-such-tool"] = "openssh-server"
        try:
            require_tool("llmconsole-no-such-tool")
        finally:
            del PACKAGES["llmconsole-no-such-tool"]


def test_a_present_tool_is_found_off_the_users_path_too(monkeypatch):
    monkeypatch.setenv("CI", "true")
    assert require_tool("sh") == find_tool("sh")
