"""The programs the suite drives for real (tmux, prometheus, promtool, sshd): `make setup` installs
them. In CI a missing one fails its tests, so a run can never pass by skipping what it was meant to
check; elsewhere (a developer's machine without root) the tests skip, saying what to install."""

from __future__ import annotations

import os
import shutil

import pytest

# sshd lives in /usr/sbin, off most users' PATH.
_SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
# What `make setup` installs each from (Debian's packages).
PACKAGES = {"tmux": "tmux", "prometheus": "prometheus", "promtool": "prometheus", "sshd": "openssh-server"}


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def find_tool(cmd: str) -> str | None:
    return shutil.which(cmd, path=_SEARCH_PATH)


def require_tool(cmd: str) -> str:
    """The tool's path; else a failure in CI, a skip elsewhere, each saying how to install it."""
    path = find_tool(cmd)
    if path is not None:
        return path
    why = f"{cmd} is not installed (Debian's {PACKAGES.get(cmd, cmd)} package; `make setup` installs it)"
    if in_ci():
        pytest.fail(f"{why}: CI must run this test, not skip it", pytrace=False)
    pytest.skip(why)


def needs_tool(cmd: str) -> pytest.MarkDecorator:
    """Mark a test (or a module, through pytestmark) as driving `cmd`; see require_tool."""
    return pytest.mark.needs_tool(cmd)
